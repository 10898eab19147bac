"""Relevance as the dataset defines it, end to end: a dataset without short answers is judged
by its definition (`useful` by default) in every labeler's prompt; the filter's drops are
unverified and audited; the debate's consensus stays provisional (0 holes found, the metrics
bound it) until people label the calibration sample, served first on the annotation page; then
the classes people showed right count as labels, and the audit estimates the holes the drops
hide. The models answer from a script behind the real LLM client (tests/fixtures/scripted_llm.py).
"""

from __future__ import annotations

import json
import math
import shutil
import zlib
from dataclasses import replace

import dagster as dg
import polars as pl
import pytest

from bridge_assets.cli.audit import audit_pair, format_story
from bridge_assets.cli.summary import run_summary
from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.assets import human_labels
from bridge_assets.ingest import assets as ingest_assets
from bridge_assets.labeling import assets as labeling_assets
from bridge_assets.labeling.debate_turns import debate_agents, turn_request
from bridge_assets.labeling.filter import filter_request
from bridge_assets.labeling.judge import judge_agent
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.labeling.review import audit_sample, calibration_sample, draw, review_sample
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.paths import PROJECT_ROOT, read_sql
from bridge_assets.qrels.assets import bridge_qrels
from bridge_assets.qrels.merge import qrels_counts
from bridge_assets.qrels.trust import Proportion, class_trust, debate_trust, trusted_by_rule
from bridge_assets.registry.datasets import DatasetSpec, get_dataset
from bridge_assets.registry.relevance import USEFUL_DEFINITION, Relevance, RelevanceSettings, resolve_relevance
from bridge_assets.reports.build import build_report
from fixtures.human_app import login, make_client, post_answer, served_pair
from fixtures.paths import annotations, lake_resources, location
from fixtures.scripted_llm import ScriptedLLM, ScriptedServer, completion, section

DATASET = "demo"  # the registry folder's entry replaces the shipped demo (a static partition)
QUESTION = "How do I write a small anonymous function inline in Python?"


# --- the definition: resolved once, read by every labeler -------------------------------------

def test_a_query_is_judged_by_its_own_definition_else_its_dataset_s_else_the_default():
    assert resolve_relevance(None, answers=("lambda",)) == Relevance("answer_support")
    assert resolve_relevance(None, answers=(), narrative="n") == Relevance("narrative")
    assert resolve_relevance(None, answers=()) == Relevance("useful", USEFUL_DEFINITION)
    assert resolve_relevance("useful", answers=("x",)) == Relevance("useful", USEFUL_DEFINITION)
    own = resolve_relevance("useful", answers=(), query_definition=" Only  exact dates. ")
    assert own == Relevance("custom", "Only exact dates.")  # the query's wins, spaces folded
    assert resolve_relevance("narrative", answers=()) == Relevance("useful", USEFUL_DEFINITION)
    assert resolve_relevance("A passage naming a singer.", answers=()).kind == "custom"
    with pytest.raises(ValueError, match="preset"):
        resolve_relevance("  ", answers=())


def test_a_dataset_entry_states_its_definition_or_fails_naming_the_field():
    spec = DatasetSpec(name="mine", kind="beir", path="p", relevance={"definition": "  Names  count. "})
    assert spec.relevance.definition == "Names count." and spec.relevance.min_precision == 0.7
    for bad in ({"definition": "  "}, {"definiton": "useful"}, {"min_precision": 0}):
        with pytest.raises(ValueError, match="relevance"):
            DatasetSpec(name="mine", kind="beir", path="p", relevance=bad)


def _prompts(pair: Pair) -> dict[str, str]:
    prompts, agents = Prompts(), debate_agents(["m"])
    rendered = {"filter": filter_request(pair, prompts).messages,
                "debate": turn_request(pair, agents[0], agents, [], 1, prompts, 0.0, 30).messages,
                "judge": turn_request(pair, judge_agent("m"), [judge_agent("m")], [], 1, prompts, 0.0, 30).messages,
                "diras": prompts.messages("diras_score", **pair.prompt_context())}
    return {name: "\n".join(text for _, text in messages) for name, messages in rendered.items()}


