"""Every error a user can cause is a BridgeError raised where it happens; a bare built-in
exception stays only for a programming error (or where it is the protocol of the code around
it), and ALLOW says why for each. The walk reads every `raise` of bridge_assets with `ast`."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

import bridge_assets
from bridge_assets.cli.errors import EXIT_ERROR

PACKAGE = Path(bridge_assets.__file__).parent
BUILTINS = {"ValueError", "RuntimeError", "LookupError", "KeyError", "TypeError", "FileNotFoundError",
            "Exception", "AssertionError", "IndexError", "OSError"}

_PYDANTIC = ("a pydantic validator: pydantic turns the ValueError into a ValidationError, which the "
             "loader reports as a BridgeError naming the file and field")
_CAUGHT_BY_PARSE_VOTES = ("caught by parse_votes, which reports it as ImportFailed naming the file "
                          "and the record")
_CAUGHT_BY_BACKEND = ("caught by the backend's generate and recorded on the LLM call as its failure "
                      "(the ledger keeps it; the run goes on)")
_GUARDED_SETTING = "an API guard: the asset's settings (pydantic Field ge=1 ...) refuse the value first"
_LENGTHS = "a programming error: the caller passes sequences of different lengths"

# "path relative to bridge_assets:qualified function" -> (how many raises, why they stay built-ins)
ALLOW: dict[str, tuple[int, str]] = {
    # checks pydantic validators call (the validators themselves are recognised by their decorator)
    "human/transfer.py:_to_label": (1, _PYDANTIC),
    "human/transfer.py:_check_label": (1, _PYDANTIC),
    "human/transfer.py:_check_vote": (1, _PYDANTIC),
    "registry/relevance.py:validate_definition": (2, "a check run by pydantic validators and by the "
                                                     "loaders of datasets and gold sets, which re-raise "
                                                     "it as DatasetError / GoldSetError with file and line"),
    # internal signals turned into a BridgeError by their caller
    "human/transfer.py:_csv_rows": (1, _CAUGHT_BY_PARSE_VOTES),
    "human/transfer.py:_json_rows": (1, _CAUGHT_BY_PARSE_VOTES),
    "human/transfer.py:_label_studio_vote": (2, _CAUGHT_BY_PARSE_VOTES),
    "human/transfer.py:_label_studio_rows": (1, _CAUGHT_BY_PARSE_VOTES),
    "llm/llama_greedy.py:json_grammar": (1, _CAUGHT_BY_BACKEND),
    "llm/llama_greedy.py:Grammar.__init__": (1, _CAUGHT_BY_BACKEND),
    "llm/llama_greedy.py:Grammar.choose": (1, _CAUGHT_BY_BACKEND),
    "llm/llama_greedy.py:greedy_with_logprobs": (1, _CAUGHT_BY_BACKEND),
    "llm/http_backend.py:OpenAIHTTPBackend._result": (1, _CAUGHT_BY_BACKEND),
    "analysis/coverage.py:fit_saturation": (1, "raised like scipy's own non-convergence RuntimeError; the "
                                               "caller catches both and leaves the fit out"),
    # unreachable code
    "lake/ducklake.py:_attach_retrying": (1, "unreachable: the loop returns or raises"),
    "llm/http_backend.py:OpenAIHTTPBackend._apost": (1, "unreachable: the loop returns or raises"),
    # a backend or our own code breaking its contract
    "labeling/calls.py:MeteredGenerate.__call__": (1, "a backend broke its contract (one result per request)"),
    "llm/client.py:LLMClient._call": (1, "a backend broke its contract (the reply's key is the request's)"),
    "llm/resource.py:LLMResource.profiles_for": (1, "a programming error: roles are names in our code (ROLES)"),
    "llm/resource.py:LLMResource.profile_for": (1, "a programming error: a multi-profile role asked for one"),
    "orchestration/runs.py:Materialized.metadata": (1, "a programming error: asked for an asset the run did not "
                                                  "materialize"),
    "settings.py:Settings.raw": (1, "a programming error: a variable not declared in VARIABLES"),
    "pipeline/asset_config.py:reads_tags": (1, "a programming error: an asset declares reads that do not exist"),
    "pipeline/staleness.py:_reused": (1, "a programming error: bridge_assets.definitions hands the whole "
                                           "graph over when it is imported, before any run can reuse"),
    "lake/store.py:location": (1, "a programming error: a caller passed a path where the edge resolves a "
                                  "LakeLocation"),
    "lake/store.py:one_row": (1, "a programming error: a query that always returns one row returned none"),
    "lake/store.py:replace_partition": (1, "a programming error: a frame without its partition columns"),
    "student/rerank.py:run_evaluation_systems": (1, "a programming error: the registry ensures a utility "
                                                    "trained_retriever has an llm; the caller passes generate"),
    "student/escalation.py:escalation_study": (1, _LENGTHS),
    "evaluation/lara.py:lara": (1, _LENGTHS),
    "evaluation/scores.py:class_recalls": (1, _LENGTHS),
    "evaluation/scores.py:labeler_metrics": (2, _LENGTHS + "; or a case neither labelled nor escalated"),
    "evaluation/scores.py:agreement": (1, _LENGTHS),
    "evaluation/scores.py:final_labels.final": (1, "a programming error: the labeler gives every case a "
                                                   "label or escalates it"),
    "evaluation/scores.py:reliability_bins": (1, "a programming error: callers pass only scored cases, "
                                                  "and none when there are none"),
    "evaluation/scores.py:auroc_intervals": (1, "a library precondition (both classes present), for "
                                                 "callers that computed the AUROC first"),
    "analysis/significance.py:randomization_tests": (1, "a programming error: a matrix of the wrong shape"),
    "human/agreement.py:category_counts": (1, "a programming error: votes are validated when stored"),
    "human/agreement.py:fleiss_kappa": (1, "a programming error: the caller keeps pairs with exactly "
                                           "REQUIRED_VOTES votes"),
    # API guards behind validated settings
    "analysis/coverage.py:compute_pool_coverage": (1, _GUARDED_SETTING),
    "analysis/saturation.py:compute_pool_saturation": (1, _GUARDED_SETTING),
    "analysis/partial.py:compute_partial_annotation_study": (1, _GUARDED_SETTING),
    "analysis/rag.py:rag_contexts": (1, _GUARDED_SETTING),
    "evaluation/goldsets.py:stratified_head": (1, _GUARDED_SETTING + " (and the CLI's --limit min=1)"),
    "labeling/pooling.py:candidate_pool": (1, _GUARDED_SETTING),
    "labeling/debate.py:escalation_count": (1, "an API guard: ratios come from settings bounded to [0, 1]"),
    "labeling/debate.py:run_debate": (4, "an API guard: DebateLabeler checks rounds (ge=1), persistence "
                                         "(check_persistence) and builds distinct agents (debate_agents)"),
    "labeling/persistence.py:debate_persistence": (2, "an API guard: DebateLabeler.check_persistence "
                                                      "refuses these settings first, as LabelerError"),
    "labeling/filter.py:run_filter": (1, "an API guard: the filter asset falls back to the filter role's "
                                         "profiles, never none"),
}


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc
    target = exc.func if isinstance(exc, ast.Call) else exc
    return target.id if isinstance(target, ast.Name) else None


VALIDATORS = {"field_validator", "model_validator", "validator", "root_validator"}


def _pydantic_validator(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether `function` is decorated as a pydantic validator (`@field_validator(...)`, ...)."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name in VALIDATORS:
            return True
    return False


def builtin_raises() -> Counter[str]:
    """"path:function" -> how many `raise <built-in>(...)` it holds (module level: "<module>")."""
    found: Counter[str] = Counter()

    def visit(node: ast.AST, scope: list[str], where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and _pydantic_validator(child):
                continue  # pydantic's protocol: it turns the ValueError into a ValidationError (_PYDANTIC)
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, [*scope, child.name], where)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None and _raised_name(child) in BUILTINS:
                found[f"{where}:{'.'.join(scope) or '<module>'}"] += 1
            visit(child, scope, where)

    for path in sorted(PACKAGE.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), [], path.relative_to(PACKAGE).as_posix())
    return found


def test_every_bare_builtin_raise_is_allowed_with_a_reason():
    found = builtin_raises()
    unexplained = {key: n for key, n in found.items() if key not in ALLOW}
    assert unexplained == {}, ("raise a BridgeError subclass where the user can cause these (else add "
                               "each to ALLOW with why it is a programming error)")
    more = {key: (n, ALLOW[key][0]) for key, n in found.items() if n > ALLOW[key][0]}
    assert more == {}, "more bare raises than ALLOW explains (found, allowed)"
    stale = {key for key in ALLOW if found[key] < ALLOW[key][0]}
    assert stale == set(), "fewer bare raises than ALLOW says: lower or remove these entries"
    assert all(reason.strip() for _, reason in ALLOW.values())


def test_the_walk_sees_a_bare_raise():
    tree = ast.parse("def f():\n    raise ValueError('x')\n")
    assert _raised_name(next(n for n in ast.walk(tree) if isinstance(n, ast.Raise))) == "ValueError"


def test_an_unknown_asset_stops_materialize_with_one_line(data_lake):
    from bridge_assets.cli.main import app

    result = CliRunner().invoke(app, ["materialize", "no_such_asset"])
    assert result.exit_code == EXIT_ERROR, result.output
    assert result.stderr.startswith("error: unknown asset(s) no_such_asset (known: ")
    assert "Traceback" not in result.output and "ValueError" not in result.stderr


def test_a_bad_storage_setting_stops_with_one_line(data_lake, monkeypatch):
    from bridge_assets.cli.main import app

    monkeypatch.setenv("BRIDGE_STORAGE", "s3")
    result = CliRunner().invoke(app, ["sql", "select 1"])
    assert result.exit_code == EXIT_ERROR, result.output
    assert result.stderr.strip() == "error: BRIDGE_STORAGE='s3': expected one of duckdb, ducklake"


def test_sql_on_a_missing_table_is_one_line(data_lake, duckdb_storage, tmp_path):
    import duckdb

    from bridge_assets.cli.main import app

    duckdb.connect(str(data_lake / "bridge.duckdb")).close()
    result = CliRunner().invoke(app, ["sql", "select * from no_such_table"])
    assert result.exit_code == EXIT_ERROR, result.output
    assert result.stderr.startswith("error: Catalog Error: Table with name no_such_table does not exist")
    assert len(result.stderr.strip().splitlines()) == 1


def test_sql_without_a_lake_names_where_it_looked(data_lake, duckdb_storage):
    from bridge_assets.cli.main import app

    result = CliRunner().invoke(app, ["sql", "select 1"])
    assert result.exit_code == EXIT_ERROR, result.output
    assert result.stderr.strip() == f"error: no data lake at {data_lake / 'bridge.duckdb'}"


def test_a_raise_inside_a_pydantic_validator_is_pydantics_protocol_and_others_count():
    tree = ast.parse("class Spec(BaseModel):\n"
                     "    @field_validator('k')\n    def _k(cls, v):\n        raise ValueError('k')\n"
                     "    @model_validator(mode='after')\n    def _all(self):\n        raise ValueError('all')\n"
                     "    def plain(self):\n        raise ValueError('plain')\n")
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    assert [_pydantic_validator(f) for f in functions] == [True, True, False]
