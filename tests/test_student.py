"""The student annotator: what it learns from (verified labels only), its calibration, its
storage (retrained only when the labels change), the pipeline's student assets and the
student as a labeler on a gold set. Real MiniLM weights, tiny inputs, one short epoch."""

from __future__ import annotations

import math
import random
import time

import dagster as dg
import polars as pl
import pytest

from bridge_assets.cli.audit import audit_pair, format_story
from bridge_assets.cli.summary import run_summary
from bridge_assets.evaluation.scores import expected_calibration_error
from bridge_assets.labeling.labeler import LabelerError, LabelItem, build_labeler, pipeline_labeler
from bridge_assets.labeling.pairs import Pair
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.qrels.known_holes import KnownHoles
from bridge_assets.reports.system_sections import student_section
from bridge_assets.student import assets as student_assets
from bridge_assets.student.annotator import ensure_student, training_set
from bridge_assets.student.labeler import StudentLabelerSettings, query_folds
from bridge_assets.student.model import (
    CALIBRATION,
    ONE_CLASS_QUERY,
    SAMPLED_OUT,
    TRAIN,
    Example,
    Student,
    StudentError,
    StudentSettings,
    assign_splits,
    calibrate,
    split_by_query,
    train_student,
    untrainable,
    weights_hash,
)
from bridge_assets.student.prefilter import lake_study, threshold_table
from bridge_assets.student.threshold import held_out_pairs, reliability, threshold_retrieval
from fixtures.labeled_lake import DATASET, VERIFIED_LABELS, materialize_qrels, read
from fixtures.paths import lake_resources, location

TINY = StudentSettings(epochs=1, max_length=48, batch_size=8, calibration_share=0.34)


def _examples() -> list[Example]:
    """Six queries, each with a chunk that answers it and one about something else."""
    facts = [("What does len() return?", "len returns the number of items."),
             ("Which keyword defines a function?", "def defines a function."),
             ("What is the boiling point of water?", "Water boils at 100 degrees."),
             ("Who wrote Hamlet?", "Hamlet was written by Shakespeare."),
             ("What is the capital of France?", "Paris is the capital of France."),
             ("How many legs does a spider have?", "A spider has eight legs.")]
    examples = []
    for n, (query, chunk) in enumerate(facts):
        other = facts[(n + 3) % len(facts)][1]
        examples += [Example(f"q{n}", query, chunk, 1.0, "original"),
                     Example(f"q{n}", query, other, 0.0, "debate")]
    return examples


def _plant_pending_yes(lake) -> None:
    """The escalated pair nobody voted on gets a model's 'yes' guess (an adjudicator label)."""
    with store.connect(location(lake)) as con:
        con.execute("update debate_labels set adjudicator_label = 1 "
                    "where query_id = 'q2' and doc_id = 'd10'")


def test_training_set_holds_verified_labels_only(labeled_lake):
    _plant_pending_yes(labeled_lake)
    materialize_qrels(labeled_lake)
    pending = read(labeled_lake, "select unverified_label from bridge_qrels where source = 'pending'")
    assert pending["unverified_label"].to_list() == [1]  # the planted guess is in the qrels, apart
    with DuckDBStore(data_lake=str(labeled_lake)).snapshot(DATASET, ("bridge_qrels", "queries", "corpus")) as con:
        data = training_set(con, DATASET)
    got = {(q, d): (label, source) for q, d, label, source in data.labels.iter_rows()}
    assert ("q2", "d10") not in got
    assert got == {pair: (int(relevance > 0), source) for pair, (relevance, source) in VERIFIED_LABELS.items()}
    assert [(p.query_id, p.doc_id) for p in data.pairs] == list(got)
    assert {e.target for e in data.examples()} == {0.0, 1.0}
    assert {e.teacher for e in data.examples()} == {None}  # no teacher read: nothing distilled