def test_the_dataset_s_definition_reaches_every_prompt_and_key_and_a_query_s_own_wins():
    base = Pair("q", "d", QUESTION, (), "lambda x: x + 1 makes a function.")
    mine = replace(base, definition="A chunk naming a Python keyword is relevant.")
    own = replace(mine, query_definition="Only chunks with code count.")
    for name, text in _prompts(mine).items():
        assert "What counts as relevant: A chunk naming a Python keyword is relevant." in text, name
    for name, text in _prompts(own).items():
        assert "What counts as relevant: Only chunks with code count." in text, name
        assert "Python keyword" not in text, name
    for name, text in _prompts(base).items():
        assert f"What counts as relevant: {USEFUL_DEFINITION}" in text, name
        assert "none are given" not in text, name
    assert len({base.key, mine.key, own.key}) == 3
    # a pair with short answers judged by them keeps the key its stored labels carry
    answered = Pair("q", "d", QUESTION, ("lambda",), "chunk")
    assert answered.key == replace(answered, definition="answer_support").key
    assert answered.key != replace(answered, definition="useful").key


def test_the_definition_is_part_of_the_labeler_s_config_hash():
    from bridge_assets.labeling.labeler import build_labeler

    for method in ("dream", "judge", "filter", "diras"):
        labeler = build_labeler({"labeler": method, "models": ["m"]}, lambda role: ["m"])
        hashes = {labeler.config_hash(model_id=str, definition=d) for d in (None, "useful", "mine")}
        assert len(hashes) == 3, method


# --- the review sample and the trust rule, by hand ---------------------------------------------

def test_the_audit_sample_is_seeded_stable_and_keeps_its_pairs_as_the_pool_grows():
    drops = [(f"q{i}", f"d{i}") for i in range(200)]
    first = audit_sample(drops, 0.05, 10, seed=0)
    assert first == audit_sample(list(reversed(drops)), 0.05, 10, seed=0)  # order-free
    assert len(first) >= 10 and set(first) <= set(drops)
    assert first != audit_sample(drops, 0.05, 10, seed=1)
    grown_drops = drops + [(f"n{i}", f"e{i}") for i in range(200)]
    under_share = [pair for pair in first if draw(0, *pair) < 0.05]
    assert set(under_share) <= set(audit_sample(grown_drops, 0.05, 10, seed=0))  # a draw depends on nothing else
    assert sorted(audit_sample(drops[:4], 0.05, 10, seed=0)) == sorted(drops[:4])  # fewer than the minimum: all
    # the review sample keeps every pair drawn before while it is still a drop (its votes count)
    pool = pl.DataFrame({"query_id": [q for q, _ in grown_drops], "doc_id": [d for _, d in grown_drops],
                         "kept": [False] * len(grown_drops)})
    labels = pl.DataFrame(schema={"query_id": pl.Utf8, "doc_id": pl.Utf8, "outcome": pl.Utf8, "label": pl.Int32})
    sample = review_sample(pool, labels, RelevanceSettings(), trusted_by_rule=True,
                           previous={(q, d, "audit") for q, d in first})
    assert set(first) <= set(sample.select("query_id", "doc_id").rows())


def test_the_calibration_sample_spreads_over_outcomes():
    strata = {"consensus_yes": [("q", f"y{i}") for i in range(3)],
              "consensus_no": [("q", f"n{i}") for i in range(20)]}
    chosen = calibration_sample(strata, 8, seed=0)
    by = {s: sum(1 for stratum, _, _ in chosen if stratum == s) for s in strata}
    assert by == {"consensus_yes": 3, "consensus_no": 5}  # the short stratum's share goes on
    pool = pl.DataFrame({"query_id": ["q"] * 4, "doc_id": ["a", "b", "c", "d"], "kept": [False, True, True, True]})
    labels = pl.DataFrame({"query_id": ["q"] * 3, "doc_id": ["b", "c", "d"],
                           "outcome": ["consensus", "consensus", "escalated"], "label": [1, 0, None]})
    settings = RelevanceSettings(audit_min_pairs=1)
    trusted = review_sample(pool, labels, settings, trusted_by_rule=True)
    assert trusted.select("doc_id", "kind").rows() == [("a", "audit")]  # no calibration by default
    provisional = review_sample(pool, labels, settings, trusted_by_rule=False)
    assert sorted(provisional.select("doc_id", "kind", "stratum").rows()) == [
        ("a", "audit", "filter_drop"), ("b", "calibration", "consensus_yes"),
        ("c", "calibration", "consensus_no")]


def test_the_trust_rule_needs_proof_where_untrusted_and_disproof_where_trusted():
    assert not class_trust(1, Proportion(0, 0), False, 0.7).trusted
    assert not class_trust(1, Proportion(8, 8), False, 0.7).trusted     # Wilson low 0.68
    assert class_trust(1, Proportion(9, 9), False, 0.7).trusted         # low 0.70
    assert class_trust(1, Proportion(0, 0), True, 0.7).trusted
    assert class_trust(1, Proportion(1, 2), True, 0.7).trusted          # not shown below the bar
    assert not class_trust(1, Proportion(1, 10), True, 0.7).trusted     # high 0.40 < 0.7
    low, high = Proportion(3, 12).interval
    z = 1.959963984540054
    centre, half = (3 + z * z / 2) / (12 + z * z), z / (12 + z * z) * (3 * 9 / 12 + z * z / 4) ** 0.5
    assert (low, high) == pytest.approx((centre - half, centre + half))


