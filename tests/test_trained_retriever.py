"""Retrievers trained on the labels (bridge_assets/student/retriever.py, issue 25 item 3): the
trained weights are reproducible from the seed, only verified labels become positives, and
the query split never lets a test query into training."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest

from bridge_assets.student import retriever as tr
from bridge_assets.student.retriever_data import (
    LakeData,
    TrainedRetrieverError,
    TrainSettings,
    load_lake_data,
    pool_pairs,
    query_folds,
    sample_queries,
    training_queries,
    utility_positives,
)
from bridge_assets.student.retriever_training import (
    TrainingLog,
    _embed,
    base_location,
    cached_gradient_step,
    load_encoder,
    multi_positive_loss,
    train_retriever,
    weights_digest,
)

DATASET = "toy"
QUERIES = {f"q{i}": text for i, text in enumerate([
    "what does len return", "which keyword defines a function", "what is the default recursion limit",
    "what does zip return", "how to open a file", "what is a list comprehension"])}
CORPUS = {f"d{i}": text for i, text in enumerate([
    "len returns the number of items of a container", "def starts a function definition",
    "the default recursion limit is 1000", "zip returns an iterator of tuples",
    "open returns a file object", "a list comprehension builds a list from an iterable",
    "sorted returns a new sorted list", "lambda makes an anonymous function",
    "sys.setrecursionlimit changes the limit", "enumerate yields index and value pairs",
    "classes bundle data and behaviour", "modules hold definitions and statements"])}
ORIGINAL = [(f"q{i}", f"d{i}", 1) for i in range(6)]
# (query, doc, relevance, source, verified): a debate hole, a human hole, and a pending pair
# whose unverified guess says "yes" (q2/d8): it must never become a positive
REFINED = [*((q, d, r, "original", True) for q, d, r in ORIGINAL),
           ("q1", "d7", 1, "debate", True), ("q3", "d9", 1, "human", True),
           ("q2", "d8", None, "pending", False), ("q0", "d6", 0, "filter", True)]


def toy_lake() -> duckdb.DuckDBPyConnection:
    """The tables load_lake_data reads, in an in-memory DuckDB, in the stages' column names."""
    con = duckdb.connect()
    con.execute("create table queries (dataset varchar, query_id varchar, text varchar, answers varchar[])")
    con.executemany("insert into queries values (?, ?, ?, ['an answer'])", [(DATASET, q, t) for q, t in QUERIES.items()])
    con.execute("create table corpus (dataset varchar, doc_id varchar, title varchar, text varchar)")
    con.executemany("insert into corpus values (?, ?, '', ?)", [(DATASET, d, t) for d, t in CORPUS.items()])
    con.execute("create table original_qrels (dataset varchar, query_id varchar, doc_id varchar, relevance integer)")
    con.executemany("insert into original_qrels values (?, ?, ?, ?)", [(DATASET, *row) for row in ORIGINAL])
    con.execute("create table bridge_qrels (dataset varchar, query_id varchar, doc_id varchar, relevance integer, "
                "source varchar, verified boolean, unverified_label integer)")
    con.executemany("insert into bridge_qrels values (?, ?, ?, ?, ?, ?, ?)",
                    [(DATASET, q, d, r, s, v, 1 if s == "pending" else None) for q, d, r, s, v in REFINED])
    con.execute("create table retrieval_run (dataset varchar, retriever varchar, query_id varchar, "
                "doc_id varchar, rank integer)")
    # every doc for every query, in a rotated order: the pending doc d8 ranks first for q2
    rows = [(DATASET, "bm25", q, f"d{(int(q[1:]) + 6 + r) % 12}", r + 1) for q in QUERIES for r in range(12)]
    con.executemany("insert into retrieval_run values (?, ?, ?, ?, ?)", rows)
    con.execute("create table candidate_pool as select distinct dataset, query_id, doc_id from retrieval_run "
                "where rank <= 3")
    return con


@pytest.fixture(scope="module")
def data() -> LakeData:
    con = toy_lake()
    try:
        return load_lake_data(con, DATASET)
    finally:
        con.close()