def test_a_distilling_student_reads_the_debate_s_p_yes_of_verified_labels_only(labeled_lake):
    """The debate's P(yes) joins the labels it verified (consensus, or people's label of a pair
    the agents disagreed on); a pending pair's P(yes) and guess never reach the training set,
    and reading the teacher changes the training set's version (a new student)."""
    _plant_pending_yes(labeled_lake)
    materialize_qrels(labeled_lake)
    tables = ("bridge_qrels", "debate_labels", "queries", "corpus")
    with DuckDBStore(data_lake=str(labeled_lake)).snapshot(DATASET, tables) as con:
        plain, distilled = training_set(con, DATASET), training_set(con, DATASET, teacher=True)
        debated = {(q, d): p for q, d, p in con.execute(
            "select query_id, doc_id, p_yes from debate_labels where dataset = ?", [DATASET]).fetchall()}
    assert distilled.labels.drop("teacher").equals(plain.labels) and distilled.pairs == plain.pairs
    teacher = {(q, d): (source, p) for q, d, source, p
               in distilled.labels.select("query_id", "doc_id", "source", "teacher").iter_rows()}
    assert ("q2", "d10") not in teacher
    for pair, (source, p) in teacher.items():
        if source in ("debate", "human") and debated.get(pair) is not None:
            assert p == debated[pair]
        else:
            assert p is None, (pair, source)
    assert {source for source, p in teacher.values() if p is not None} >= {"debate", "human"}
    assert [e.teacher for e in distilled.examples()] == distilled.labels["teacher"].to_list()
    assert distilled.version != plain.version


def test_split_keeps_each_query_whole():
    train, held = split_by_query(_examples(), 0.34, seed=3)
    assert {e.query_id for e in train}.isdisjoint({e.query_id for e in held})
    assert len({e.query_id for e in held}) == 2 and len(train) + len(held) == 12


def test_only_contrast_queries_teach_and_max_labels_samples_each_class_up_to_half():
    # nq_open_mini's shape: many queries with one original positive each (outside the pool),
    # a few pooled queries with verified labels of both classes
    examples = [Example(f"solo{n}", "query", f"gold {n}", 1.0, "original") for n in range(200)]
    for n in range(16):
        examples += [Example(f"pool{n}", "query", f"chunk {n}.{i}", 1.0, "debate") for i in range(5)]
        examples.append(Example(f"pool{n}", "query", f"other {n}", 0.0, "filter"))
    settings = StudentSettings(max_labels=40, calibration_share=0.25, seed=1)
    parts = assign_splits(examples, settings)
    assert parts == assign_splits(examples, settings)  # seeded
    assert parts[:200] == [ONE_CLASS_QUERY] * 200
    train = [e for e, part in zip(examples, parts) if part == TRAIN]
    held = [e for e, part in zip(examples, parts) if part == CALIBRATION]
    assert len({e.query_id for e in held}) == 4 and len(held) == 24  # 4 of 16 queries, under the cap
    assert sum(e.target == 0.0 for e in train) == 12  # the rarer class whole
    assert sum(e.target == 1.0 for e in train) == 20  # the other up to half of max_labels
    assert parts.count(SAMPLED_OUT) == 60 - 20
    assert {e.query_id for e in train}.isdisjoint({e.query_id for e in held})
    assert set(parts) - {ONE_CLASS_QUERY, SAMPLED_OUT} == {TRAIN, CALIBRATION}
    assert set(assign_splits(_examples(), TINY)) == {TRAIN, CALIBRATION}  # nothing left out here


def test_no_student_without_a_query_labelled_both_ways():
    examples = [Example("q0", "query", "chunk", 0.0, "filter")] + \
        [Example(f"q{n}", "query", "chunk", 1.0, "original") for n in range(1, 4)]
    assert "no query has verified labels of both classes" in untrainable(examples, StudentSettings())
    with pytest.raises(StudentError, match="no query has verified labels of both classes"):
        train_student(examples, TINY)


def test_platt_calibration_repairs_an_overconfident_score():
    rng = random.Random(0)
    truth = [rng.random() for _ in range(2000)]
    labels = [int(rng.random() < p) for p in truth]
    # the score says the truth's log-odds three times over: far too sure of itself
    overconfident = [1 / (1 + math.exp(-3 * math.log(max(p, 1e-6) / max(1 - p, 1e-6)))) for p in truth]
    calibrator, how = calibrate(overconfident, labels)
    assert how == "platt"
    before = expected_calibration_error(labels, overconfident)
    after = expected_calibration_error(labels, [calibrator(p) for p in overconfident])
    assert after < before / 3 and after < 0.05
    assert calibrate(overconfident[:5], [1] * 5) == (calibrate([], [])[0], "identity (held-out labels of one class only)")


def test_a_student_needs_labels_of_both_classes():
    with pytest.raises(StudentError, match="both classes"):
        train_student([e for e in _examples() if e.target == 1.0], TINY)
    with pytest.raises(StudentError, match="no verified labels"):
        train_student([], TINY)