# --- end to end, from a dataset without answers to findings --------------------------------------

def write_dataset(folder) -> None:
    """The demo's corpus and judgments with its questions stripped of their answers."""
    demo = PROJECT_ROOT / "resources" / "data" / "demo"
    data = folder / "noanswers"
    (data / "qrels").mkdir(parents=True)
    shutil.copy(demo / "corpus.jsonl", data / "corpus.jsonl")
    shutil.copy(demo / "qrels" / "test.tsv", data / "qrels" / "test.tsv")
    with (demo / "queries.jsonl").open() as lines, (data / "queries.jsonl").open("w") as out:
        for line in lines:
            record = json.loads(line)
            out.write(json.dumps({"_id": record["_id"], "text": record["text"]}) + "\n")
    (folder / "datasets.yaml").write_text(
        f"datasets:\n  {DATASET}:\n    kind: beir\n    path: noanswers\n"
        "    relevance: {min_precision: 0.5, calibration_pairs: 8, audit_min_pairs: 3}\n")


def checksum(text: str) -> int:
    return zlib.crc32(text.encode())


class Script:
    """The filter (the scorer's question under a definition) gives P(yes) 0.1 to a chunk whose
    checksum is divisible by 3, else 0.9; both agents say yes when it is even (a consensus in
    round 1). Every prompt is kept."""

    def __init__(self):
        self.users: list[str] = []

    def __call__(self, index: int, body: dict):
        system, user = (m["content"] for m in body["messages"])
        self.users.append(user)
        chunk = checksum(section(user, "<<<", ">>>"))
        schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema") or \
            (body.get("response_format") or {}).get("schema") or {}
        if set(schema.get("properties", {})) == {"response"}:  # the scorer's question
            p_yes = 0.1 if chunk % 3 == 0 else 0.9
            word = "yes" if p_yes > 0.5 else "no"
            top = [{"token": "yes", "logprob": math.log(p_yes)}, {"token": "no", "logprob": math.log(1 - p_yes)}]
            return 200, completion(json.dumps({"response": word}),
                                   logprobs=[{"token": word, "logprob": math.log(max(p_yes, 1 - p_yes)),
                                              "top_logprobs": top}]), 0
        return 200, completion(json.dumps({"reference": [], "reason": "scripted",
                                           "response": "yes" if chunk % 2 == 0 else "no"})), 0


def run_assets(lake, assets, llm=None):
    resources = lake_resources(lake, **({"llm": llm} if llm else {}))
    result = dg.materialize(assets, partition_key=DATASET, resources=resources, raise_on_error=False,
                            run_config={"ops": {"candidate_pool": {"config": {"depth": 4}},
                                                "filter_pool": {"config": {"models": ["f1"]}},
                                                "debate": {"config": {"reason_words": 20}}}}
                            if llm else {})
    assert result.success
    return result


def rows(lake, sql: str) -> list[tuple]:
    with store.connect(location(lake)) as con:
        return con.execute(sql).fetchall()


def frame(lake, sql: str) -> pl.DataFrame:
    with store.connect(location(lake)) as con:
        return con.execute(sql).pl()


def write_bm25(lake) -> None:
    """A run of the demo's own first-stage shape: every query against the same eight chunks."""
    docs = [d for (d,) in rows(lake, "select doc_id from corpus order by doc_id limit 40")]
    queries = [q for (q,) in rows(lake, "select query_id from queries order by 1")]
    run = pl.DataFrame([(DATASET, "bm25", q, d, rank, 1.0 / rank, "hand")
                        for i, q in enumerate(queries) for rank, d in enumerate(docs[i:i + 4], 1)],
                       schema=["dataset", "retriever", "query_id", "doc_id", "rank", "score", "config_hash"],
                       orient="row")
    store.write_partitions({"retrieval_run": run}, {"dataset": DATASET, "retriever": "bm25"},
                           location(lake))


