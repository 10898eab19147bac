"""Gold sets (labelled triplets) and the labeler-evaluation registry, `resources/goldsets.yaml`.

A gold set is JSONL, one triplet a line:
    {"id": "...", "query": "...", "answers": ["..."], "chunk": "...", "label": 0|1,
     "domain": "..." (optional), "definition": "..." (optional: a per-query relevance
     definition, used by the DIRAS-style scorer), "kind": "..." and "note": "..." (optional,
     not read: how the triplet was made, and what a reader found)}
The registry names the gold sets and the labeling methods to evaluate on each of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, SerializeAsAny

from bridge_assets.errors import BridgeError
from bridge_assets.labeling.labeler import DEFAULT_LABELER, LabelerSettings, LabelItem, labeler_settings
from bridge_assets.labeling.pairs import Pair
from bridge_assets.paths import PROJECT_ROOT
from bridge_assets.registry import registry_files
from bridge_assets.registry.relevance import validate_definition
from bridge_assets.settings import env

Entry = TypeVar("Entry")  # a registry section's entries

# `BRIDGE_GOLDSETS` points at another registry file (tests, or a user's own gold sets).
REGISTRY_PATH = env.registry_file("BRIDGE_GOLDSETS", "goldsets.yaml")


class GoldSetError(BridgeError, ValueError):
    """Bad gold-set input or registry entry; the message names the file, line and field."""


@dataclass(frozen=True)
class GoldTriplet:
    id: str
    query: str
    answers: tuple[str, ...]
    chunk: str
    label: int
    domain: str | None = None
    definition: str | None = None   # the triplet's own relevance definition (DIRAS per query)

    def pair(self, definition: str | None = None) -> Pair:
        """The triplet as the labelers see it, judged by its own definition, else `definition`
        (the gold set's, or `--set definition=`), else the default for what it has; its id
        names both query and chunk."""
        return Pair(self.id, self.id, self.query, self.answers, self.chunk,
                    definition=definition, query_definition=self.definition)

    def item(self, definition: str | None = None) -> LabelItem:
        return LabelItem(self.id, self.pair(definition), self.label, self.domain)


def _string(record: dict, field: str, path: Path, line: int) -> str:
    value = record.get(field)
    if not isinstance(value, str) or not value.strip():
        raise GoldSetError("expected a non-empty string", path, line, field)
    return value


def _optional_string(record: dict, field: str, path: Path, line: int) -> str | None:
    return None if record.get(field) is None else _string(record, field, path, line)


def read_goldset(path: Path) -> list[GoldTriplet]:
    """Every triplet of a gold-set JSONL file, validated (ids unique, labels 0/1)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GoldSetError("gold set file not found", path) from None
    triplets: list[GoldTriplet] = []
    seen: dict[str, int] = {}  # id -> its line
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise GoldSetError(f"not valid JSON ({exc.msg})", path, line) from None
        if not isinstance(record, dict):
            raise GoldSetError("expected a JSON object", path, line)
        unknown = set(record) - {"id", "query", "answers", "chunk", "label", "domain", "definition",
                                 "kind", "note"}
        if unknown:
            raise GoldSetError(f"unknown field(s) {sorted(unknown)}", path, line)
        triplet_id = _string(record, "id", path, line)
        if triplet_id in seen:
            raise GoldSetError(f"duplicate id {triplet_id!r} (first on line {seen[triplet_id]})",
                               path, line, "id")
        seen[triplet_id] = line
        answers = record.get("answers", [])
        if not isinstance(answers, list) or not all(isinstance(a, str) and a.strip() for a in answers):
            raise GoldSetError("expected a list of non-empty strings", path, line, "answers")
        label = record.get("label")
        if label not in (0, 1) or isinstance(label, bool):
            raise GoldSetError(f"expected 0 or 1, got {label!r}", path, line, "label")
        triplets.append(GoldTriplet(
            triplet_id, _string(record, "query", path, line), tuple(answers),
            _string(record, "chunk", path, line), label,
            _optional_string(record, "domain", path, line),
            _optional_string(record, "definition", path, line)))
    if not triplets:
        raise GoldSetError("the gold set holds no triplet", path)
    return triplets


def stratified_head(triplets: Sequence[GoldTriplet], limit: int | None) -> list[GoldTriplet]:
    """The first `limit` triplets taking relevant and irrelevant ones in turn (file order
    within each class), so that a small limit still has both classes; None = all."""
    if limit is None or limit >= len(triplets):
        return list(triplets)
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    queues = [[t for t in triplets if t.label == 1], [t for t in triplets if t.label == 0]]
    chosen: set[str] = set()
    turn = 0
    while len(chosen) < limit:
        queue = queues[turn % 2] or queues[(turn + 1) % 2]
        chosen.add(queue.pop(0).id)
        turn += 1
    return [t for t in triplets if t.id in chosen]


class GoldSetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    path: str  # relative to the project root
    description: str = ""

    @property
    def file(self) -> Path:
        path = Path(self.path)
        return path if path.is_absolute() else (PROJECT_ROOT / path).resolve()


class MethodSpec(BaseModel):
    """One labeler to evaluate, by name: its settings (the labeler's own `Settings`, the ones
    the pipeline uses) and, for judge/dream, the filter profiles run first as the pipeline's
    filtered_pool does: a pair every one of them says no to is labelled 0 by the filter, only
    the rest are labelled (and a budget share is then a share of those)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    settings: SerializeAsAny[LabelerSettings]
    prefilter: tuple[str, ...] = ()
    # The relevance definition the triplets are judged by where they state none of their own
    # (a preset or a text; None: the default for what each has: bridge_assets.registry.relevance).
    definition: str | None = None

    @property
    def method(self) -> str:
        return self.settings.labeler

    def entry(self) -> dict[str, Any]:
        """The spec as a registry entry, flat (what `parse` reads back)."""
        settings = self.settings.model_dump(mode="json")
        entry = {"name": self.name, "method": settings.pop("labeler"), **settings,
                 "prefilter": list(self.prefilter)}
        return entry if self.definition is None else {**entry, "definition": self.definition}

    @classmethod
    def parse(cls, name: str, body: dict[str, Any]) -> MethodSpec:
        """A registry entry: `method` (or `labeler`) names the labeler, `prefilter` the filter
        profiles, `definition` the relevance definition, every other key is one of the
        labeler's settings."""
        body = dict(body)
        labeler = body.pop("labeler", DEFAULT_LABELER)
        method = body.pop("method", labeler)
        prefilter = tuple(body.pop("prefilter", ()) or ())
        definition = body.pop("definition", None)
        if definition is not None:
            try:
                definition = validate_definition(definition)
            except ValueError as exc:
                raise GoldSetError(f"method '{name}': {exc}", field="definition") from None
        return cls(name=name, settings=labeler_settings({**body, "labeler": method}), prefilter=prefilter,
                   definition=definition)


class EvaluationRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    goldsets: dict[str, GoldSetSpec]
    methods: dict[str, MethodSpec]

    def goldset(self, name: str) -> GoldSetSpec:
        try:
            return self.goldsets[name]
        except KeyError:
            raise GoldSetError(f"unknown gold set '{name}' (known: {', '.join(self.goldsets)})",
                               REGISTRY_PATH) from None

    def select_methods(self, names: Sequence[str]) -> list[MethodSpec]:
        """The named methods in the given order; every method when `names` is empty."""
        unknown = [n for n in names if n not in self.methods]
        if unknown:
            raise GoldSetError(f"unknown method(s) {unknown} (known: {', '.join(self.methods)})",
                               REGISTRY_PATH, field="methods")
        return [self.methods[n] for n in names] if names else list(self.methods.values())


def load_registry(path: Path = REGISTRY_PATH) -> EvaluationRegistry:
    """Parse goldsets.yaml (with the one YAML registry reader, bridge_assets.registry.registry_files); a
    malformed file or entry fails naming the file and the line or entry."""
    try:
        raw = registry_files.read_file(path, PROJECT_ROOT).data
    except registry_files.RegistryFileError as exc:
        problem = "gold-set registry not found" if exc.problem == "registry file not found" else exc.problem
        raise GoldSetError(problem, exc.file, exc.line) from None

    def parsed(section: str, parse: Callable[[str, dict[str, Any]], Entry]) -> dict[str, Entry]:
        entries = {}
        for name, body in (raw.get(section) or {}).items():
            try:
                entries[name] = parse(name, body or {})
            except Exception as exc:  # pydantic's (or the labeler's) message names the field
                raise GoldSetError(f"invalid {section} entry '{name}': {exc}", path, field=name) from None
        return entries

    return EvaluationRegistry(goldsets=parsed("goldsets", lambda name, body: GoldSetSpec(name=name, **body)),
                              methods=parsed("methods", MethodSpec.parse))


@lru_cache(maxsize=1)
def goldset_names() -> list[str]:
    """The registered gold sets: the partitions of the labeler_eval assets."""
    return list(load_registry().goldsets)