def test_student_is_stored_once_per_training_set(tmp_path):
    import polars as pl

    from bridge_assets.student.annotator import TrainingSet

    examples = _examples()
    data = TrainingSet(pl.DataFrame({"query_id": [e.query_id for e in examples],
                                     "doc_id": [f"d{i}" for i in range(len(examples))],
                                     "label": [int(e.target) for e in examples],
                                     "source": [e.source for e in examples]}),
                       [Pair(e.query_id, f"d{i}", e.query, (), e.chunk) for i, e in enumerate(examples)])
    first = ensure_student(tmp_path, "toy", data, TINY)
    again = ensure_student(tmp_path, "toy", data, TINY)
    assert first.trained_now and not again.trained_now
    assert (again.key, again.meta["weights_hash"]) == (first.key, weights_hash(first.folder))
    report = first.meta["report"]
    assert (report["examples"], report["relevant"], report["calibrated_on"]) == (12, 6, 4)
    assert report["sources"] == {"original": 6, "debate": 6}

    student = Student.load(first.folder)  # the saved student scores as the trained one did
    pairs = [(e.query, e.chunk) for e in examples[:4]]
    scores = student.score(pairs)
    assert all(0.0 < p < 1.0 for p in scores) and scores == Student.load(first.folder).score(pairs)

    flipped = TrainingSet(data.labels.with_columns(pl.when(pl.col("doc_id") == "d1").then(1)
                                                   .otherwise(pl.col("label")).alias("label")), data.pairs)
    changed = ensure_student(tmp_path, "toy", flipped, TINY)
    assert changed.trained_now and changed.key != first.key