@pytest.fixture(scope="module")
def location() -> str:
    return base_location("all-minilm-l6-v2")


def test_only_verified_labels_become_positives(data):
    assert data.refined_positives == {"q0": {"d0"}, "q1": {"d1", "d7"}, "q2": {"d2"}, "q3": {"d3", "d9"},
                                      "q4": {"d4"}, "q5": {"d5"}}
    assert ("q2", "d8") in data.pending
    settings = TrainSettings(negatives_per_query=11)
    refined = {q.query_id: q for q in training_queries(data, QUERIES, "refined", settings)}
    # the pending pair with a "yes" guess is neither a positive nor (being unknown) a negative
    assert CORPUS["d8"] not in refined["q2"].positives and CORPUS["d8"] not in refined["q2"].negatives
    assert refined["q1"].positives == (CORPUS["d1"], CORPUS["d7"])
    original = {q.query_id: q for q in training_queries(data, QUERIES, "original", settings)}
    # trained on the original qrels, the unjudged holes are negatives: what those labels believe
    assert CORPUS["d7"] in original["q1"].negatives and CORPUS["d8"] in original["q2"].negatives
    # the refined qrels evaluate pending as not relevant (the pipeline's lower bound)
    assert data.refined_qrels.filter((pl.col("query_id") == "q2") & (pl.col("doc_id") == "d8"))["relevance"][0] == 0


def test_utility_labels_come_from_one_utilsel_call_per_query(data):
    from bridge_assets.llm.types import LLMResult

    asked = []

    def generate(profile, requests):  # a scripted UtilSel: the first listed passage is useful
        asked.extend(requests)
        return [LLMResult(key=f"k{i}", text='{"selected": [1]}') for i, _ in enumerate(requests)]

    con = toy_lake()
    try:
        labels = utility_positives(pool_pairs(con, DATASET, ["q0", "q1"]), generate, "scripted")
        pool = {q: {d for (d,) in con.execute("select doc_id from candidate_pool where query_id = ?", [q]).fetchall()}
                for q in ("q0", "q1")}
    finally:
        con.close()
    assert len(asked) == 2 and labels.queries == 2 and labels.candidates == 6 and not labels.failed
    assert set(labels.positives) == {"q0", "q1"}
    for query_id, docs in labels.positives.items():
        assert len(docs) == 1 and docs <= pool[query_id]
    trained = training_queries(data, ["q0", "q1", "q2"], "utility", TrainSettings(), labels.positives)
    assert [q.query_id for q in trained] == ["q0", "q1"]   # q2 was not labelled: no positive, not trained


def test_query_split_never_leaks_test_queries(data):
    folds = query_folds(QUERIES, 3, seed=7)
    tested = [q for _, test in folds for q in test]
    assert sorted(tested) == sorted(QUERIES)  # every query tested exactly once
    for train, test in folds:
        assert not set(train) & set(test)
        trained = {q.query_id for q in training_queries(data, train, "refined", TrainSettings())}
        assert trained <= set(train) and not trained & set(test)
    assert query_folds(QUERIES, 3, seed=7) == folds
    assert query_folds(QUERIES, 3, seed=8) != folds


def test_a_query_sample_keeps_its_queries_labels_and_runs_and_the_whole_corpus(data):
    sample = sample_queries(data, 3, seed=0)
    chosen = set(sample.queries)
    assert len(chosen) == 3 and chosen <= set(QUERIES)
    assert sample.corpus == data.corpus  # retrieval still searches every chunk
    for frame in (sample.original_qrels, sample.refined_qrels, sample.runs):
        assert set(frame["query_id"]) == chosen
    assert sample.runs.height == 3 * 12
    assert set(sample.refined_positives) <= chosen and all(q in chosen for q, _ in sample.pending)
    assert sample.refined_positives == {q: docs for q, docs in data.refined_positives.items() if q in chosen}
    assert set(sample_queries(data, 3, seed=0).queries) == chosen  # seeded
    assert any(set(sample_queries(data, 3, seed=s).queries) != chosen for s in range(1, 6))
    assert sample_queries(data, 6, seed=0) is data  # no smaller than the dataset: all of it
    with pytest.raises(TrainedRetrieverError, match="at least one query"):
        sample_queries(data, 0, seed=0)


