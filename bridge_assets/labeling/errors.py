"""The errors of labeling a user can fix (a module of its own: debate.py raises them, and
labeler.py, which imports debate.py, re-exports LabelerError)."""

from __future__ import annotations

from bridge_assets.errors import BridgeError


class LabelerError(BridgeError, ValueError):
    """An unknown labeler, or settings it refuses."""


class PairsError(BridgeError, LookupError):
    """Pairs to label that name a query or document the dataset's tables do not have."""