def test_student_assets_train_once_and_score_the_whole_pool(labeled_lake, tmp_path):
    _plant_pending_yes(labeled_lake)
    materialize_qrels(labeled_lake)
    resources = lake_resources(labeled_lake)
    config = dg.RunConfig(ops={"student_annotator": student_assets.StudentConfig(
        # two contrast queries since the filter's drops are no training labels: one is held out
        epochs=1, max_length=48, batch_size=8, calibration_share=0.5)})
    assets = [student_assets.student_annotator, student_assets.student_scores]

    def materialize():
        result = dg.materialize(assets, partition_key=DATASET, resources=resources, run_config=config)
        assert result.success
        return result.asset_materializations_for_node("student_annotator")[0].metadata

    first, second = materialize(), materialize()
    assert first["trained_now"].value is True and second["trained_now"].value is False
    assert first["student_key"] == second["student_key"]
    row = read(labeled_lake, "select * from student_annotator").to_dicts()
    assert len(row) == 1 and row[0]["labels"] == len(VERIFIED_LABELS)
    assert row[0]["weights_hash"] == first["weights_hash"].value
    audit = read(labeled_lake, "select query_id, doc_id, split from student_training_set")
    assert ("q2", "d10") not in set(zip(audit["query_id"], audit["doc_id"], strict=True))
    # a query labelled one way only teaches no contrast: its labels are recorded, left out
    classes = {q: {int(relevance > 0) for (qq, _), (relevance, _) in VERIFIED_LABELS.items() if qq == q}
               for q, _ in VERIFIED_LABELS}
    one_class = {q for q, seen in classes.items() if len(seen) == 1}
    assert one_class and set(audit.filter(pl.col("split") == "one-class query")["query_id"]) == one_class
    assert set(audit.filter(pl.col("query_id").is_in(list(one_class)).not_())["split"]) == {"train", "calibration"}
    scores = read(labeled_lake, "select s.query_id, s.doc_id, s.p_relevant from student_scores s")
    pool = read(labeled_lake, "select distinct query_id, doc_id from candidate_pool")
    assert scores.height == pool.height
    held = set(audit.filter(pl.col("split") == "calibration")["query_id"])
    assert held and sorted(held) == row[0]["calibration_queries"]

    with store.connect(location(labeled_lake)) as con:  # the report's section, on the held-out queries
        tables = {name: con.execute(f"select * from {name}").pl()
                  for name in ("student_annotator", "student_scores", "bridge_qrels")}
    section = student_section(tables["student_annotator"], tables["student_scores"], tables["bridge_qrels"],
                              tmp_path)
    assert [t.title for t in section.tables] == ["The student", "Threshold retrieval against top-k (held-out queries)"]
    assert section.tables[1].rows[0][0] == "P >= 0.1" and f"the {len(held)} queries it held out" in section.intro
    left = len(VERIFIED_LABELS) - row[0]["trained_on"] - row[0]["calibrated_on"]
    assert f"{left} of its {len(VERIFIED_LABELS)} verified labels were left out" in " ".join(section.notes)
    chance = tables["student_annotator"].with_columns(held_out_auroc=pl.lit(0.5))
    notes = " ".join(student_section(chance, None, None, tmp_path).notes)
    assert "held-out AUROC is 0.50: it orders those pairs no better than chance" in notes
    if row[0]["held_out_auroc"] > 0.5:  # the note only where it holds
        assert "no better than chance" not in " ".join(section.notes)
    assert (tmp_path / "student_reliability.png").exists()
    assert scores["p_relevant"].is_between(0, 1).all()
    with store.connect(location(labeled_lake)) as con:
        summary = run_summary(con, DATASET, time.time())
    left_out = audit.filter(pl.col("split") == "one-class query").height
    assert (f"student annotator {first['student_key'].value}: trained on {row[0]['trained_on']} and "
            f"calibrated on {row[0]['calibrated_on']} of {len(VERIFIED_LABELS)} verified labels "
            f"({row[0]['relevant']} relevant; left out: {left_out} of queries labelled one way only)") in summary
    assert row[0]["held_out_auroc"] is not None and f"held-out AUROC {row[0]['held_out_auroc']:.2f}" in summary
    assert f"scores {pool.height} pool pairs" in summary

    with store.connect(location(labeled_lake)) as con:  # the audit names the student
        learned, unlearned = audit_pair(con, DATASET, "q1", "d5"), audit_pair(con, DATASET, "q2", "d10")
    assert learned["student"]["student"]["weights_hash"] == first["weights_hash"].value
    split = learned["student"]["learned_from_pair"]["split"]
    assert learned["student"]["learned_from_pair"] == {"label": 1, "source": "debate", "split": split,
                                                       "teacher": None}
    assert unlearned["student"]["learned_from_pair"] is None  # the pending pair: scored, never learned
    text = format_story(learned)
    assert f"student {first['student_key'].value} (weights {first['weights_hash'].value}), trained on " \
           f"{row[0]['trained_on']} and calibrated on {row[0]['calibrated_on']} of {len(VERIFIED_LABELS)} " \
           "verified labels" in text

    # distilling (a Materialize with teacher_weight): another student, whose training set and
    # audit carry the debate's P(yes) of the labels it trained on
    config = dg.RunConfig(ops={"student_annotator": student_assets.StudentConfig(
        epochs=1, max_length=48, batch_size=8, calibration_share=0.25, teacher_weight=0.5)})
    distilled = materialize()
    assert distilled["trained_now"].value is True and distilled["student_key"] != first["student_key"]
    teacher = read(labeled_lake, "select t.source, t.teacher, d.p_yes from student_training_set t "
                                 "left join debate_labels d using (dataset, query_id, doc_id)")
    assert teacher.filter(pl.col("source") == "debate")["teacher"].to_list() == \
        teacher.filter(pl.col("source") == "debate")["p_yes"].to_list()
    assert teacher.filter(pl.col("source").is_in(["original", "filter"]))["teacher"].is_null().all()
    # the audit says so for a label it trained on, and not for one it only calibrated on
    rows = read(labeled_lake, "select query_id, doc_id, split, teacher from student_training_set "
                              "where teacher is not null and split in ('train', 'calibration')")
    assert "train" in rows["split"].to_list()
    with store.connect(location(labeled_lake)) as con:
        for query_id, doc_id, part, p_yes in rows.iter_rows():
            text = format_story(audit_pair(con, DATASET, query_id, doc_id))
            assert (f"distilled with the debate's P(yes) {p_yes:.2f}" in text) == (part == "train")


