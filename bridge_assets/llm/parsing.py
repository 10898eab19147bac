"""Strict parsing of structured replies: one JSON object that validates against the schema.

Nothing is repaired or defaulted: a reply that is not exactly that is an error, which the
client retries and finally records as a failed call.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from bridge_assets.errors import BridgeError


class InvalidSchema(BridgeError, ValueError):
    """The request's json_schema is itself not a valid JSON schema."""


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    schema = json.loads(schema_json)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidSchema(f"not a valid JSON schema: {exc.message}") from None
    return Draft202012Validator(schema)


def canonical_json(value: Any) -> str:
    """Deterministic JSON text (sorted keys, no spaces): the form hashed into cache keys."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_reply(text: str, schema: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(parsed object, None) when `text` is one JSON object valid for `schema`, else (None, why)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"reply is not valid JSON ({exc.msg} at char {exc.pos}): {text[:200]!r}"
    if not isinstance(value, dict):
        return None, f"reply is JSON but not an object: {text[:200]!r}"
    errors = sorted(_validator(canonical_json(schema)).iter_errors(value), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "(root)"
        return None, f"reply violates the schema at {where}: {first.message}"
    return value, None


def check_schema(schema: dict[str, Any]) -> None:
    """Fail early, before any model call, when a request carries an invalid schema."""
    _validator(canonical_json(schema))
