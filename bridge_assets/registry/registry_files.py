"""The YAML registries (datasets.yaml, retrievers.yaml, models.yaml): one reader, the user's
overlay, and adding an entry to a file without losing its comments.

The shipped registries live in resources/ (or wherever BRIDGE_DATASETS, BRIDGE_RETRIEVERS,
BRIDGE_MODELS point). `BRIDGE_REGISTRY_DIR` names a folder of the user's own, holding any of
the three files, merged over the shipped one: every top-level mapping (`datasets:`,
`systems:`, `models:`, `prompts:`, `profiles:`, `defaults:`, ...) is merged by name, a user
entry replacing the shipped entry of the same name whole; any other top-level value the user
file sets (`profile:`) replaces the shipped one. So a user who installed the package never
edits a file inside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from bridge_assets.errors import BridgeError
from bridge_assets.paths import PROJECT_ROOT
from bridge_assets.settings import env

ENV_REGISTRY_DIR = "BRIDGE_REGISTRY_DIR"
# The dataset registry's place lives here, below every stage, because the `dataset` partitions
# (partitions.py) list its names; its entries are read and checked by ingest.registry.
# `BRIDGE_DATASETS` points at another file (tests, or a user's own set of datasets).
DATASETS_FILE = "datasets.yaml"
DATASETS_PATH = env.registry_file("BRIDGE_DATASETS", DATASETS_FILE)

T = TypeVar("T")


class RegistryFileError(BridgeError, ValueError):
    """A registry file that cannot be read or written, e.g. `x.yaml, line 7: not valid YAML`."""


@dataclass(frozen=True)
class Origin:
    """Where an entry was read: its file and line, and the folder its relative paths start from."""

    file: Path
    line: int | None
    base: Path

    def __str__(self) -> str:
        return f"{self.file}, line {self.line}" if self.line is not None else str(self.file)


@dataclass(frozen=True)
class Registry:
    """A registry as read: the merged mapping, the files it came from, where each entry was."""

    data: dict[str, Any]
    files: tuple[Path, ...]                      # the shipped (or BRIDGE_*) file, then the user's
    origins: dict[tuple[str, str], Origin]       # (section, entry name) -> where it was read

    def origin(self, section: str, name: str) -> Origin:
        return self.origins.get((section, name), Origin(self.files[0], None, PROJECT_ROOT))


def registry_dir() -> Path | None:
    """The user's registry folder ($BRIDGE_REGISTRY_DIR), None when unset."""
    return env.registry_dir


def target_file(shipped: Path, name: str) -> Path:
    """The file new entries go to: `<registry dir>/<name>` when BRIDGE_REGISTRY_DIR is set,
    else the shipped one."""
    folder = registry_dir()
    return folder / name if folder else shipped


