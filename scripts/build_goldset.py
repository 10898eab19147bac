"""Build the shipped gold set `resources/goldsets/nq_scifact_mini/goldset.jsonl` from ../shared/data.

    .venv/bin/python scripts/build_goldset.py [--per-domain 12] [--seed 13] [--out FILE]

Deterministic (a seeded sample of queries, BM25 with fixed parameters): the same inputs
always give the same file. Per sampled query, one positive and one hard negative:
- SciFact: a claim with SUPPORT rationale sentences (they stand in as the answers) against
  the abstract they come from = 1; against the best BM25-ranked abstract that the claim's
  qrels do not list = 0.
- NQ-open: a question against its gold passage = 1; against the best BM25-ranked passage of
  the NQ gold-passage corpus that is not in the question's qrels and contains none of its
  answer strings = 0.
Lines alternate positive/negative and domain, so that any prefix is close to balanced.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import bm25s
import polars as pl

from bridge_assets.ingest.loaders import load_beir_folder, load_nq_open
from bridge_assets.labeling.pairs import chunk_text
from bridge_assets.paths import PROJECT_ROOT, RESOURCES_DIR

SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
DEFAULT_OUT = RESOURCES_DIR / "goldsets" / "nq_scifact_mini" / "goldset.jsonl"
DEPTH = 20  # how deep in the BM25 ranking a negative is looked for
WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def contains_answer(passage: str, answers: list[str]) -> bool:
    """DPR-style answer match: an answer's word sequence occurs in the passage's words."""
    tokens = words(passage)
    for answer in answers:
        needle = words(answer)
        if needle and any(tokens[i:i + len(needle)] == needle for i in range(len(tokens) - len(needle) + 1)):
            return True
    return False


def bm25_rankings(doc_ids: list[str], doc_texts: list[str], queries: list[str]) -> list[list[str]]:
    """The top-DEPTH document ids for each query (bm25s, Lucene BM25, English stopwords)."""
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(doc_texts, stopwords="en", show_progress=False), show_progress=False)
    hits, _ = retriever.retrieve(bm25s.tokenize(queries, stopwords="en", show_progress=False),
                                 k=DEPTH, show_progress=False)
    return [[doc_ids[i] for i in row] for row in hits.tolist()]


def triplet(domain: str, dataset: str, query_id: str, doc_id: str, query: str, answers: list[str],
            chunk: str, label: int) -> dict:
    return {"id": f"{dataset}:{query_id}:{doc_id}", "query": query, "answers": answers,
            "chunk": chunk, "label": label, "domain": domain}


def scifact_triplets(rng: random.Random, count: int) -> list[list[dict]]:
    folder = SHARED_DATA / "scifact"
    tables = load_beir_folder(folder)
    corpus = {row["doc_id"]: chunk_text(row["title"], row["text"]) for row in tables.corpus.iter_rows(named=True)}
    claims = dict(zip(tables.queries["query_id"], tables.queries["text"]))
    judged: dict[str, set[str]] = {}
    for query_id, doc_id in zip(tables.qrels["query_id"], tables.qrels["doc_id"]):
        judged.setdefault(query_id, set()).add(doc_id)
    support: dict[str, tuple[str, list[str]]] = {}  # claim -> (its first supported abstract, rationale)
    for line in (folder / "evidence_rationales.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["label"] == "SUPPORT" and record["query_id"] in claims:
            current = support.get(record["query_id"])
            if current is None or record["doc_id"] < current[0]:
                support[record["query_id"]] = (record["doc_id"], record["rationale"])
    chosen = rng.sample(sorted(support), count * 2)  # spares for claims without a negative
    doc_ids = sorted(corpus)
    rankings = bm25_rankings(doc_ids, [corpus[d] for d in doc_ids], [claims[q] for q in chosen])
    groups = []
    for query_id, ranking in zip(chosen, rankings):
        negative = next((d for d in ranking if d not in judged[query_id]), None)
        if negative is None:
            continue
        doc_id, rationale = support[query_id]
        groups.append([
            triplet("scifact", "scifact", query_id, doc_id, claims[query_id], rationale, corpus[doc_id], 1),
            triplet("scifact", "scifact", query_id, negative, claims[query_id], rationale, corpus[negative], 0)])
        if len(groups) == count:
            return groups
    raise RuntimeError(f"only {len(groups)} SciFact claims have a BM25 negative, {count} asked")


def nq_triplets(rng: random.Random, count: int) -> list[list[dict]]:
    tables = load_nq_open(SHARED_DATA / "nq_open_mini" / "nq-open-oracle.jsonl.gz")
    corpus = {row["doc_id"]: chunk_text(row["title"], row["text"]) for row in tables.corpus.iter_rows(named=True)}
    gold = tables.qrels.group_by("query_id").agg(pl.col("doc_id"))
    judged = {row["query_id"]: set(row["doc_id"]) for row in gold.iter_rows(named=True)}
    queries = {row["query_id"]: row for row in tables.queries.iter_rows(named=True)}
    chosen = rng.sample(sorted(queries), count * 2)
    doc_ids = sorted(corpus)
    rankings = bm25_rankings(doc_ids, [corpus[d] for d in doc_ids], [queries[q]["text"] for q in chosen])
    groups = []
    for query_id, ranking in zip(chosen, rankings):
        query = queries[query_id]
        answers = list(query["answers"])
        negative = next((d for d in ranking if d not in judged[query_id]
                         and not contains_answer(corpus[d], answers)), None)
        positive = sorted(judged[query_id])[0]
        if negative is None or not contains_answer(corpus[positive], answers):
            continue
        groups.append([
            triplet("nq", "nq_open_mini", query_id, positive, query["text"], answers, corpus[positive], 1),
            triplet("nq", "nq_open_mini", query_id, negative, query["text"], answers, corpus[negative], 0)])
        if len(groups) == count:
            return groups
    raise RuntimeError(f"only {len(groups)} NQ questions have a BM25 negative, {count} asked")


def interleave(*domains: list[list[dict]]) -> list[dict]:
    """Query groups alternating between domains: positive, negative, next domain, ..."""
    lines = []
    for groups in zip(*domains, strict=True):
        for group in groups:
            lines.extend(group)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-domain", type=int, default=12, help="queries per domain (2 triplets each)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    lines = interleave(scifact_triplets(random.Random(args.seed), args.per_domain),
                       nq_triplets(random.Random(args.seed), args.per_domain))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    print(f"{args.out}: {len(lines)} triplets "
          f"({sum(t['label'] for t in lines)} relevant, {sum(1 - t['label'] for t in lines)} not)")


if __name__ == "__main__":
    main()
