"""Storage resolved once, settings declared once (issue 24, item 2): every BRIDGE_* variable is
declared in bridge_assets/settings.py and in README.md's table, and the lake's location is built
once per process and handed to every store call of a run."""

import re
from pathlib import Path

import dagster as dg
import polars as pl

from bridge_assets import settings
from bridge_assets.human.votes_store import VotesStore
from bridge_assets.lake import location, store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm import ledger
from bridge_assets.llm.resource import LLMResource
from bridge_assets.paths import LakeLocation

PROJECT_ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| `(BRIDGE_[A-Z_]+)` \| (.*?) \| (.*?) \|$")
# Not mine to change yet (its owner is told): it still reads BRIDGE_GOLDSETS itself.
PENDING: set[str] = set()  # modules still reading BRIDGE_* themselves: none


def test_the_readme_table_lists_every_setting_declared_and_no_other():
    table = {m[1]: (m[2].strip("`"), m[3]) for line in (PROJECT_ROOT / "README.md").read_text().splitlines()
             if (m := ROW.match(line))}
    declared = {s.name: (s.default, s.meaning) for s in settings.VARIABLES}
    assert sorted(table) == sorted(declared)
    assert table == declared


def test_only_the_settings_module_reads_bridge_variables():
    readers = set()
    for path in (PROJECT_ROOT / "bridge_assets").rglob("*.py"):
        text = path.read_text()
        if re.search(r"(os\.environ|getenv)[^\n]*BRIDGE_|(os\.environ|getenv)[^\n]*_ENV\b", text):
            readers.add(str(path.relative_to(PROJECT_ROOT)))
    assert readers - PENDING == set()


def test_an_undeclared_variable_cannot_be_asked_for():
    try:
        settings.env.raw("BRIDGE_NOT_DECLARED")
    except KeyError as exc:
        assert "not declared" in str(exc)
    else:
        raise AssertionError("an undeclared variable was read")


def test_hf_hub_offline_is_read_one_way_as_the_hugging_face_libraries_read_it(monkeypatch):
    for value, offline in (("1", True), ("true", True), ("ON", True), ("0", False), ("", False)):
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        assert settings.env.hf_offline() is offline
    readers = {str(path.relative_to(PROJECT_ROOT)) for path in (PROJECT_ROOT / "bridge_assets").rglob("*.py")
               if re.search(r"(environ\.get|getenv)\(\s*[\"']HF_HUB_OFFLINE", path.read_text())}
    assert readers == {"bridge_assets/settings.py"}


def test_the_location_is_built_once_and_every_store_call_of_a_run_uses_it(data_lake, monkeypatch):
    built: list[LakeLocation] = []
    seen: list[object] = []
    files: list[Path] = []
    build, store_location, connect_file, attach_file = (location.build_location, store.location,
                                                        store.connect_file, store.attach_file)

    def counting_build(*args):
        built.append(build(*args))
        return built[-1]

    def recording_location(lake):
        seen.append(lake)
        return store_location(lake)

    def recording_connect_file(path, **kwargs):
        files.append(Path(path))
        return connect_file(path, **kwargs)

    def recording_attach_file(con, path, alias, **kwargs):
        files.append(Path(path))
        return attach_file(con, path, alias, **kwargs)

    monkeypatch.setattr(location, "_locations", {})
    monkeypatch.setattr(location, "build_location", counting_build)
    monkeypatch.setattr(store, "location", recording_location)
    monkeypatch.setattr(store, "connect_file", recording_connect_file)
    monkeypatch.setattr(store, "attach_file", recording_attach_file)

    @dg.asset
    def written(context: dg.AssetExecutionContext, store: DuckDBStore, llm: LLMResource,
                votes: VotesStore) -> None:
        store.write_partitions({"t": pl.DataFrame({"dataset": ["a"], "value": [1]})}, dataset="a")
        assert store.read("select value from t")["value"].to_list() == [1]
        store.snapshot("a", ("t",), votes=votes).close()
        assert ledger.lookup([context.run_id], llm.lake) == {}
        votes.prepare()
        with votes.connect() as con:  # the votes store, the pipeline's tables readable
            assert con.execute("select count(*) from t").fetchone()[0] == 1

    lake = DuckDBStore()
    result = dg.materialize([written], resources={"store": lake, "llm": LLMResource(store=lake),
                                                  "votes": VotesStore(store=lake)})
    assert result.success
    assert len(built) == 1 and built[0].folder == data_lake
    # every store call was handed the one location; the only file opened as a file is the votes store
    assert seen and all(w is built[0] for w in seen), seen
    assert set(files) == {built[0].votes_db}


def test_the_lake_defaults_the_settings_document_are_the_ones_the_ducklake_applies():
    from bridge_assets.lake import ducklake

    assert settings.BY_NAME["BRIDGE_LAKE_CATALOG"].default == f"sqlite:{ducklake.CATALOG_FILE}"
    assert settings.BY_NAME["BRIDGE_LAKE_DATA_PATH"].default == f"<data lake>/{ducklake.DATA_FOLDER}/"
    assert settings.BY_NAME["BRIDGE_LAKE_INLINE_ROWS"].default == str(ducklake.INLINE_ROWS)