def _compose(text: str, path: Path) -> tuple[Any, yaml.Node | None]:
    """The document and its node tree (for line numbers), from one parse."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        return (loader.construct_document(node) if node is not None else None), node
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise RegistryFileError(f"not valid YAML: {exc.problem or exc.context}", path,
                                mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise RegistryFileError(f"not valid YAML: {exc}", path) from None
    finally:
        loader.dispose()


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RegistryFileError("registry file not found", path) from None
    except UnicodeDecodeError as exc:
        raise RegistryFileError(f"not UTF-8 text (byte {exc.start})", path) from None


def read_file(path: Path, base: Path) -> Registry:
    """One registry file: a mapping of sections, each entry's line recorded."""
    path = Path(path)
    data, node = _compose(_read_text(path), path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RegistryFileError("expected a mapping of sections (e.g. `datasets:`)", path, 1)
    origins = {}
    for key, value in (node.value if isinstance(node, yaml.MappingNode) else []):
        if isinstance(value, yaml.MappingNode):
            for entry, _ in value.value:
                origins[(key.value, entry.value)] = Origin(path, entry.start_mark.line + 1, base)
    return Registry(data, (path,), origins)


def merge(shipped: Registry, user: Registry) -> Registry:
    """`user` over `shipped`: mappings merged by name (a replaced entry keeps its place), other
    values replaced, empty ones ignored."""
    data = dict(shipped.data)
    for key, value in user.data.items():
        if value is None:  # an empty section (`datasets:` alone) adds nothing, removes nothing
            continue
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return Registry(data, shipped.files + user.files, {**shipped.origins, **user.origins})


def user_file(name: str) -> Path | None:
    """`<registry dir>/<name>` when BRIDGE_REGISTRY_DIR is set and the file exists."""
    folder = registry_dir()
    return folder / name if folder and (folder / name).exists() else None


def load(shipped: Path, name: str) -> Registry:
    """The registry `name` (datasets.yaml, ...): `shipped`, with the user's file of that name
    merged over it. Relative paths of the user's entries start from the user's folder."""
    registry = read_file(shipped, PROJECT_ROOT)
    user = user_file(name)
    return merge(registry, read_file(user, user.parent)) if user else registry


def describe(shipped: Path, name: str) -> str:
    """The files `load` reads, for messages: `shipped` [+ the user's file]."""
    user = user_file(name)
    return f"{shipped} + {user}" if user else str(shipped)


# ---- adding an entry to a file, keeping its comments and layout ---------------------------

def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_filler(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith("#")


def _entry_end(lines: list[str], start: int, column: int) -> int:
    """The line after an entry that starts on line `start` (0-based) with its key at `column`:
    every following line indented deeper belongs to it; comments and blank lines at its end
    stay where they are (they usually introduce what follows)."""
    end = start + 1
    for number in range(start + 1, len(lines)):
        if _is_filler(lines[number]):
            continue
        if _indent(lines[number]) <= column:
            break
        end = number + 1
    return end


class _EntryDumper(yaml.SafeDumper):
    """Writes an entry's own fields one per line, and short lists and mappings inside it in
    flow style (`profiles: [offline]`), like the hand-written entries."""


class _Block(dict):
    pass


_EntryDumper.add_representer(_Block, lambda dumper, data: dumper.represent_mapping(
    "tag:yaml.org,2002:map", data.items(), flow_style=False))


def _entry_block(name: str, body: dict[str, Any], column: int) -> list[str]:
    block = yaml.dump({name: _Block(body)}, Dumper=_EntryDumper, sort_keys=False, default_flow_style=None,
                      width=100, allow_unicode=True)
    return [f"{' ' * column}{line}\n" for line in block.splitlines()]


def with_entry(text: str, path: Path, section: str, name: str, body: dict[str, Any],
               replace: bool = False) -> str:
    """`text` with `name: body` added at the end of `section:` (the section appended when
    absent), or replacing the entry of that name when `replace`."""
    _, root = _compose(text, path)
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    found = next(((k, v) for k, v in (root.value if isinstance(root, yaml.MappingNode) else [])
                  if k.value == section), None)
    if found is None:
        return "".join(lines) + f"{section}:\n" + "".join(_entry_block(name, body, 2))
    key, value = found
    if isinstance(value, yaml.ScalarNode) and value.value in ("", "~", "null"):  # an empty section
        at = key.start_mark.line
        return "".join(lines[:at] + [f"{section}:\n"] + _entry_block(name, body, 2) + lines[at + 1:])
    if not isinstance(value, yaml.MappingNode) or value.flow_style:
        raise RegistryFileError(f"`{section}:` must be a block mapping (one entry per line) to add "
                                f"'{name}' to it", path, key.start_mark.line + 1)
    entries = {k.value: k for k, _ in value.value}
    if name in entries:
        if not replace:
            raise RegistryFileError(f"'{name}' already exists under `{section}:`",
                                    path, entries[name].start_mark.line + 1)
        entry = entries[name]
        start, column = entry.start_mark.line, entry.start_mark.column
        end = _entry_end(lines, start, column)
        return "".join(lines[:start] + _entry_block(name, body, column) + lines[end:])
    last = value.value[-1][0]
    end = _entry_end(lines, last.start_mark.line, last.start_mark.column)
    return "".join(lines[:end] + _entry_block(name, body, last.start_mark.column) + lines[end:])


def add_entry(path: Path, section: str, name: str, body: dict[str, Any], validate: Callable[[], T],
              replace: bool = False) -> T:
    """Write `name: body` into `section:` of the file at `path` (created when absent), then
    `validate()`; the file is restored (or removed) when that raises."""
    path = Path(path)
    previous = _read_text(path) if path.exists() else None
    header = (f"# Your own entries, merged over the shipped {path.name} ({ENV_REGISTRY_DIR}).\n"
              if previous is None else "")
    text = with_entry(previous or header, path, section, name, body, replace)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    try:
        return validate()
    except BaseException:
        if previous is None:
            path.unlink()
        else:
            path.write_text(previous, encoding="utf-8")
        raise


def dataset_names() -> list[str]:
    """The names of the registered datasets (the user's datasets.yaml merged over the shipped
    one), in file order; ingest.registry checks each entry when a dataset is loaded."""
    return [str(name) for name in load(DATASETS_PATH, DATASETS_FILE).data.get("datasets") or {}]
