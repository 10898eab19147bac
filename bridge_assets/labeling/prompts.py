"""Prompt templates (Jinja2, `resources/prompts/*.j2`) and their content hashes.

A prompt file defines a `system` and a `user` block; rendering one gives the chat messages
of an `LLMRequest`. The rendered text is part of every call's cache key, so editing a
template re-runs exactly the calls whose text changed; `Prompts.hash()` (the template and
every template it includes) goes into a labeler's configuration hash.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import yaml

from bridge_assets.errors import BridgeError
from bridge_assets.paths import PROMPTS_DIR
from bridge_assets.registry.relevance import legacy_kind

EXAMPLES_FILE = PROMPTS_DIR / "examples.yaml"
ROLES = ("system", "user")
# Variables the labeling templates read that not every caller passes: a TREC topic's description
# and narrative, the label scale, and the relevance definition's kind and text (a Pair's
# prompt_context passes them; bridge_assets.registry.relevance). Absent, a prompt renders as
# for a query with answers (or a topic, or none) on the binary scale, as before definitions.
OPTIONAL_CONTEXT = {"description": None, "narrative": None, "scale": "binary", "relevance": None,
                    "definition": None}
# What the templates branch on: the kind of definition, by what the labeler reads of it.
JUDGED_BY = {"answer_support": "answers", "narrative": "topic", "useful": "definition",
             "custom": "definition"}

Messages = tuple[tuple[str, str], ...]


class PromptError(BridgeError, ValueError):
    """A template is missing, lacks its blocks, or refers to an undefined variable."""


class Prompts:
    """The prompt templates of one folder (default `resources/prompts/`)."""

    def __init__(self, directory: Path | str = PROMPTS_DIR):
        self.directory = Path(directory)

    @cached_property
    def _environment(self) -> jinja2.Environment:
        return jinja2.Environment(
            loader=jinja2.FileSystemLoader(self.directory), undefined=jinja2.StrictUndefined,
            trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)

    def _template(self, name: str) -> jinja2.Template:
        try:
            return self._environment.get_template(f"{name}.j2")
        except jinja2.TemplateNotFound as exc:
            raise PromptError(f"prompt template '{exc.name}' not found in {self.directory}") from None

    def messages(self, name: str, **context: Any) -> Messages:
        """Render the `system` and `user` blocks of `<name>.j2` into chat messages."""
        template = self._template(name)
        context = {**OPTIONAL_CONTEXT, **context}
        if context["relevance"] is None:
            context["relevance"] = legacy_kind(context.get("answers") or (), context["description"],
                                               context["narrative"])
        context["judged_by"] = JUDGED_BY[context["relevance"]]
        missing = [role for role in ROLES if role not in template.blocks]
        if missing:
            raise PromptError(f"{self.directory / (name + '.j2')} lacks block(s) {missing}")
        try:
            return tuple((role, "".join(template.blocks[role](template.new_context(context))).strip())
                         for role in ROLES)
        except jinja2.UndefinedError as exc:
            raise PromptError(f"{self.directory / (name + '.j2')}: {exc}") from None

    def hash(self, name: str) -> str:
        """sha256 over the sources of `<name>.j2` and every template it includes."""
        digest = hashlib.sha256()
        seen: set[str] = set()
        pending = [f"{name}.j2"]
        loader = self._environment.loader
        assert loader is not None  # _environment's FileSystemLoader
        while pending:
            filename = pending.pop()
            if filename in seen:
                continue
            seen.add(filename)
            try:
                source, _, _ = loader.get_source(self._environment, filename)
            except jinja2.TemplateNotFound:
                raise PromptError(f"prompt template '{filename}' not found in {self.directory}") from None
            digest.update(filename.encode() + b"\0" + source.encode() + b"\0")
            referenced = jinja2.meta.find_referenced_templates(self._environment.parse(source))
            pending.extend(sorted(r for r in referenced if r is not None))
        return digest.hexdigest()[:16]


def worked_examples(path: Path = EXAMPLES_FILE) -> list[dict[str, Any]]:
    """The worked examples the labeling prompts show with `fewshot` on (examples.j2): query,
    answers, chunk and the correct reply of each, the reply as the JSON text a model should
    write (keys in the schema's order)."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise PromptError(f"{path}: cannot read the worked examples ({exc})") from None
    fields = ("query", "answers", "chunk", "reply")
    examples = []
    for index, example in enumerate(raw.get("examples") or [], start=1):
        missing = [f for f in fields if f not in (example or {})]
        if missing:
            raise PromptError(f"{path}: example {index} lacks {missing}")
        reply = {key: example["reply"][key] for key in ("reference", "reason", "response")}
        examples.append({**{f: example[f] for f in fields}, "reply": json.dumps(reply, ensure_ascii=False)})
    return examples