def test_a_sampled_student_says_what_it_left_out(labeled_lake):
    materialize_qrels(labeled_lake)
    config = dg.RunConfig(ops={"student_annotator": student_assets.StudentConfig(
        epochs=1, max_length=48, batch_size=8, calibration_share=0.25, max_labels=4)})
    result = dg.materialize([student_assets.student_annotator, student_assets.student_scores],
                            partition_key=DATASET, resources=lake_resources(labeled_lake),
                            run_config=config)
    assert result.success
    row = read(labeled_lake, "select * from student_annotator").to_dicts()[0]
    splits = read(labeled_lake, "select query_id, doc_id, split from student_training_set")
    assert row["trained_on"] == splits.filter(pl.col("split") == "train").height <= 4
    assert row["calibrated_on"] == splits.filter(pl.col("split") == "calibration").height <= 4
    left_out = splits.filter(pl.col("split") == "sampled out")
    one_class = splits.filter(pl.col("split") == "one-class query")
    assert left_out.height == len(VERIFIED_LABELS) - row["trained_on"] - row["calibrated_on"] - one_class.height > 0
    with store.connect(location(labeled_lake)) as con:
        summary = run_summary(con, DATASET, time.time())
        sampled_out = audit_pair(con, DATASET, left_out["query_id"][0], left_out["doc_id"][0])
        one_way = audit_pair(con, DATASET, one_class["query_id"][0], one_class["doc_id"][0])
    assert (f"trained on {row['trained_on']} and calibrated on {row['calibrated_on']} of "
            f"{len(VERIFIED_LABELS)} verified labels ({row['relevant']} relevant; left out: "
            f"{one_class.height} of queries labelled one way only, {left_out.height} past max_labels)") in summary
    assert "was left out by the max_labels sample" in format_story(sampled_out)
    assert "its query's verified labels being all of one class" in format_story(one_way)


def test_student_labeler_scores_every_pair_out_of_fold():
    examples = _examples()
    items = [LabelItem(str(i), Pair(e.query_id, f"d{i}", e.query, (), e.chunk), int(e.target))
             for i, e in enumerate(examples)]
    folds = query_folds(items, 2, seed=0)
    assert all(folds[i] == folds[i + 1] for i in range(0, len(items), 2))  # a query stays in its fold
    labeler = build_labeler({"labeler": "student", "epochs": 1, "max_length": 48, "batch_size": 8},
                            profiles_for=lambda role: [])
    run = labeler.label(items, generate=None)
    assert [label.outcome for label in run.labels] == ["vote"] * len(items)  # a score is no verified label
    assert all(0 < p < 1 for p in run.scores)
    assert [f["trained_on"] + f["calibrated_on"] for f in run.extra["folds"]] == [6, 6]
    assert run.extra["scored"] == len(items) and run.extra["auroc"] is not None
    with pytest.raises(LabelerError, match="known labels"):
        pipeline_labeler(labeler.settings, lambda role: [], "binary")
    with pytest.raises(LabelerError, match="no LLM without a teacher"):  # a profile is a teacher
        build_labeler({"labeler": "student", "models": ["qwen-0.5b"]}, profiles_for=lambda role: [])


def test_threshold_retrieval_by_hand():
    """q1: d1 .9 relevant, d2 .6 not, d3 .2 relevant; q2: d4 .8 pending (no verified label),
    d5 .1 not. A pending pair counts as not relevant; recall is over queries with a relevant
    pair, precision over queries that retrieve something."""
    scores = pl.DataFrame({"query_id": ["q1", "q1", "q1", "q2", "q2", "q3"],
                           "doc_id": ["d1", "d2", "d3", "d4", "d5", "d6"],
                           "p_relevant": [0.9, 0.6, 0.2, 0.8, 0.1, 0.99]})
    qrels = pl.DataFrame({"query_id": ["q1", "q1", "q1", "q2", "q2", "q3"],
                          "doc_id": ["d1", "d2", "d3", "d4", "d5", "d6"],
                          "relevance": [1, 0, 2, None, 0, 1], "verified": [True, True, True, False, True, True]})
    pairs = held_out_pairs(scores, qrels, ["q1", "q2"])  # q3 was trained on: left out
    assert pairs.height == 5 and pairs.filter(pl.col("judged"))["doc_id"].sort().to_list() == ["d1", "d2", "d3", "d5"]
    rows = {r["rule"]: r for r in threshold_retrieval(pairs, thresholds=(0.5,), top_k=(1,)).iter_rows(named=True)}
    assert rows["P >= 0.5"] == {"rule": "P >= 0.5", "queries": 2, "retrieved_per_query": 1.5, "recall": 0.5,
                                "recall_queries": 1, "precision": 0.25, "precision_queries": 2}
    assert rows["top-1"] == {"rule": "top-1", "queries": 2, "retrieved_per_query": 1.0, "recall": 0.5,
                             "recall_queries": 1, "precision": 0.5, "precision_queries": 2}
    assert [b["cases"] for b in reliability(pairs)] == [1, 1, 1, 1]  # the judged ones only


