"""Indexes and document embeddings, built once per (dataset, encoder) and reused.

An artifact lives in `<data lake>/indexes/<dataset>/<family>/<key>/` (or under
$BRIDGE_INDEX_DIR), where `key` hashes the corpus content and the encoder's configuration: a
changed corpus or encoder gets a new folder, an unchanged one is found again, by any lake.
Builds run in a temporary folder renamed into place when complete, under a file lock, so
parallel runs (Dagster's multiprocess executor) never read a half-built index nor build the
same one twice. A resumable build (document encoding, which
takes an hour on a large corpus on CPU) keeps its temporary folder when interrupted and
continues from there next time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
from filelock import FileLock

from bridge_assets.settings import env

log = logging.getLogger(__name__)

META_FILE = "meta.json"


def corpus_fingerprint(corpus: pl.DataFrame) -> str:
    """sha256 of the corpus content (doc_id, title, text), independent of row order."""
    digest = hashlib.sha256()
    ordered = corpus.select("doc_id", "title", "text").sort("doc_id")
    for batch in ordered.iter_slices(10_000):
        for doc_id, title, text in batch.iter_rows():
            for value in (doc_id, title or "", text or ""):
                encoded = value.encode()
                digest.update(len(encoded).to_bytes(8, "little"))
                digest.update(encoded)
    return digest.hexdigest()


def artifact_key(corpus_hash: str, config: dict[str, Any]) -> str:
    canonical = json.dumps({"corpus": corpus_hash, "config": config}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def artifact_dir(dataset: str, family: str, key: str, lake: Path) -> Path:
    """Where an index of the lake folder `lake` is cached (BRIDGE_INDEX_DIR, else its indexes/)."""
    return env.index_dir(lake) / dataset / family / key


def is_built(folder: Path) -> bool:
    return (folder / META_FILE).exists()


def ensure_built(folder: Path, build: Callable[[Path], dict[str, Any]],
                 resumable: bool = False) -> tuple[Path, bool]:
    """The built artifact in `folder`, building it with `build(tmp_folder)` when absent.

    `build` writes its files into the folder it is given and returns metadata, saved as
    meta.json. With `resumable`, the folder may hold an interrupted build's files, which
    `build` continues from (and they are kept when this build is interrupted too).
    Returns (folder, built_now).
    """
    if is_built(folder):
        return folder, False
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if is_built(folder):  # another process built it while we waited
            return folder, False
        staging = folder.with_name(folder.name + ".building")
        if not resumable:
            shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(exist_ok=True)
        started = time.perf_counter()
        try:
            meta = build(staging)
        except BaseException:
            if not resumable:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        meta = {**meta, "build_seconds": round(time.perf_counter() - started, 3)}
        (staging / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
        shutil.rmtree(folder, ignore_errors=True)  # a folder without meta.json: an interrupted build
        staging.rename(folder)
        log.info("built %s in %.1fs", folder, meta["build_seconds"])
    return folder, True


def read_meta(folder: Path) -> dict[str, Any]:
    return json.loads((folder / META_FILE).read_text())
