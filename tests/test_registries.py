"""Registries outside the repo: BRIDGE_REGISTRY_DIR merged over the shipped datasets.yaml,
retrievers.yaml and models.yaml; `bridge datasets add` and `bridge retrievers add` writing there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bridge_assets.cli.main import app
from bridge_assets.ingest.errors import DatasetError
from bridge_assets.llm.profiles import ModelConfigError, load_models_config
from bridge_assets.paths import PROJECT_ROOT, RESOURCES_DIR
from bridge_assets.registry import datasets as dataset_registry
from bridge_assets.registry import registry_files
from bridge_assets.registry.datasets import get_dataset, load_registry
from bridge_assets.retrieval.errors import RegistryError
from bridge_assets.retrieval.registry import load_registry as load_retrievers

SHIPPED_RETRIEVERS = (RESOURCES_DIR / "retrievers.yaml").read_text()


@pytest.fixture
def user_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "my_registries"
    folder.mkdir()
    monkeypatch.setenv("BRIDGE_REGISTRY_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def shipped_untouched():
    """Nothing here may write to the shipped files."""
    before = {name: (RESOURCES_DIR / name).read_bytes() for name in ("datasets.yaml", "retrievers.yaml", "models.yaml")}
    yield
    assert {name: (RESOURCES_DIR / name).read_bytes() for name in before} == before


def test_an_empty_user_file_or_section_changes_nothing(user_dir):
    (user_dir / "datasets.yaml").write_text("# nothing yet\ndatasets:\n")
    (user_dir / "retrievers.yaml").write_text("")
    assert list(load_registry()) == ["demo", "nq_open_mini", "scifact"]
    assert load_retrievers().systems == load_retrievers(RESOURCES_DIR / "retrievers.yaml").systems


def test_without_a_registry_folder_the_shipped_files_are_read_alone(monkeypatch):
    monkeypatch.delenv("BRIDGE_REGISTRY_DIR", raising=False)
    assert registry_files.registry_dir() is None
    assert load_retrievers().files == (RESOURCES_DIR / "retrievers.yaml",)
    assert list(load_registry()) == ["demo", "nq_open_mini", "scifact"]


def test_user_retrievers_merge_by_name_and_override_profile_and_defaults(user_dir, monkeypatch):
    (user_dir / "retrievers.yaml").write_text(
        "profile: offline_fast\n"
        "defaults: {k: 20}\n"
        "systems:\n"
        "  bm25:\n    kind: bm25\n    profiles: [offline_fast]\n    parameters: {k1: 1.2, b: 0.75}\n"
        "  my_minilm:\n    kind: dense\n    model: my-encoder\n    profiles: [offline_fast]\n"
        "models:\n"
        "  my-encoder:\n    backend: sentence_transformers\n    sources: [{path: /models/mine}]\n")
    registry = load_retrievers()
    assert registry.files == (RESOURCES_DIR / "retrievers.yaml", user_dir / "retrievers.yaml")
    assert registry.active_profile == "offline_fast"
    assert (registry.defaults.k, registry.defaults.rerank_depth) == (20, 100)  # by key: the rest is shipped
    assert (registry.system("bm25").params().k1, registry.system("bm25").params().b) == (1.2, 0.75)
    assert registry.system("bm25").paper_name is None  # a user entry replaces the shipped one whole
    profile = registry.profile_systems()
    assert profile[0] == "bm25" and profile[-1] == "my_minilm"  # replaced in place, new ones last
    assert "e5_small" in profile and registry.model("all-minilm-l6-v2")  # shipped ones stay
    assert str(registry.origin("systems", "my_minilm")) == f"{user_dir / 'retrievers.yaml'}, line 8"
    with monkeypatch.context() as env:
        env.delenv("BRIDGE_REGISTRY_DIR")
        shipped = load_retrievers()
    assert registry.config_hash("minilm") == shipped.config_hash("minilm")
    assert registry.config_hash("bm25") != shipped.config_hash("bm25")


def test_user_models_merge_profiles_by_name_and_defaults_by_role(user_dir):
    shipped = load_models_config()
    (user_dir / "models.yaml").write_text(
        "profiles:\n"
        "  my-server:\n    backend: openai\n    model: m\n    base_urls: [http://gpu:8000/v1]\n"
        "defaults:\n  debate: my-server\n")
    config = load_models_config()
    assert config.role_profiles("debate") == ["my-server"]
    assert config.role_profiles("filter") == shipped.role_profiles("filter")
    assert set(shipped.profiles) < set(config.profiles)
    (user_dir / "models.yaml").write_text("defaults:\n  judge: nowhere\n")
    with pytest.raises(ModelConfigError, match=f"{user_dir / 'models.yaml'}, line 2: role 'judge' names "
                                               "unknown LLM profile 'nowhere'"):
        load_models_config()


def test_user_datasets_merge_by_name_and_their_paths_start_from_the_registry_folder(user_dir):
    (user_dir / "data").mkdir()
    (user_dir / "datasets.yaml").write_text(
        "datasets:\n"
        "  mine:\n    kind: beir\n    path: data\n"
        "  demo:\n    kind: beir\n    path: /elsewhere/demo\n    split: dev\n")
    specs = load_registry()
    assert list(specs) == ["demo", "nq_open_mini", "scifact", "mine"]
    assert specs["mine"].resolve(specs["mine"].path, "path") == user_dir / "data"
    assert (specs["demo"].split, specs["demo"].pipeline) == ("dev", {})  # replaced whole
    assert specs["scifact"].resolve("x", "path") == PROJECT_ROOT / "x"   # shipped: project root
    with pytest.raises(DatasetError, match=f"{user_dir / 'datasets.yaml'}: unknown dataset 'nope'"):
        get_dataset("nope")


@pytest.mark.parametrize("content, line, message", [
    ("datasets:\n  mine:\n    kind: beir\n   path: x\n", 4, "not valid YAML"),
    ("datasets:\n  ok:\n    kind: beir\n    path: x\n  bad:\n    kind: bier\n", 5, "invalid entry 'bad'"),
    ("- a list\n", 1, "expected a mapping of sections"),
])
def test_errors_in_the_user_file_name_it_and_the_line(user_dir, content, line, message):
    (user_dir / "datasets.yaml").write_text(content)
    with pytest.raises(DatasetError) as error:
        load_registry()
    assert str(error.value).startswith(f"{user_dir / 'datasets.yaml'}, line {line}")
    assert message in str(error.value)


def test_user_retriever_errors_name_the_user_file_and_line(user_dir):
    (user_dir / "retrievers.yaml").write_text("systems:\n  ok:\n    kind: bm25\n  broken:\n    kind: dense\n"
                                              "    model: no-such-model\n")
    with pytest.raises(RegistryError, match=f"{user_dir / 'retrievers.yaml'}, line 4: system 'broken' "
                                            "names unknown model 'no-such-model'"):
        load_retrievers()


def test_the_env_files_stay_the_base_under_the_user_folder(user_dir, tmp_path, monkeypatch):
    own = tmp_path / "own_retrievers.yaml"
    own.write_text(SHIPPED_RETRIEVERS.replace("profile: offline\n", "profile: paper\n")
                   .replace("  rerank_depth: 100\n", "  rerank_depth: 50\n"))
    monkeypatch.setenv("BRIDGE_RETRIEVERS", str(own))
    assert load_retrievers().files == (own,) and load_retrievers().active_profile == "paper"
    (user_dir / "retrievers.yaml").write_text("defaults: {k: 5}\n")
    registry = load_retrievers()
    assert registry.files == (own, user_dir / "retrievers.yaml")
    assert (registry.active_profile, registry.defaults.k, registry.defaults.rerank_depth) == ("paper", 5, 50)


COMMENTED = """\
# my registry
profile: offline
systems:
  # ---- mine ----
  first:
    kind: bm25
    # why these values
    parameters: {k1: 1.0}

  # ---- the next block ----
  second:
    kind: bm25