def test_training_is_reproducible_from_its_seed(data, location):
    queries = training_queries(data, ["q0", "q1", "q2", "q3"], "refined", TrainSettings())

    def trained(seed: int) -> tuple[str, list[float]]:
        settings = TrainSettings(epochs=1, batch_queries=2, max_length=32, seed=seed)
        model = load_encoder(location, settings.max_length)
        log = train_retriever(model, queries, settings)
        return weights_digest(model), log.losses

    base = load_encoder(location, 32)
    first, second, other = trained(0), trained(0), trained(1)
    assert first == second
    assert first[0] != weights_digest(base)   # it did train
    assert other[0] != first[0]                  # and the seed is what fixed it


def test_multi_positive_loss_rewards_every_positive():
    import torch

    queries = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0]]), dim=-1)
    docs = torch.nn.functional.normalize(torch.tensor([[1.0, 0.1], [0.9, 0.2], [0.0, 1.0]]), dim=-1)
    one = multi_positive_loss(queries, docs, torch.tensor([[True, False, False]]), 20.0)
    both = multi_positive_loss(queries, docs, torch.tensor([[True, True, False]]), 20.0)
    assert both < one  # a second positive is not pushed away as an in-batch negative


def test_comparison_runs_and_scores_held_out_queries(data, location):
    settings = TrainSettings(epochs=1, max_length=32)
    results = tr.run_comparison(data, location, ["original", "refined"], settings=settings, folds=2)
    assert [r.name for r in results] == ["untrained MiniLM", "trained on original", "trained on refined"]
    for result in results:
        for version in tr.QRELS_VERSIONS:
            mean, low, high, n = result.summary(version, "ndcg_cut_10", 0)
            assert n == len(QUERIES) and low <= mean <= high
    assert results[2].train_queries == [3, 3] and results[2].test_queries == [3, 3]
    table = tr.format_table(results, 0)
    assert "trained on refined" in table and "nDCG@10 refined" in table
    assert "trained on original" in tr.format_differences(results, 0)


def test_the_progress_line_gives_mean_losses_of_the_first_and_last_steps():
    log = TrainingLog(queries=1, positives=1, negatives=1, steps=12, losses=[1.0] * 6 + [0.0] * 6)
    assert log.loss_trend() == "mean loss of the first 5 step(s) 1.000 -> of the last 5 0.000"
    assert TrainingLog(1, 1, 1, steps=3, losses=[0.9, 0.5, 0.1]).loss_trend() == \
        "mean loss of the first 1 step(s) 0.900 -> of the last 1 0.100"


def test_the_trained_retriever_ranks_each_query_with_a_model_that_never_saw_it(data, location, monkeypatch):
    """kind: trained_retriever's run: every query once, ranked by the fold model trained on the
    other folds' queries only; the same seed gives the same weights and the same run."""
    trained_on: list[set[str]] = []
    train = train_retriever
    monkeypatch.setattr(tr, "train_retriever", lambda model, queries, settings:
                        trained_on.append({q.query_id for q in queries}) or train(model, queries, settings))
    settings = TrainSettings(epochs=1, max_length=32)
    first = tr.trained_retriever_run(data, location, "refined", settings, folds=2, k=4)
    assert first.not_trained is None
    run = first.run
    assert set(run["query_id"]) == set(QUERIES) and run.group_by("query_id").len()["len"].max() == 4
    assert run["rank"].to_list() == [r for _ in QUERIES for r in range(1, 5)]
    for fold, report in enumerate(first.folds):
        ranked = set(run.filter(pl.col("fold") == fold)["query_id"])
        assert ranked and not ranked & trained_on[fold]        # never trained on what it ranks
        assert set(run.filter(pl.col("fold") == fold)["student_key"]) == {report["weights_hash"]}
    assert first.folds[0]["weights_hash"] != first.folds[1]["weights_hash"]
    again = tr.trained_retriever_run(data, location, "refined", settings, folds=2, k=4)
    assert again.run.equals(run) and [f["weights_hash"] for f in again.folds] == [f["weights_hash"] for f in first.folds]


