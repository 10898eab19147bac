"""Build the shipped gold sets from ../shared/data.

    .venv/bin/python scripts/build_goldset.py [--goldset mini] [--per-domain 12] [--seed 13] [--out FILE]
    .venv/bin/python scripts/build_goldset.py --goldset hard [--out-dir DIR]

Deterministic (seeded samples of queries, BM25 with fixed parameters): the same inputs always
give the same files.

`mini` (resources/goldsets/nq_scifact_mini/goldset.jsonl, 48 triplets): per sampled query one
positive and one hard negative.
- SciFact: a claim with SUPPORT rationale sentences (they stand in as the answers) against
  the abstract they come from = 1; against the best BM25-ranked abstract that the claim's
  qrels do not list = 0.
- NQ-open: a question against its gold passage = 1; against the best BM25-ranked passage of
  the NQ gold-passage corpus that is not in the question's qrels and contains none of its
  answer strings = 0.

`hard` (resources/goldsets/nq_scifact_hard/: goldset.jsonl to evaluate on, fewshot.jsonl
kept apart for the prompts' worked examples): questions not in `mini`, the same two kinds of
pairs, plus the hardest negative: an NQ passage that *contains one of the question's answer
strings* without answering it (the best BM25-ranked such passage among the other questions'
gold passages). Every triplet was then read, and `review.yaml` beside the output records
each verdict that differs from the mechanical label (relabelled or dropped, with why); the
build applies it. Lines alternate positive/negative and spread the domains, so that any
prefix is close to balanced.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable
from pathlib import Path

import bm25s
import polars as pl
import yaml

from bridge_assets.ingest.loaders import load_beir_folder, load_nq_open
from bridge_assets.labeling.evidence import answer_in_chunk
from bridge_assets.labeling.pairs import chunk_text
from bridge_assets.paths import PROJECT_ROOT, RESOURCES_DIR

SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
GOLDSETS = RESOURCES_DIR / "goldsets"
DEFAULT_OUT = GOLDSETS / "nq_scifact_mini" / "goldset.jsonl"
HARD_DIR = GOLDSETS / "nq_scifact_hard"
DEPTH = 20  # how deep in the BM25 ranking a mini negative is looked for
HARD_DEPTH = 100  # how deep an answer-string negative is looked for
WORD = re.compile(r"\w+")

# The hard set's size: NQ questions with an answer-string negative, NQ questions with a
# BM25 negative without the answer, SciFact claims; and the groups kept apart as examples.
HARD_ANSWER_STRING, HARD_BM25, HARD_SCIFACT = 80, 30, 30
FEWSHOT_ANSWER_STRING, FEWSHOT_BM25, FEWSHOT_SCIFACT = 2, 1, 1
HARD_SEED = 29


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def contains_answer(passage: str, answers: list[str]) -> bool:
    """DPR-style answer match (the mini set's rule): an answer's word sequence occurs in the
    passage's words."""
    tokens = words(passage)
    for answer in answers:
        needle = words(answer)
        if needle and any(tokens[i:i + len(needle)] == needle for i in range(len(tokens) - len(needle) + 1)):
            return True
    return False


def bm25_rankings(doc_ids: list[str], doc_texts: list[str], queries: list[str],
                  depth: int = DEPTH) -> list[list[str]]:
    """The top-`depth` document ids for each query (bm25s, Lucene BM25, English stopwords)."""
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(doc_texts, stopwords="en", show_progress=False), show_progress=False)
    hits, _ = retriever.retrieve(bm25s.tokenize(queries, stopwords="en", show_progress=False),
                                 k=depth, show_progress=False)
    return [[doc_ids[i] for i in row] for row in hits.tolist()]


def triplet(domain: str, dataset: str, query_id: str, doc_id: str, query: str, answers: list[str],
            chunk: str, label: int, kind: str | None = None) -> dict:
    record = {"id": f"{dataset}:{query_id}:{doc_id}", "query": query, "answers": answers,
              "chunk": chunk, "label": label, "domain": domain}
    if kind is not None:
        record["kind"] = kind
    return record