# trailing notes
prompts: {}
"""


def test_adding_an_entry_keeps_comments_and_goes_at_the_end_of_its_section(tmp_path):
    path = tmp_path / "r.yaml"
    text = registry_files.with_entry(COMMENTED, path, "systems", "third", {"kind": "bm25", "profiles": ["x"]})
    assert text == COMMENTED.replace("    kind: bm25\n# trailing", "    kind: bm25\n  third:\n    kind: bm25\n"
                                                                  "    profiles: [x]\n# trailing")
    replaced = registry_files.with_entry(COMMENTED, path, "systems", "first", {"kind": "bm25"}, replace=True)
    assert replaced == COMMENTED.replace("    kind: bm25\n    # why these values\n    parameters: {k1: 1.0}\n",
                                         "    kind: bm25\n")
    with pytest.raises(registry_files.RegistryFileError, match=r"r.yaml, line 5: 'first' already exists"):
        registry_files.with_entry(COMMENTED, path, "systems", "first", {"kind": "bm25"})
    added = registry_files.with_entry(COMMENTED, path, "datasets", "d", {"kind": "beir"})
    assert added == COMMENTED + "datasets:\n  d:\n    kind: beir\n"
    with pytest.raises(registry_files.RegistryFileError, match="line 14: `prompts:` must be a block mapping"):
        registry_files.with_entry(COMMENTED, path, "prompts", "p", {"x": 1})
    assert yaml.safe_load(text)["systems"]["third"] == {"kind": "bm25", "profiles": ["x"]}
    empty = registry_files.with_entry("datasets:\n# later\n", path, "datasets", "d", {"kind": "beir"})
    assert empty == "datasets:\n  d:\n    kind: beir\n# later\n"


def test_add_entry_creates_the_file_and_restores_it_when_validation_fails(tmp_path):
    path = tmp_path / "new" / "datasets.yaml"

    def refuse():
        raise ValueError("invalid")

    with pytest.raises(ValueError):
        registry_files.add_entry(path, "datasets", "d", {"kind": "beir"}, refuse)
    assert not path.exists()
    registry_files.add_entry(path, "datasets", "d", {"kind": "beir"}, lambda: None)
    before = path.read_text()
    with pytest.raises(ValueError):
        registry_files.add_entry(path, "datasets", "e", {"kind": "beir"}, refuse)
    assert path.read_text() == before and yaml.safe_load(before) == {"datasets": {"d": {"kind": "beir"}}}


def test_datasets_add_writes_the_user_folder(user_dir, tmp_path):
    folder = tmp_path / "my_beir"
    folder.mkdir()
    runner = CliRunner()
    result = runner.invoke(app, ["datasets", "add", "mine", "--kind", "beir", "--path", str(folder),
                                 "--split", "dev"])
    assert result.exit_code == 0, result.output
    assert str(user_dir / "datasets.yaml") in result.output
    spec = load_registry()["mine"]
    assert (spec.kind, spec.path, spec.split) == ("beir", str(folder), "dev")
    again = runner.invoke(app, ["datasets", "add", "mine", "--kind", "beir", "--path", str(folder)])
    assert again.exit_code == 2 and "already exists" in again.output
    replaced = runner.invoke(app, ["datasets", "add", "mine", "--kind", "beir", "--path", str(folder), "--replace"])
    assert replaced.exit_code == 0 and load_registry()["mine"].split == "test"
    assert list(yaml.safe_load((user_dir / "datasets.yaml").read_text())["datasets"]) == ["mine"]
    missing = runner.invoke(app, ["datasets", "add", "other", "--kind", "beir", "--path", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no such file or folder" in missing.output
    bad = runner.invoke(app, ["datasets", "add", "../x", "--kind", "beir", "--path", str(folder)])
    assert bad.exit_code == 2 and "invalid dataset name" in bad.output
    assert list(load_registry())[-1] == "mine"


def test_datasets_add_without_a_user_folder_writes_the_registry_file(tmp_path, monkeypatch):
    monkeypatch.delenv("BRIDGE_REGISTRY_DIR", raising=False)
    own = tmp_path / "datasets.yaml"
    shutil.copy(RESOURCES_DIR / "datasets.yaml", own)
    monkeypatch.setattr(dataset_registry, "REGISTRY_PATH", own)
    result = CliRunner().invoke(app, ["datasets", "add", "mine", "--kind", "beir", "--path", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"to {own}" in result.output
    text = own.read_text()
    # inserted after the last entry, before the commented examples at the end of the file
    assert text.index("  mine:\n") < text.index("# Remote sources")
    assert text.replace(f"  mine:\n    kind: beir\n    path: {tmp_path}\n", "") == \
        (RESOURCES_DIR / "datasets.yaml").read_text()


def test_retrievers_add_writes_the_user_folder_and_replaces_only_when_asked(user_dir):
    runner = CliRunner()
    result = runner.invoke(app, ["retrievers", "add", "bm25_strict", "--kind", "bm25", "--param", "k1=1.2"])
    assert result.exit_code == 0, result.output
    assert f"to {user_dir / 'retrievers.yaml'}" in result.output
    assert load_retrievers().system("bm25_strict").params().k1 == 1.2
    taken = runner.invoke(app, ["retrievers", "add", "bm25", "--kind", "bm25", "--param", "k1=2"])
    assert taken.exit_code == 2 and f"{RESOURCES_DIR / 'retrievers.yaml'}, line" in taken.output
    assert "already exists" in taken.output
    replaced = runner.invoke(app, ["retrievers", "add", "bm25", "--kind", "bm25", "--param", "k1=2", "--replace",
                                   "--profile", "offline", "--profile", "offline_fast", "--profile", "paper"])
    assert replaced.exit_code == 0, replaced.output
    assert load_retrievers().system("bm25").params().k1 == 2  # the user's entry wins
    assert list(yaml.safe_load((user_dir / "retrievers.yaml").read_text())["systems"]) == ["bm25_strict", "bm25"]


def test_retrievers_add_a_trained_retriever_as_the_docs_show(user_dir):
    """docs/trained-retriever.md's command: an evaluation-only system, listed as trained."""
    runner = CliRunner()
    result = runner.invoke(app, ["retrievers", "add", "trained_minilm2", "--kind", "trained_retriever",
                                 "--model", "all-minilm-l6-v2", "--param", "labels=original"])
    assert result.exit_code == 0, result.output
    assert "evaluated, never pooled" in result.output
    system = load_retrievers().system("trained_minilm2")
    assert system.evaluation_only and system.params().labels == "original"
    listed = runner.invoke(app, ["retrievers", "list"])
    assert listed.exit_code == 0, listed.output
    line = next(row for row in listed.output.splitlines() if row.startswith("trained_minilm2"))
    assert "trained_retriever" in line and "all-minilm-l6-v2 trained (not pooled)" in line
    bad = runner.invoke(app, ["retrievers", "add", "trained_ce", "--kind", "trained_retriever",
                              "--model", "tinybert-l6-ce"])
    assert bad.exit_code != 0 and "backend cross_encoder" in bad.output
    # on UtilSel labels: the LLM that selects them
    utility = runner.invoke(app, ["retrievers", "add", "trained_util", "--kind", "trained_retriever",
                                  "--model", "all-minilm-l6-v2", "--param", "labels=utility", "--llm-role", "judge"])
    assert utility.exit_code == 0, utility.output
    assert load_retrievers().system("trained_util").llm.role == "judge"
    no_llm = runner.invoke(app, ["retrievers", "add", "trained_util2", "--kind", "trained_retriever",
                                 "--model", "all-minilm-l6-v2", "--param", "labels=utility"])
    assert no_llm.exit_code != 0 and "an llm exactly when its labels are `utility`" in no_llm.output
