"""A small TREC collection end to end on the graded scale, built from SciFact: claims written as
<top> topics with a <desc> and a <narr> and no answers, SciFact's judgments mapped to grades,
runs of two systems. Graded labels flow from the debate (a scripted model behind the real LLM
client) through people's votes on the annotation page to bridge_qrels and nDCG, and every
labeling prompt judges by the topic's narrative.

Grades from SciFact's judgments: a judged abstract with two or more rationale sentences is 3
(perfectly relevant), with one is 2, a cited abstract without rationale is 1 (related); another
claim's evidence is judged 0 for claim 3.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

import dagster as dg
import pytest
import pytrec_eval

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.assets import human_labels
from bridge_assets.ingest import assets as ingest_assets
from bridge_assets.labeling import assets as labeling_assets
from bridge_assets.lake import store
from bridge_assets.qrels.assets import bridge_qrels
from fixtures.human_app import login, make_client, post_answer, served_pair
from fixtures.labeling import write_run
from fixtures.paths import annotations, lake_resources, location, shared_data
from fixtures.scripted_llm import ScriptedLLM, ScriptedServer, completion

# The registry folder's entry replaces the shipped `demo`, so the assets' `demo` partition is
# this collection.
DATASET = "demo"
TOPICS = ("1", "3", "5")
DESCRIPTION = "Find abstracts that report evidence for or against the claim: {claim}"
NARRATIVE = ("A relevant abstract reports results that support or refute the claim {id}; an "
             "abstract on the same subject without such results is related at best.")
JUDGED = {("1", "31715818"): 1, ("3", "14717500"): 3, ("5", "13734012"): 2, ("3", "13734012"): 0}
OTHER_DOCS = ("1606628", "5152028", "11705328", "18174210", "5953485", "12580014")
RUNS = {"sys_a": {"1": ["31715818", "1606628", "5152028"], "3": ["14717500", "13734012", "18174210"],
                  "5": ["13734012", "5953485", "12580014"]},
        "sys_b": {"1": ["1606628", "31715818", "11705328"], "3": ["18174210", "14717500", "5953485"],
                  "5": ["12580014", "13734012", "1606628"]}}
# The scripted agents' grades per unjudged pair: (round 1 A, B), (round 2 A, B); a string is a
# reply that is not JSON (a failed turn).
DEBATE = {("1", "1606628"): [(2, 2)], ("1", "5152028"): [(3, 2)], ("1", "11705328"): [(0, 0)],
          ("3", "18174210"): [(3, 0), (3, 1)], ("3", "5953485"): [(1, 0)],
          ("5", "5953485"): [(3, 1), (3, 3)], ("5", "12580014"): [("no idea", 1)]}
FILTERED_OUT = {("5", "1606628")}
VOTES = {("3", "18174210"): {"ann": 2, "bob": 3, "cat": 1}, ("5", "12580014"): {"ann": 0, "bob": 0, "cat": 1}}
# A topic's narrative is no short answer: the debate's consensus is provisional until people's
# grades on its calibration sample (here every consensus pair) show it right, and the filter's
# drop is audited (tests/test_relevance_definition.py has the rule; here people agree).
CONSENSUS = {("1", "1606628"): 2, ("1", "5152028"): 2, ("1", "11705328"): 0, ("3", "5953485"): 0,
             ("5", "5953485"): 3}
REFINED = {**JUDGED, ("1", "1606628"): 2, ("1", "5152028"): 2, ("1", "11705328"): 0,
           ("3", "18174210"): 2, ("3", "5953485"): 0, ("5", "5953485"): 3, ("5", "12580014"): 0,
           ("5", "1606628"): 0}


def write_collection(folder) -> dict[str, str]:
    """corpus.jsonl, topics.txt, qrels.txt and datasets.yaml in `folder`; returns the claims."""
    scifact = shared_data("scifact")
    claims = {q["_id"]: q["text"] for q in map(json.loads, (scifact / "queries.jsonl").open())
              if q["_id"] in TOPICS}
    docs = {doc_id for _, doc_id in JUDGED} | set(OTHER_DOCS)
    with (folder / "corpus.jsonl").open("w") as out:
        for line in (scifact / "corpus.jsonl").open():
            if json.loads(line)["_id"] in docs:
                out.write(line)
    rationale = defaultdict(int)
    for record in map(json.loads, (scifact / "evidence_rationales.jsonl").open()):
        rationale[(record["query_id"], record["doc_id"])] += len(record["sentence_idx"])
    grades = {}
    for line in list((scifact / "qrels" / "test.tsv").open())[1:]:
        query_id, doc_id, _ = line.split()
        if query_id in TOPICS:
            n = rationale[(query_id, doc_id)]
            grades[(query_id, doc_id)] = 3 if n >= 2 else 2 if n == 1 else 1
    assert grades == {pair: grade for pair, grade in JUDGED.items() if grade}
    grades[("3", "13734012")] = 0  # claim 5's evidence
    (folder / "qrels.txt").write_text("".join(f"{q} 0 {d} {g}\n" for (q, d), g in sorted(grades.items())))
    # the <num>N</num> form, whose closing tag once became part of the id
    (folder / "topics.txt").write_text("".join(
        f"<top>\n<num>{q}</num>\n<title> {claims[q]}\n<desc> Description:\n"
        f"{DESCRIPTION.format(claim=claims[q])}\n<narr> Narrative:\n{NARRATIVE.format(id=q)}\n</top>\n\n"
        for q in TOPICS))
    (folder / "datasets.yaml").write_text(
        f"datasets:\n  {DATASET}:\n    kind: trec\n    corpus: corpus.jsonl\n    topics: topics.txt\n"
        "    qrels: qrels.txt\n    label_scale: graded\n")
    return claims


class Script:
    """The models: the filter drops FILTERED_OUT, the agents grade as DEBATE says, the
    adjudicator says 3. Each request's texts are kept."""

    def __init__(self, claims: dict[str, str], titles: dict[str, str]):
        self.topic = {claim: query_id for query_id, claim in claims.items()}
        self.doc = titles
        self.users: list[tuple[str, str, str]] = []  # (purpose, topic, user message)

    def __call__(self, index: int, body: dict):
        system, user = (m["content"] for m in body["messages"])
        pair = (self.topic[re.search(r"^Query: (.*)$", user, re.M).group(1)],
                self.doc[user.split("<<<\n", 1)[1].split("\n", 1)[0]])
        if '"is_supported"' in system:
            self.users.append(("filter", pair[0], user))
            return 200, completion(json.dumps({"is_supported": pair not in FILTERED_OUT})), 0
        if "adjudicator" in system:
            self.users.append(("adjudicator", pair[0], user))
            return 200, completion(json.dumps({"reason": "weighed", "grade": 3})), 0
        agent = re.search(r"You are agent (\w)", user).group(1)
        round_number = int(re.search(r"This is round (\d)", user).group(1))
        self.users.append(("debate", pair[0], user))
        grade = DEBATE[pair][round_number - 1]["AB".index(agent)]
        if isinstance(grade, str):
            return 200, completion(grade), 0
        return 200, completion(json.dumps({"reference": [], "reason": f"{agent} {round_number}",
                                           "grade": grade})), 0