class SciFact:
    def __init__(self) -> None:
        folder = SHARED_DATA / "scifact"
        tables = load_beir_folder(folder)
        self.corpus = {row["doc_id"]: chunk_text(row["title"], row["text"])
                       for row in tables.corpus.iter_rows(named=True)}
        self.claims = dict(zip(tables.queries["query_id"], tables.queries["text"]))
        self.judged: dict[str, set[str]] = {}
        for query_id, doc_id in zip(tables.qrels["query_id"], tables.qrels["doc_id"]):
            self.judged.setdefault(query_id, set()).add(doc_id)
        # claim -> (its first supported abstract, rationale)
        self.support: dict[str, tuple[str, list[str]]] = {}
        for line in (folder / "evidence_rationales.jsonl").read_text().splitlines():
            record = json.loads(line)
            if record["label"] == "SUPPORT" and record["query_id"] in self.claims:
                current = self.support.get(record["query_id"])
                if current is None or record["doc_id"] < current[0]:
                    self.support[record["query_id"]] = (record["doc_id"], record["rationale"])

    def groups(self, chosen: list[str], count: int, kinds: bool = False) -> list[list[dict]]:
        doc_ids = sorted(self.corpus)
        rankings = bm25_rankings(doc_ids, [self.corpus[d] for d in doc_ids], [self.claims[q] for q in chosen])
        groups = []
        for query_id, ranking in zip(chosen, rankings):
            negative = next((d for d in ranking if d not in self.judged[query_id]), None)
            if negative is None:
                continue
            doc_id, rationale = self.support[query_id]
            claim = self.claims[query_id]
            groups.append([
                triplet("scifact", "scifact", query_id, doc_id, claim, rationale, self.corpus[doc_id], 1,
                        "positive" if kinds else None),
                triplet("scifact", "scifact", query_id, negative, claim, rationale, self.corpus[negative], 0,
                        "bm25" if kinds else None)])
            if len(groups) == count:
                return groups
        raise RuntimeError(f"only {len(groups)} SciFact claims have a BM25 negative, {count} asked")


class NQ:
    def __init__(self) -> None:
        tables = load_nq_open(SHARED_DATA / "nq_open_mini" / "nq-open-oracle.jsonl.gz")
        self.corpus = {row["doc_id"]: chunk_text(row["title"], row["text"])
                       for row in tables.corpus.iter_rows(named=True)}
        gold = tables.qrels.group_by("query_id").agg(pl.col("doc_id"))
        self.judged = {row["query_id"]: set(row["doc_id"]) for row in gold.iter_rows(named=True)}
        self.queries = {row["query_id"]: row for row in tables.queries.iter_rows(named=True)}
        self.doc_ids = sorted(self.corpus)

    def rankings(self, chosen: list[str], depth: int) -> list[list[str]]:
        return bm25_rankings(self.doc_ids, [self.corpus[d] for d in self.doc_ids],
                             [self.queries[q]["text"] for q in chosen], depth)

    def group(self, query_id: str, negative: str, contains: Callable[[str, list[str]], bool],
              negative_kind: str | None = None) -> list[dict] | None:
        query = self.queries[query_id]
        answers = list(query["answers"])
        positive = sorted(self.judged[query_id])[0]
        if not contains(self.corpus[positive], answers):
            return None
        return [triplet("nq", "nq_open_mini", query_id, positive, query["text"], answers,
                        self.corpus[positive], 1, "positive" if negative_kind else None),
                triplet("nq", "nq_open_mini", query_id, negative, query["text"], answers,
                        self.corpus[negative], 0, negative_kind)]


def scifact_triplets(rng: random.Random, count: int) -> list[list[dict]]:
    data = SciFact()
    return data.groups(rng.sample(sorted(data.support), count * 2), count)  # spares for claims without a negative


def nq_triplets(rng: random.Random, count: int) -> list[list[dict]]:
    data = NQ()
    chosen = rng.sample(sorted(data.queries), count * 2)
    groups = []
    for query_id, ranking in zip(chosen, data.rankings(chosen, DEPTH)):
        answers = list(data.queries[query_id]["answers"])
        negative = next((d for d in ranking if d not in data.judged[query_id]
                         and not contains_answer(data.corpus[d], answers)), None)
        group = data.group(query_id, negative, contains_answer) if negative else None
        if group:
            groups.append(group)
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


def spread(major: list[list[dict]], minor: list[list[dict]]) -> list[dict]:
    """Both lists of query groups in one sequence, the minor one spread evenly through the major."""
    keyed = [((i + 0.5) / len(major), 0, g) for i, g in enumerate(major)] + \
            [((i + 0.5) / len(minor), 1, g) for i, g in enumerate(minor)]
    return [line for _, _, group in sorted(keyed, key=lambda k: (k[0], k[1])) for line in group]


