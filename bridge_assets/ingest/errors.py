"""Errors that name what is wrong with a user's input: the file, the line and the field.
(DatasetError lives in bridge_assets.errors, shared with the TREC file readers.)"""

from __future__ import annotations

from bridge_assets.errors import DatasetError

__all__ = ["DatasetError", "SourceUnreachable"]


class SourceUnreachable(DatasetError):
    """A remote source (URL, hub, ir_datasets) cannot be reached from this machine."""