def materialize(lake, assets, run_config=None, *, succeeds: bool = True, **resources):
    result = dg.materialize(assets, partition_key=DATASET, run_config=run_config or {},
                            resources=lake_resources(lake, **resources),
                            raise_on_error=False)
    assert result.success == succeeds
    return result


def rows(lake, sql: str) -> list[tuple]:
    with store.connect(location(lake)) as con:
        return con.execute(sql).fetchall()


def assert_metrics(lake, version: str, qrels: dict[tuple[str, str], int]) -> None:
    """retrieval_metrics of `version` against pytrec_eval on `qrels` at relevance level 2."""
    truth = defaultdict(dict)
    for (query_id, doc_id), grade in qrels.items():
        truth[query_id][doc_id] = grade
    evaluator = pytrec_eval.RelevanceEvaluator(dict(truth), {"ndcg_cut.3", "P.3"}, relevance_level=2)
    for system, ranked in RUNS.items():
        run = {q: {d: float(10 - rank) for rank, d in enumerate(docs)} for q, docs in ranked.items()}
        expected = evaluator.evaluate(run)
        values = {(q, m): v for q, m, v in rows(lake, f"""
            select query_id, measure, value from retrieval_metrics where retriever = '{system}'
              and qrels_version = '{version}' and query_id <> 'all'""")}
        for query_id in TOPICS:
            assert values[(query_id, "ndcg_cut_3")] == pytest.approx(expected[query_id]["ndcg_cut_3"])
            assert values[(query_id, "P_3")] == pytest.approx(expected[query_id]["P_3"])
            holes = sum(qrels.get((query_id, d), 0) >= 2 and (query_id, d) not in JUDGED
                        for d in ranked[query_id])
            assert values[(query_id, "hole_3")] == pytest.approx(holes / 3)