def test_no_trained_run_when_a_fold_has_nothing_to_learn_from(data, location):
    # the original qrels of one query only: the fold that holds it has no other query to learn from
    few = LakeData(**{**data.__dict__, "original_qrels": data.original_qrels.filter(pl.col("query_id") == "q0")})
    found = tr.trained_retriever_run(few, location, "original", TrainSettings(epochs=1, max_length=32),
                                     folds=2, k=4)
    assert found.run.is_empty()
    assert found.not_trained.startswith("fold ") and "no training query has a positive in the original labels" \
        in found.not_trained


def test_a_stored_fold_model_is_found_again_until_its_training_changes(data, location, tmp_path, monkeypatch):
    """With a store (the registry kind's: <lake>/trained_retrievers/<dataset>/), each fold's model
    is kept by the key of its training queries, settings and base, found again while they stay
    the same (no training: the same weights hashes and the same run as when trained), and trained
    anew when they change."""
    trainings = []
    train = train_retriever
    monkeypatch.setattr(tr, "train_retriever", lambda model, queries, settings:
                        trainings.append(len(queries)) or train(model, queries, settings))
    settings = TrainSettings(epochs=1, max_length=32)
    base = {"source": "test", "location": "all-minilm-l6-v2"}
    in_memory = tr.trained_retriever_run(data, location, "refined", settings, folds=2, k=4)
    assert len(trainings) == 2
    first = tr.trained_retriever_run(data, location, "refined", settings, folds=2, k=4, store=tmp_path, base=base)
    assert len(trainings) == 4 and [f["trained_now"] for f in first.folds] == [True, True]
    assert first.run.equals(in_memory.run)   # the stored model is the model it trained
    said: list[str] = []
    again = tr.trained_retriever_run(data, location, "refined", settings, folds=2, k=4, store=tmp_path, base=base,
                                     progress=said.append)
    assert len(trainings) == 4 and [f["trained_now"] for f in again.folds] == [False, False]
    assert again.run.equals(first.run)
    assert [f["weights_hash"] for f in again.folds] == [f["weights_hash"] for f in first.folds]
    assert all("found again" in line for line in said)
    # another setting, another base or other labels: trained anew
    tr.trained_retriever_run(data, location, "refined", TrainSettings(epochs=1, max_length=32, seed=1),
                             folds=2, k=4, store=tmp_path, base=base)
    tr.trained_retriever_run(data, location, "refined", settings, folds=2, k=4, store=tmp_path,
                             base={**base, "source": "other"})
    tr.trained_retriever_run(data, location, "original", settings, folds=2, k=4, store=tmp_path, base=base)
    assert len(trainings) == 10
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 8


def test_a_cached_gradient_step_gives_the_whole_batch_s_gradients(location):
    """cached_gradient_step encodes a few texts with their graph at a time; the gradients are
    those of encoding the batch at once with the same dropout (each chunk's RNG state replayed
    on its second pass): without the replay, the masks and so the gradients would differ."""
    import torch

    model = load_encoder(location, 32)
    model.train()   # dropout on: the replay is what keeps it the same
    texts = ["what does len return", *CORPUS.values()][:7]
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[0, 0] = mask[1, 3] = True

    def loss_of(embeddings):
        return multi_positive_loss(embeddings[:2], embeddings[2:], mask, 20.0)

    def gradients():
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        return grads

    torch.manual_seed(3)   # the reference: every chunk encoded once, with its graph, in the same order
    reference = loss_of(torch.cat([_embed(model, texts[i:i + 3]) for i in range(0, len(texts), 3)]))
    reference.backward()
    expected = gradients()
    torch.manual_seed(3)
    loss = cached_gradient_step(model, texts, loss_of, chunk=3)
    got = gradients()
    assert loss == pytest.approx(reference.item(), abs=1e-6)
    assert got.keys() == expected.keys() and len(got) > 50
    for name, grad in expected.items():
        assert torch.allclose(got[name], grad, atol=1e-6), name