def hard_nq_groups(exclude: set[str]) -> tuple[list[list[dict]], list[list[dict]], list[list[dict]]]:
    """(answer-string groups, BM25 groups, few-shot groups) of the hard set's NQ part."""
    data = NQ()
    rng = random.Random(HARD_SEED)
    candidates = [q for q in rng.sample(sorted(data.queries), len(data.queries)) if q not in exclude]
    want_answer = HARD_ANSWER_STRING + FEWSHOT_ANSWER_STRING
    want_bm25 = HARD_BM25 + FEWSHOT_BM25
    answer_string: list[list[dict]] = []
    plain: list[list[dict]] = []
    used_docs: set[str] = set()  # each negative passage once, so no passage dominates the set
    rankings = data.rankings(candidates, HARD_DEPTH)
    for query_id, ranking in zip(candidates, rankings):
        answers = list(data.queries[query_id]["answers"])
        others = [d for d in ranking if d not in data.judged[query_id] and d not in used_docs]
        if len(answer_string) < want_answer:
            negative = next((d for d in others if answer_in_chunk(answers, data.corpus[d])), None)
            group = data.group(query_id, negative, answer_in_chunk_list, "answer_string") if negative else None
            if group:
                answer_string.append(group)
                used_docs.add(negative)
                continue
        if len(plain) < want_bm25:
            negative = next((d for d in others if not answer_in_chunk(answers, data.corpus[d])), None)
            group = data.group(query_id, negative, answer_in_chunk_list, "bm25") if negative else None
            if group:
                plain.append(group)
                used_docs.add(negative)
        if len(answer_string) == want_answer and len(plain) == want_bm25:
            break
    else:
        raise RuntimeError(f"found {len(answer_string)} answer-string and {len(plain)} BM25 NQ groups")
    fewshot = answer_string[HARD_ANSWER_STRING:] + plain[HARD_BM25:]
    return answer_string[:HARD_ANSWER_STRING], plain[:HARD_BM25], fewshot


def answer_in_chunk_list(chunk: str, answers: list[str]) -> bool:
    return answer_in_chunk(answers, chunk)


def hard_scifact_groups(exclude: set[str]) -> tuple[list[list[dict]], list[list[dict]]]:
    data = SciFact()
    rng = random.Random(HARD_SEED)
    chosen = [q for q in rng.sample(sorted(data.support), len(data.support)) if q not in exclude]
    groups = data.groups(chosen, HARD_SCIFACT + FEWSHOT_SCIFACT, kinds=True)
    return groups[:HARD_SCIFACT], groups[HARD_SCIFACT:]


def apply_review(lines: list[dict], review: dict[str, dict]) -> list[dict]:
    """The reading's verdicts: `label` relabels a triplet, `drop` removes it; `note` says why."""
    unknown = set(review) - {line["id"] for line in lines}
    if unknown:
        raise ValueError(f"review.yaml names triplets the build does not make: {sorted(unknown)[:5]}")
    reviewed = []
    for line in lines:
        verdict = review.get(line["id"])
        if verdict is None:
            reviewed.append(line)
        elif not verdict.get("drop"):
            reviewed.append({**line, "label": verdict.get("label", line["label"]), "note": verdict["note"]})
    return reviewed


def balance(lines: list[dict]) -> list[dict]:
    """Equal classes: relabelling turns negatives into positives, so the surplus of gold-passage
    positives is dropped from the end of the file (every negative and every relabelled
    positive stays)."""
    surplus = sum(t["label"] for t in lines) * 2 - len(lines)  # positives - negatives
    dropped = set()
    for index in reversed(range(len(lines))):
        if surplus <= 0:
            break
        if lines[index]["label"] == 1 and lines[index].get("kind") == "positive":
            dropped.add(index)
            surplus -= 1
    return [line for index, line in enumerate(lines) if index not in dropped]


def write_jsonl(path: Path, lines: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    print(f"{path}: {len(lines)} triplets "
          f"({sum(t['label'] for t in lines)} relevant, {sum(1 - t['label'] for t in lines)} not)")


def build_hard(out_dir: Path) -> None:
    mini = [json.loads(line) for line in DEFAULT_OUT.read_text().splitlines()]
    exclude = {line["id"].split(":")[1] for line in mini}
    answer_string, plain, nq_fewshot = hard_nq_groups(exclude)
    scifact, scifact_fewshot = hard_scifact_groups(exclude)
    nq = spread(answer_string, plain)
    lines = spread([nq[i:i + 2] for i in range(0, len(nq), 2)], scifact)
    review_path = HARD_DIR / "review.yaml"  # the reading of the shipped set
    review = (yaml.safe_load(review_path.read_text()) or {}) if review_path.exists() else {}
    write_jsonl(out_dir / "goldset.jsonl", balance(apply_review(lines, review.get("goldset") or {})))
    fewshot = [line for group in nq_fewshot + scifact_fewshot for line in group]
    write_jsonl(out_dir / "fewshot.jsonl", apply_review(fewshot, review.get("fewshot") or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--goldset", choices=["mini", "hard"], default="mini")
    parser.add_argument("--per-domain", type=int, default=12, help="mini: queries per domain (2 triplets each)")
    parser.add_argument("--seed", type=int, default=13, help="mini: sampling seed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="mini: output file")
    parser.add_argument("--out-dir", type=Path, default=HARD_DIR, help="hard: output folder")
    args = parser.parse_args()
    if args.goldset == "hard":
        build_hard(args.out_dir)
        return
    write_jsonl(args.out, interleave(scifact_triplets(random.Random(args.seed), args.per_domain),
                                     nq_triplets(random.Random(args.seed), args.per_domain)))


if __name__ == "__main__":
    main()