def test_graded_labels_of_a_trec_collection_flow_to_qrels_and_ndcg(data_lake, tmp_path, monkeypatch):
    registry = tmp_path / "registry"
    registry.mkdir()
    claims = write_collection(registry)
    monkeypatch.setenv("BRIDGE_REGISTRY_DIR", str(registry))
    materialize(data_lake, [ingest_assets.ingest_dataset])
    assert rows(data_lake, "select query_id, len(answers), narrative from queries order by 1") == \
        [(q, 0, NARRATIVE.format(id=q)) for q in TOPICS]
    for system, ranked in RUNS.items():
        write_run(data_lake, system, ranked)
    titles = {title: doc_id for doc_id, title in rows(data_lake, "select doc_id, title from corpus")}

    script = Script(claims, titles)
    debate = {"reason_words": 20, "grade_consensus": "within_one", "adjudicate": True}
    with ScriptedServer(script) as server:
        llm = ScriptedLLM(data_lake=str(data_lake), url=server.url, debate="agent", adjudicator="adj")
        materialize(data_lake, [labeling_assets.candidate_pool, labeling_assets.filter_pool,
                                labeling_assets.debate], {"ops": {
            "candidate_pool": {"config": {"depth": 3}},
            "filter_pool": {"config": {"models": ["f1"]}},
            "debate": {"config": debate}}}, llm=llm)
        # the worked examples answer yes/no: refused on a graded dataset
        refused = materialize(data_lake, [labeling_assets.debate],
                              {"ops": {"debate": {"config": {**debate, "fewshot": True}}}},
                              succeeds=False, llm=llm)
    assert "worked examples" in str(refused.get_step_failure_events()[0].event_specific_data.error)

    # every prompt judged by the topic's description and narrative, never by absent answers
    assert {purpose for purpose, _, _ in script.users} == {"filter", "debate", "adjudicator"}
    for purpose, topic, user in script.users:
        assert f"Narrative (what counts as relevant): {NARRATIVE.format(id=topic)}" in user, purpose
        assert "Reference answers" not in user, purpose
    labels = {(q, d): (outcome, label, adjudicator)
              for q, d, outcome, label, adjudicator in rows(data_lake, """
                  select query_id, doc_id, outcome, label, adjudicator_label from debate_labels""")}
    assert labels == {
        ("1", "1606628"): ("consensus", 2, None), ("1", "5152028"): ("consensus", 2, None),  # 3 and 2: the lower
        ("1", "11705328"): ("consensus", 0, None), ("3", "5953485"): ("consensus", 0, None),
        ("5", "5953485"): ("consensus", 3, None), ("3", "18174210"): ("escalated", None, 3),
        ("5", "12580014"): ("failed", None, 3)}
    assert rows(data_lake, "select distinct response from debate_turns where response is not null "
                           "order by 1") == [("0",), ("1",), ("2",), ("3",)]

    # while people have not voted, the upper bound takes the escalated pairs at the top grade
    metrics = {"ops": {"retrieval_metrics": {"config": {"k": 3, "relevance_level": 2}}}}
    materialize(data_lake, [bridge_qrels])
    materialize(data_lake, [analysis_assets.retrieval_metrics], metrics)
    assert_metrics(data_lake, "refined_upper", {**REFINED, **{pair: 3 for pair in (*VOTES, *CONSENSUS)}})

    # people grade the two escalated pairs, the calibration sample and the audited drop on the
    # annotation page
    with annotations() as con:
        tokens = {name: add_annotator(con, name) for name in ("ann", "bob", "cat")}
    for name, token in tokens.items():
        client = make_client(data_lake, graded=(DATASET,))
        login(client, token)
        while 'id="vote-form"' in (page := client.get("/annotate").text):
            query_id, doc_id, _ = served_pair(data_lake, page)
            assert f'<p id="narrative">{NARRATIVE.format(id=query_id)}</p>' in page
            assert 'id="scale"' in page and ("says: grade" in page) == ((query_id, doc_id) in DEBATE)
            grade = VOTES[(query_id, doc_id)][name] if (query_id, doc_id) in VOTES else \
                CONSENSUS.get((query_id, doc_id), 0)
            assert post_answer(client, page, grade).status_code == 303
    with annotations() as con:
        assert con.execute("select count(*), max(label) from human_votes").fetchall() == [(24, 3)]

    materialize(data_lake, [human_labels])
    assert rows(data_lake, "select query_id, doc_id, label from human_labels order by 1, 2") == sorted(
        [("3", "18174210", 2), ("5", "12580014", 0),  # the median grades
         *((q, d, grade) for (q, d), grade in CONSENSUS.items()), ("5", "1606628", 0)])
    materialize(data_lake, [bridge_qrels])
    qrels = {(q, d): relevance for q, d, relevance in rows(
        data_lake, "select query_id, doc_id, relevance from bridge_qrels")}
    assert qrels == REFINED
    materialize(data_lake, [analysis_assets.retrieval_metrics], metrics)

    # nDCG takes the grades as gains; P and Hole count grades of 2 and up (trec_eval -l 2)
    assert_metrics(data_lake, "refined", REFINED)