def test_prefilter_threshold_table_by_hand():
    rows = threshold_table([0.01, 0.08, 0.15, 0.6, 0.9], [False, True, False, True, True], (0.1, 0.2, 0.95))
    assert [(r.skipped, r.relevant_lost, r.relevant) for r in rows] == [(2, 1, 3), (3, 1, 3), (5, 3, 3)]
    assert rows[0].skipped_share == pytest.approx(0.4) and rows[0].lost_share == pytest.approx(1 / 3)
    low, high = rows[0].lost_ci
    assert low < 1 / 3 < high and rows[2].lost_ci[1] == pytest.approx(1.0)


def test_prefilter_lake_study_scores_the_filtered_pairs_out_of_fold(labeled_lake):
    # people audited one of the filter's drops (q3/d12: not relevant): a verified negative of q3,
    # so each fold of queries holds both classes (an unaudited drop teaches nothing)
    with store.connect(location(labeled_lake)) as con:
        con.execute("insert into human_labels (dataset, query_id, doc_id, label, votes, votes_relevant, agreement) "
                    f"values ('{DATASET}', 'q3', 'd12', 0, 3, 0, 1.0)")
    materialize_qrels(labeled_lake)
    settings = StudentLabelerSettings(labeler="student", epochs=1, max_length=48, batch_size=8)
    tables = ("bridge_qrels", "filtered_pool", "filter_votes", "queries", "corpus")
    holes = KnownHoles(holes={"q1": frozenset({"d5"}), "q3": frozenset({"d7"})}, partial={})
    with DuckDBStore(data_lake=str(labeled_lake)).snapshot(DATASET, tables) as con:
        study = lake_study(con, DATASET, holes, settings, thresholds=(0.5, 1.0))
        seen = con.execute("select count(*) from filtered_pool").fetchone()[0]
    assert [row.pairs for row in study.rows] == [seen, seen]
    assert study.rows[1].skipped == seen and study.rows[1].relevant_lost == 2  # below 1.0: all
    assert study.filter_models >= 1 and len(study.folds) == 2