def vote_all(lake, decide) -> int:
    """Three annotators answer every item the page serves them with `decide(query, doc)`;
    returns how many of the first items served were calibration pairs."""
    with annotations() as con:
        tokens = {name: add_annotator(con, name) for name in ("ann", "bob", "cat")}
    first_kinds = []
    for name, token in tokens.items():
        client = make_client(lake, known_rate=0.0)
        login(client, token)
        served = 0
        while 'id="vote-form"' in (page := client.get("/annotate").text):
            query_id, doc_id, check = served_pair(lake, page)
            assert not check
            # people judge by the same definition as the models
            assert f'<p id="definition">{USEFUL_DEFINITION}</p>' in page and 'id="answers"' not in page
            if served == 0:
                first_kinds.append(rows(lake, f"select kind from review_sample where query_id = '{query_id}' "
                                              f"and doc_id = '{doc_id}'"))
            assert post_answer(client, page, decide(query_id, doc_id)).status_code == 303
            served += 1
    return sum(1 for kinds in first_kinds if kinds == [("calibration",)])


def test_without_answers_model_labels_stay_provisional_until_people_measure_them(data_lake, tmp_path,
                                                                                   monkeypatch):
    registry = tmp_path / "registry"
    registry.mkdir()
    write_dataset(registry)
    monkeypatch.setenv("BRIDGE_REGISTRY_DIR", str(registry))
    run_assets(data_lake, [ingest_assets.ingest_dataset])
    write_bm25(data_lake)
    script = Script()
    with ScriptedServer(script) as server:
        llm = ScriptedLLM(data_lake=str(data_lake), url=server.url, debate="agent", adjudicator="adj")
        labeled = run_assets(data_lake, [labeling_assets.candidate_pool, labeling_assets.filter_pool,
                                         labeling_assets.debate], llm)
    for node, asset in (("filter_pool", "filtered_pool"), ("debate", "review_sample")):
        event = next(e for e in labeled.asset_materializations_for_node(node)
                     if e.asset_key.to_user_string() == asset)
        assert event.metadata["relevance_definition"].value.startswith("default (answer_support with short")
        assert event.metadata["relevance_settings"].value["calibration_pairs"] == 8
    # every prompt judged by the default definition of a dataset without answers: `useful`
    assert script.users and all(f"What counts as relevant: {USEFUL_DEFINITION}" in u for u in script.users)
    assert not any("Reference answers" in u for u in script.users)
    run_assets(data_lake, [human_labels, bridge_qrels])

    qrels = frame(data_lake, "select * from bridge_qrels")
    consensus = frame(data_lake, "select query_id, doc_id, label from debate_labels where outcome = 'consensus'")
    drops = frame(data_lake, "select query_id, doc_id from filtered_pool where not kept")
    assert consensus.filter(pl.col("label") == 1).height >= 4 and consensus.filter(pl.col("label") == 0).height >= 4
    assert drops.height >= 3
    # the filter's drops: relevance 0, never verified; the consensus: provisional, bounded
    dropped = qrels.filter(pl.col("source") == "filter")
    assert dropped.height == drops.height and not dropped["verified"].any()
    provisional = qrels.filter(pl.col("unverified_source") == "provisional")
    assert provisional.height == consensus.height and provisional["relevance"].is_null().all()
    assert (provisional["source"] == "pending").all() and "debate" not in set(qrels["source"])
    assert qrels_counts(qrels)["holes_found"] == 0
    # neither a drop nor a provisional label is a training label of the student
    with store.connect(location(data_lake)) as con:
        trained = con.execute(read_sql("student_training_set"), {"dataset": DATASET}).pl()
    assert set(trained["source"]) <= {"original"}
    with store.connect_read_only(location(data_lake)) as con:
        summary = run_summary(con, DATASET, 0.0, get_dataset(DATASET))
    assert "holes found (verified" in summary and "): 0" in summary.split("\n")[3]
    assert 'debate consensus "yes": provisional, not counted (provisional: no calibration labels yet)' in summary
    assert "filter (drops, unverified)" in summary
    assert "none labelled by people yet: holes among the drops not estimated" in summary

    sample = frame(data_lake, "select * from review_sample")
    calibration = sample.filter(pl.col("kind") == "calibration")
    audit = sample.filter(pl.col("kind") == "audit")
    assert calibration.height == 8 and set(calibration["stratum"]) == {"consensus_yes", "consensus_no"}
    assert audit.height == 3 and set(audit.select("query_id", "doc_id").rows()) <= set(drops.rows())

    # people vote through the annotation page, calibration pairs first: they agree with every
    # consensus, and find one of the audited drops relevant
    truth = {(q, d): label for q, d, label in consensus.rows()}
    hole = sorted(audit.select("query_id", "doc_id").rows())[0]
    assert vote_all(data_lake, lambda q, d: truth.get((q, d), int((q, d) == hole))) == 3
    run_assets(data_lake, [human_labels, bridge_qrels])
    with annotations() as con:
        admin = add_annotator(con, "boss", admin=True)
    client = make_client(data_lake)
    login(client, admin)
    overview = client.get("/admin").text
    assert "<td>3 / 3</td><td>8 / 8</td>" in overview  # audit and calibration: decided / drawn

    qrels = frame(data_lake, "select * from bridge_qrels")
    yes = calibration.filter(pl.col("stratum") == "consensus_yes").height
    no = calibration.height - yes
    assert (yes, no) == (4, 4)
    assert bridge_trust(data_lake) == (True, True)  # 4/4 each: Wilson's low end 0.51 >= 0.5
    debate = qrels.filter(pl.col("source") == "debate")
    assert debate.height == consensus.height - calibration.height and debate["verified"].all()
    counts = qrels_counts(qrels)
    new_yes = consensus.filter(pl.col("label") == 1).join(
        frame(data_lake, "select query_id, doc_id from original_qrels"), on=["query_id", "doc_id"], how="anti")
    assert counts["holes_found"] == new_yes.height + 1  # the consensus "yes" outside the gold, and the audited hole
    with store.connect_read_only(location(data_lake)) as con:
        summary = run_summary(con, DATASET, 0.0, get_dataset(DATASET))
    assert f'debate consensus "yes": counted as labels (measured here at or above the bar 0.5); ' \
           f"people agreed {yes}/{yes} = 1.00" in summary
    assert f"people agreed {no}/{no}" in summary
    # the audit: 1 hole among 3 labelled drops, scaled to the drops, Wilson's interval by hand
    z = 1.959963984540054
    centre, half = (1 + z * z / 2) / (3 + z * z), z / (3 + z * z) * (1 * 2 / 3 + z * z / 4) ** 0.5
    n = drops.height
    estimate = (f"audit sample 3, 3 labelled by people, 1 of them holes: about {n / 3:.1f} holes among "
                f"the drops [95% CI {(centre - half) * n:.1f}, {(centre + half) * n:.1f}]")
    assert estimate in summary

    # the report and bridge audit tell the same
    with store.connect_read_only(location(data_lake)) as con:
        report = build_report(con, DATASET, tmp_path / "report", relevance=get_dataset(DATASET).relevance)
        story = audit_pair(con, DATASET, *hole)
    markdown = report.markdown.read_text()
    assert "What the models' labels count for" in markdown and estimate in markdown
    assert story["relevance"] == {"kind": "useful", "definition": USEFUL_DEFINITION, "from": "the default"}
    assert story["human"]["review_sample"] == {"kind": "audit", "stratum": "filter_drop"}
    text = format_story(story)
    assert "in the audit of the filter's drops" in text and "relevant means        useful (the default)" in text

    # the dataset asks the metrics' upper bound to count the estimate: bridge_qrels is out of
    # date, then marks the unlabelled drops the filter found most likely relevant
    from bridge_assets.pipeline.staleness import external_change

    recorded = labeled_metadata(run_assets(data_lake, [human_labels, bridge_qrels]))
    assert recorded["drops_in_bounds"] is False and "not estimated" not in recorded["dropped_holes"]
    key = dg.AssetKey("bridge_qrels")
    lake_store = DuckDBStore(data_lake=str(data_lake))
    assert external_change(key, DATASET, recorded, lake_store) is None
    yaml_file = registry / "datasets.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("audit_min_pairs: 3}", "audit_min_pairs: 3, drops_in_bounds: true}"))
    assert external_change(key, DATASET, recorded, lake_store) == "the dataset's relevance.drops_in_bounds changed"
    recorded = labeled_metadata(run_assets(data_lake, [human_labels, bridge_qrels]))
    marked = frame(data_lake, "select doc_id from bridge_qrels where estimated_hole")
    unlabelled = n - 3
    assert unlabelled > 0
    assert 0 < marked.height == recorded["estimated_holes"] == min(unlabelled, math.ceil(round((centre + half) * unlabelled, 9)))
    assert f"upper bound counts {marked.height} of the {unlabelled} unlabelled drops" in recorded["dropped_holes"]


def labeled_metadata(result) -> dict:
    event = next(e for e in result.asset_materializations_for_node("bridge_qrels"))
    return {name: value.value for name, value in event.metadata.items()}


def bridge_trust(lake) -> tuple[bool, bool]:
    with store.connect_read_only(location(lake)) as con:
        trust = debate_trust(con, DATASET, by_rule=trusted_by_rule(con, DATASET), bar=0.5)
    return trust.yes.trusted, trust.no.trusted
