"""Remote dataset sources for machines with network: a BEIR zip URL, a Hugging Face dataset,
an ir_datasets id. Each is fetched with its usual library into `<downloads>/<name>` (the
lake's downloads/ folder, handed down by the ingest asset from its store resource),
written in the BEIR layout and read by the local loader, so validation is the same. Without
network they fail within seconds with SourceUnreachable, never hang.

This module only fetches (FETCHERS: kind -> the local BEIR folder); loaders.py owns the table of
every kind's loader and reads the folder, so the imports go one way: loaders -> remote.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from urllib.parse import urlparse

from bridge_assets.ingest.errors import DatasetError, SourceUnreachable
from bridge_assets.registry.datasets import DatasetSpec
from bridge_assets.settings import env

CONNECT_TIMEOUT_S = 5.0
HF_ENDPOINT = os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def ensure_reachable(url: str, source: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast (DNS + TCP connect within `timeout`) when `url`'s host cannot be reached."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout).close()
    except OSError as exc:
        raise SourceUnreachable(f"source unreachable: {url} ({exc}); this machine has no route "
                                f"to it, so provide the data as local files instead", source) from None


@contextlib.contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    """Libraries that open sockets without a timeout of their own must not hang forever."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def _download_dir(spec: DatasetSpec, downloads: Path) -> Path:
    folder = downloads / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def _write_qrels(path: Path, rows: Iterable[tuple[str, str, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{r}" for q, d, r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def fetch_beir_url(spec: DatasetSpec, downloads: Path) -> Path:
    import httpx

    url = spec.url or ""
    if not url:
        raise DatasetError(f"dataset '{spec.name}' of kind beir_url needs `url`", field="url")
    ensure_reachable(url, spec.name)
    folder = _download_dir(spec, downloads)
    archive = folder / "source.zip"
    if not archive.exists():
        tmp = archive.with_suffix(".part")
        with httpx.stream("GET", url, timeout=httpx.Timeout(30, connect=CONNECT_TIMEOUT_S),
                          follow_redirects=True) as response:
            response.raise_for_status()
            with tmp.open("wb") as handle:
                for chunk in response.iter_bytes():
                    handle.write(chunk)
        tmp.replace(archive)
    with zipfile.ZipFile(archive) as bundle:
        bundle.extractall(folder / "extracted")
    corpus_files = sorted((folder / "extracted").rglob("corpus.jsonl"))
    if not corpus_files:
        raise DatasetError("the archive holds no corpus.jsonl (not a BEIR dataset?)", archive)
    return corpus_files[0].parent


def fetch_huggingface(spec: DatasetSpec, downloads: Path) -> Path:
    """A Hugging Face dataset in the BEIR layout (`corpus`/`queries` configs plus a qrels split)
    or the BRIDGE release layout (queries with a `doc_id` list and `answers`)."""
    if not env.hf_offline():  # offline mode: only the local cache serves it
        ensure_reachable(HF_ENDPOINT, spec.name)
    try:
        import datasets as hf_datasets
    except ImportError:
        raise DatasetError("the `datasets` package is not installed", field="kind") from None
    options = spec.options
    folder = _download_dir(spec, downloads)

    def split_of(config: str | None, split: str) -> Iterable[dict]:
        with _socket_timeout(30):
            try:
                return hf_datasets.load_dataset(spec.id, name=config, split=split)
            except Exception as exc:  # offline hub / missing repo: say which source failed
                raise SourceUnreachable(f"source unreachable: Hugging Face dataset {spec.id} "
                                        f"({type(exc).__name__}: {exc})", spec.name) from None

    corpus = split_of(options.get("corpus_config", "corpus"), options.get("corpus_split", "corpus"))
    _write_jsonl(folder / "corpus.jsonl", ({"_id": str(r.get("_id", r.get("doc_id"))),
                                            "title": r.get("title") or "", "text": r["text"]}
                                           for r in corpus))
    queries = split_of(options.get("queries_config", "queries"), options.get("queries_split", "queries"))
    rows = list(queries)
    qrels: list[tuple[str, str, int]] = []
    if rows and "doc_id" in rows[0]:  # BRIDGE release layout
        for r in rows:
            qrels += [(str(r["q_id"]), str(d), 1) for d in r["doc_id"]]
        _write_jsonl(folder / "queries.jsonl", ({"_id": str(r["q_id"]), "text": r["query"],
                                                 "answers": r.get("answers") or []} for r in rows))
    else:
        _write_jsonl(folder / "queries.jsonl", ({"_id": str(r["_id"]), "text": r["text"],
                                                 "answers": r.get("answers") or []} for r in rows))
        qrels_rows = split_of(options.get("qrels_config", "default"), spec.split)
        qrels = [(str(r["query-id"]), str(r["corpus-id"]), int(r["score"])) for r in qrels_rows]
    _write_qrels(folder / "qrels" / f"{spec.split}.tsv", qrels)
    return folder


def fetch_ir_datasets(spec: DatasetSpec, downloads: Path) -> Path:
    try:
        import ir_datasets
    except ImportError:
        raise DatasetError("the `ir_datasets` package is not installed", field="kind") from None
    folder = _download_dir(spec, downloads)
    with _socket_timeout(30):
        try:
            dataset = ir_datasets.load(spec.id)
            _write_jsonl(folder / "corpus.jsonl", ({"_id": d.doc_id, "title": getattr(d, "title", ""),
                                                    "text": d.default_text()} for d in dataset.docs_iter()))
            _write_jsonl(folder / "queries.jsonl", ({"_id": q.query_id, "text": q.default_text()}
                                                    for q in dataset.queries_iter()))
            _write_qrels(folder / "qrels" / f"{spec.split}.tsv",
                         ((q.query_id, q.doc_id, q.relevance) for q in dataset.qrels_iter()))
        except KeyError:
            raise DatasetError(f"unknown ir_datasets id '{spec.id}'", field="id") from None
        except OSError as exc:  # DNS failure, refused or timed-out connection while downloading
            raise SourceUnreachable(f"source unreachable: ir_datasets '{spec.id}' could not "
                                    f"download its files ({exc})", spec.name) from None
    return folder


# kind -> fetch into a local BEIR folder (read with spec.split by the BEIR loader)
FETCHERS: dict[str, Callable[[DatasetSpec, Path], Path]] = {
    "beir_url": fetch_beir_url, "huggingface": fetch_huggingface, "ir_datasets": fetch_ir_datasets}