def test_label_eval_runs_the_student_on_a_gold_file(tmp_path, data_lake):
    import json

    from typer.testing import CliRunner

    from bridge_assets.cli.main import app

    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": f"t{i}", "query": e.query, "answers": [], "chunk": e.chunk,
                                        "label": int(e.target)}) + "\n" for i, e in enumerate(_examples())))
    out = CliRunner().invoke(app, ["label-eval", "--gold", str(gold), "--method", "student", "--set", "epochs=1",
                                   "--set", "max_length=48", "--set", "batch_size=8", "--json",
                                   "--reliability", str(tmp_path / "reliability.png")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "reliability.png").read_bytes()[:4] == b"\x89PNG"  # the diagram of its P(relevant)
    figures = json.loads(out.output[out.output.index("{"):])
    assert (figures["n"], figures["calls"], figures["escalated"]) == (12, 0, 0)
    assert figures["auroc"] is not None and 0.0 <= figures["ece"] <= 1.0
    assert figures["config"]["epochs"] == 1 and figures["config_hash"]


def test_the_uncalibrated_score_is_the_sigmoid_of_the_relevance_logit():
    """(once, not twice: the CrossEncoder's default activation is itself a sigmoid)"""
    import torch

    from bridge_assets.student.model import _cross_encoder, base_model_location, encoder_probabilities

    model = _cross_encoder(base_model_location(TINY.base_model), TINY.max_length)
    pairs = [("What does len() return?", "len returns the number of items."), ("Who wrote Hamlet?", "Paris.")]
    with torch.no_grad():
        features = model.tokenizer([q for q, _ in pairs], [c for _, c in pairs], padding=True, return_tensors="pt")
        logits = model.model(**features).logits.view(-1).tolist()
    assert encoder_probabilities(model, pairs) == pytest.approx([1 / (1 + math.exp(-z)) for z in logits], abs=1e-5)


def test_a_dataset_without_negative_labels_gets_no_student_and_says_why(labeled_lake):
    materialize_qrels(labeled_lake)
    with store.connect(location(labeled_lake)) as con:  # every verified label relevant
        con.execute("delete from bridge_qrels where relevance = 0")
    result = dg.materialize([student_assets.student_annotator, student_assets.student_scores],
                            partition_key=DATASET, resources=lake_resources(labeled_lake))
    assert result.success  # the rest of the pipeline goes on
    row = read(labeled_lake, "select student_key, not_trained, labels from student_annotator").to_dicts()
    assert row[0]["student_key"] is None and "both classes" in row[0]["not_trained"]
    assert read(labeled_lake, "select count(*) as n from student_scores")["n"][0] == 0
    with store.connect(location(labeled_lake)) as con:
        summary = run_summary(con, DATASET, time.time())
        story = audit_pair(con, DATASET, "q1", "d5")
    assert f"student annotator: none (it needs verified labels of both classes (relevant and not); " \
           f"{row[0]['labels']} verified labels, {row[0]['labels']} relevant)" in summary
    assert "no student annotator for this dataset: it needs verified labels of both classes" in format_story(story)


def test_auto_precision_is_bfloat16_only_where_the_cpu_lists_it(tmp_path, monkeypatch):
    from bridge_assets.student import model as student_model

    reads_flags = student_model.cpu_has_bfloat16
    for n, (flags, native) in enumerate([("fpu sse2 avx2 avx512f avx512_bf16", True),
                                         ("fpu avx2 amx_bf16 amx_tile", True),
                                         ("fpu sse2 avx2 avx512f avx512_vnni", False)]):
        cpuinfo = tmp_path / f"cpuinfo{n}"  # one listing per path: the CPU does not change (cached)
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
        assert reads_flags(cpuinfo) is native
        monkeypatch.setattr(student_model, "cpu_has_bfloat16", lambda: native)
        assert student_model.scoring_precision("auto") == ("bfloat16" if native else "float32")
        assert [student_model.scoring_precision(p) for p in ("float32", "bfloat16")] == ["float32", "bfloat16"]
    assert reads_flags(tmp_path / "no such file") is False


def test_bfloat16_scores_are_computed_in_bfloat16_and_stay_close_to_float32():
    """The precision reaches the encoder (the scores move), and moves them little; a student
    records what its calibration was scored in."""
    from bridge_assets.student.model import _cross_encoder, base_model_location, encoder_probabilities

    model = _cross_encoder(base_model_location(TINY.base_model), TINY.max_length)
    pairs = [(e.query, e.chunk) for e in _examples()]
    full = encoder_probabilities(model, pairs, precision="float32")
    half = encoder_probabilities(model, pairs, precision="bfloat16")
    assert half != full and half == pytest.approx(full, abs=0.02)
    for precision in ("float32", "bfloat16"):
        student = train_student(_examples(), TINY.model_copy(update={"precision": precision}))
        assert student.report.precision == precision


def test_every_door_trains_and_scores_with_the_same_student_settings():
    """A Materialize with no run config (StudentConfig), `bridge run` and label-eval
    (StudentLabelerSettings) start from StudentSettings' defaults, precision included."""
    assert set(student_assets.StudentConfig.model_fields) == set(StudentSettings.model_fields)
    assert student_assets.StudentConfig().settings() == StudentSettings()
    assert StudentLabelerSettings().student() == StudentSettings()


def test_a_training_step_drops_the_last_step_s_gradients_before_its_forward_pass(monkeypatch):
    """They would sit beside the forward pass's activations, the training's peak memory."""
    from bridge_assets.student import model as student_model

    held = []
    real = student_model._cross_encoder

    def with_a_probe(location, max_length):
        encoder = real(location, max_length)
        network = encoder.model

        def probe(module, inputs):
            if network.training:
                held.append(sum(p.grad is not None for p in network.parameters()))
        network.register_forward_pre_hook(probe)
        return encoder

    monkeypatch.setattr(student_model, "_cross_encoder", with_a_probe)
    train_student(_examples(), StudentSettings(epochs=2, max_length=32, batch_size=4, calibration_share=0.34))
    assert len(held) == 4  # 8 training pairs, 2 steps an epoch, 2 epochs
    assert held == [0, 0, 0, 0]


def test_a_teacher_s_p_yes_is_mixed_into_the_target_at_its_weight():
    labelled = Example("q", "query", "chunk", 1.0, "gold", teacher=0.2)
    assert labelled.training_target(0.0) == 1.0
    assert labelled.training_target(0.5) == pytest.approx(0.6)
    assert labelled.training_target(1.0) == pytest.approx(0.2)
    assert Example("q", "query", "chunk", 0.0, "gold").training_target(1.0) == 0.0  # no teacher: its label


def test_students_without_a_teacher_keep_the_keys_they_had_before_distillation_and_low_memory():
    import hashlib
    import json

    from bridge_assets.student.annotator import student_key

    base = {"entry": "all-minilm-l6-v2"}
    before = {k: v for k, v in StudentSettings().model_dump().items() if k not in ("teacher_weight", "low_memory")}
    old_key = hashlib.sha256(json.dumps({"training_set": "v1", "settings": before, "base": base},
                                        sort_keys=True).encode()).hexdigest()[:16]
    assert student_key("v1", StudentSettings(), base) == old_key
    assert student_key("v1", StudentSettings(teacher_weight=0.5), base) != old_key


def test_a_student_distils_its_teacher_s_p_yes_of_its_training_folds_only(monkeypatch):
    """Each fold's student learns from the teacher's P(yes) of the other folds' pairs (never of
    a pair it scores); a pair the teacher failed keeps its gold label alone."""
    from bridge_assets.labeling.pointwise import PointwiseScore
    from bridge_assets.student import labeler as student_labeler

    examples = _examples()
    items = [LabelItem(str(i), Pair(e.query_id, f"d{i}", e.query, (), e.chunk), int(e.target))
             for i, e in enumerate(examples)]
    teacher = {item.id: (None if n == 3 else 0.1 + 0.05 * n) for n, item in enumerate(items)}
    asked = []

    def scripted_teacher(triplets, model, generate, **kwargs):  # stands in for the LLM's P(yes)
        asked.append((model, len(triplets)))
        return [PointwiseScore(None if teacher[t.id] is None else 1, teacher[t.id], f"k{t.id}", None)
                for t in triplets]

    trained = []
    real_train = student_labeler.train_student

    def recording(train, settings):
        trained.append((train, settings))
        return real_train(train, settings)

    monkeypatch.setattr(student_labeler, "score_triplets", scripted_teacher)
    monkeypatch.setattr(student_labeler, "train_student", recording)
    labeler = build_labeler({"labeler": "student", "epochs": 1, "max_length": 48, "batch_size": 8,
                             "teacher_weight": 0.5, "models": ["qwen-1.5b"]}, profiles_for=lambda role: [])
    run = labeler.label(items, generate=None)
    assert asked == [("qwen-1.5b", len(items))]
    assert run.models == ["qwen-1.5b"] and run.extra["teacher_scored"] == len(items) - 1
    folds = query_folds(items, 2, seed=0)
    by_text = {(item.query, item.chunk): (n, item) for n, item in enumerate(items)}
    assert len(trained) == 2
    for fold, (train, settings) in enumerate(trained):
        assert settings.teacher_weight == 0.5
        for example in train:
            n, item = by_text[(example.query, example.chunk)]
            assert folds[n] != fold                      # never a pair of the fold it scores
            assert (example.target, example.teacher) == (float(item.gold), teacher[item.id])


def test_low_memory_trains_the_same_weights_recomputing_each_layer(monkeypatch):
    """low_memory trades time for memory only (docs/student.md measures both): the weights are
    bit for bit those of the ordinary training, each layer is recomputed in the backward pass,
    and it is no part of the student's key."""
    import torch.utils.checkpoint

    from bridge_assets.student.annotator import student_key
    from bridge_assets.student.model import base_model_location, train_encoder

    recomputed = []
    real_checkpoint = torch.utils.checkpoint.checkpoint

    def counting(function, *args, **kwargs):
        recomputed.append(function)
        return real_checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting)
    settings = StudentSettings(epochs=1, max_length=32, batch_size=4, calibration_share=0.34)
    location = base_model_location(settings.base_model)
    weights = []
    for low_memory in (False, True):
        encoder = train_encoder(_examples()[:8], settings.model_copy(update={"low_memory": low_memory}), location)
        weights.append({name: tensor.clone() for name, tensor in encoder.model.state_dict().items()})
    assert len(recomputed) == 2 * 6  # two steps, each of MiniLM's six layers, only when asked
    assert weights[0].keys() == weights[1].keys()
    assert all(weights[0][name].equal(weights[1][name]) for name in weights[0])
    assert student_key("v", settings, {}) == student_key("v", settings.model_copy(update={"low_memory": True}), {})
