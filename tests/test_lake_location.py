"""One owner of the lake's location (issue 15, item 6): the DuckDBStore resource (its LakeLocation, built by lake.location.lake_location),
which the command line, the sensors and the LLM call ledger all ask. BRIDGE_DATA_LAKE stays the
way users set it, BRIDGE_VOTES_DB moves the votes store."""

from __future__ import annotations

from bridge_assets.lake import store
from bridge_assets.lake.location import lake_location
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm import ledger
from bridge_assets.llm.resource import LLMResource
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.paths import PROJECT_ROOT
from fixtures.paths import location


def test_a_relative_bridge_data_lake_is_where_the_ledger_the_store_and_the_llm_resource_look(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BRIDGE_DATA_LAKE", "data_lake/eval")  # as the labeler evaluation runs
    monkeypatch.delenv("BRIDGE_VOTES_DB", raising=False)
    expected = tmp_path / "data_lake" / "eval" / "bridge.duckdb"
    assert DuckDBStore().path == lake_location().duckdb == LLMResource().lake.duckdb == expected
    assert DuckDBStore().lake.dagster_home == tmp_path / "data_lake" / "eval" / "dagster_home"
    assert DuckDBStore().lake.reports("demo") == tmp_path / "data_lake" / "eval" / "reports" / "demo"

    request = LLMRequest(messages=(("user", "where is the ledger?"),), purpose="test")
    key = ledger.call_key("llama_cpp", "m", request)
    ledger.append([ledger.CallRecord(request, LLMResult(key=key, text="here"), 1)],
                  profile="p", backend="llama_cpp", model="m", context=None, lake=location())  # the environment's lake
    assert store.exists(location()) and ledger.lookup([key], location())[key].text == "here"
    with store.connect(DuckDBStore().lake) as con:
        assert con.execute("select count(*) from llm_calls").fetchone()[0] == 1


def test_the_votes_store_sits_beside_the_lake_unless_configured(tmp_path, monkeypatch):
    monkeypatch.delenv("BRIDGE_VOTES_DB", raising=False)
    lake = DuckDBStore(data_lake=str(tmp_path / "lake"))
    assert lake.votes_path == tmp_path / "lake" / "annotations" / "votes.duckdb"
    assert lake.path == tmp_path / "lake" / "bridge.duckdb"
    monkeypatch.setenv("BRIDGE_VOTES_DB", str(tmp_path / "elsewhere" / "votes.duckdb"))
    assert lake.votes_path == tmp_path / "elsewhere" / "votes.duckdb"
    configured = DuckDBStore(data_lake=str(tmp_path / "lake"), votes_db=str(tmp_path / "v.duckdb"))
    assert configured.votes_path == tmp_path / "v.duckdb"
    nested = LLMResource(store=DuckDBStore(data_lake=str(tmp_path / "lake")))
    assert nested.lake.duckdb == tmp_path / "lake" / "bridge.duckdb"


def test_only_the_edges_build_the_lake_location():
    """`lake_location()` is called where a location enters: the store resource, the commands that
    open the votes store without Dagster, an LLMClient used on its own; everything else is handed
    the LakeLocation (ast: calls by name or attribute, docstrings and messages not counted)."""
    import ast

    package = PROJECT_ROOT / "bridge_assets"
    callers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "lake_location":
                callers.add(path.relative_to(package).as_posix())
    edges = {"lake/resource.py", "llm/client.py"}
    assert {c for c in callers if not c.startswith("cli/")} == edges
