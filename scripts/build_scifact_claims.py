"""Build `resources/goldsets/scifact_claims/goldset.jsonl`: 20 SciFact claims, each against its
gold abstract (label 1, SciFact's expert annotation) and one read BM25 hard negative (label 0).

Deterministic, standard library only, from BEIR SciFact test in `../shared/data/scifact`:
- claims: `random.Random(0).sample` of 20 among the test claims (in numeric id order) that have
  exactly one qrels abstract, whose text is under 1,800 characters and which carries a
  SUPPORT/CONTRADICT rationale in `evidence_rationales.jsonl` (the other qrels pairs are cited
  abstracts of NOT-ENOUGH-INFO claims: the annotators found no evidence in them), leaving out
  the claims the `nq_scifact_*` gold sets (and their few-shot file) already use;
- negative: the best Okapi BM25 match (k1 0.9, b 0.4; lower-cased word tokens, English stop words
  dropped; the index is title + text of all 5,183 abstracts) among the abstracts not in the
  claim's qrels whose text is under 1,800 characters, skipping those REJECTED below, which a
  reader found to hold evidence about the claim (a negative that is really relevant);
- every negative was read against its claim; NEGATIVE_NOTES says why each is not relevant.

    python scripts/build_scifact_claims.py              # write the gold set
    python scripts/build_scifact_claims.py --check      # exit 1 if the file on disk differs
    python scripts/build_scifact_claims.py --candidates 5   # print the top 5 negatives per claim
    python scripts/build_scifact_claims.py --out FILE   # write the gold set there instead
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCIFACT = ROOT.parent / "shared" / "data" / "scifact"
OUT = ROOT / "resources" / "goldsets" / "scifact_claims" / "goldset.jsonl"

SEED, CLAIMS, MAX_TEXT = 0, 20, 1800
K1, B = 0.9, 0.4
# SciFact claims of resources/goldsets/nq_scifact_mini and nq_scifact_hard (goldset.jsonl and
# fewshot.jsonl, whose claim 540 is a worked example of the labeling prompts), fixed here so that
# the build does not depend on those files.
USED_ELSEWHERE = frozenset("""5 50 113 124 130 141 208 218 230 239 248 314 343 399 415 533 539 540 549
    613 744 784 823 845 880 904 921 957 960 971 1019 1024 1107 1121 1146 1216 1259 1271 1273 1335
    1337 1385""".split())

STOPWORDS = frozenset("""a about above after again against all am an and any are as at be because been
    before being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it its
    itself just me more most my myself no nor not now of off on once only or other our ours ourselves
    out over own same she should so some such than that the their theirs them themselves then there
    these they this those through to too under until up very was we were what when where which while
    who whom why will with would you your yours yourself yourselves""".split())

# (claim id, doc id) of top BM25 negatives a reader found to be relevant: not used, the next
# match is taken instead.
REJECTED: dict[tuple[str, str], str] = {
    ("793", "9588931"): (
        "it reports mitochondria-dependent apoptosis (cytochrome c release, caspase-3), which refutes the"
        " claim"),
    ("793", "23403754"): (
        "a review of mitochondrial membrane potential, ATP and the release of mitochondrial death "
        "proteins in apoptosis, which refutes the claim"),
    ("793", "7465900"): (
        "it describes Bax at mitochondria and cytochrome c release in p53-mediated apoptosis, which "
        "refutes the claim"),
    ("793", "28249680"): (
        "cell death through the intrinsic mitochondrial apoptosis pathway, which refutes the claim"),
    ("793", "25439264"): (
        "it studies cytochrome c release from mitochondria in trophoblast apoptosis: evidence on the "
        "claim"),
    ("1021", "10559501"): (
        "borderline: IFN-beta restricts West Nile virus replication in cerebellar granule cell neurons "
        "(not cortical ones), partial evidence on the claim"),
    ("1049", "7487927"): (
        "it calls ribosomopathies symptomatically distinct and shows a craniofacial-specific defect, "
        "evidence of tissue-specific pathology that refutes the claim"),
}

# (claim id, doc id) -> the note of a gold abstract where the first rationale sentence does not
# serve: by default it is quoted with SciFact's SUPPORT/CONTRADICT label.
GOLD_NOTES: dict[tuple[str, str], str] = {
    # the rationale's sentence index points at "5,9).", a fragment the sentence splitter left
    ("528", "5476778"): "SciFact's annotators: it supports the claim: \"Antibodies to hnRNP-A1 cross-reacted "
                        "with HTLV-1-tax, the immune response to which is associated with HAM/TSP\"",
    # SciFact labels the pair SUPPORT, but the abstract says incidence did not decline: it refutes
    # the claim, which keeps it relevant (label 1) all the same
    ("593", "19675911"): "Relevant: SciFact marks it SUPPORT, but read it refutes the claim: \"the incidence of "
                         "heart failure has not declined during 2 decades\"",
}

# (claim id, doc id) -> why the negative that was used is not relevant (read by hand).
NEGATIVE_NOTES: dict[tuple[str, str], str] = {
    ("57", "11659421"): (
        "Progerin-induced aging of iPSC-derived neurons to model Parkinson's disease; nothing on APOE4, "
        "amyloid-beta, tau or GABA neurons."),
    ("180", "9217800"): (
        "FUS and TDP-43 act in a common pathway in Drosophila; nothing on complex I subunits ND3/ND6 or "
        "blocking their interaction with TDP-43."),
    ("219", "20311968"): (
        "CAR-redirected regulatory T cells reduce allergic airway inflammation; CX3CR1 and its role on "
        "Th2 cells are not mentioned."),
    ("431", "19922508"): (
        "Methods to monitor ROS in starvation-induced autophagy; FoxO3a and neuronal death are not "
        "mentioned."),
    ("528", "23326722"): (
        "Clinical features of adult T-cell leukaemia/lymphoma in Barbados; mentions HAM/TSP history but "
        "nothing on IgG cross-reacting with Tax."),
    ("536", "24186125"): (
        "Quercetin's effects on rat spleen and bone marrow cells; nothing on hypocretin/orexin neurons or"
        " panic."),
    ("593", "36355784"): (
        "Cervical cancer incidence and mortality under Finnish screening; nothing on heart failure "
        "incidence."),
    ("636", "11289247"): (
        "The PTEN-like mitochondrial phosphatase PTPMT1 in hematopoietic stem cells; nothing on PTEN "
        "dephosphorylating PtdIns(3,4)P2."),
    ("793", "23509113"): (
        "A review of the resolution of acute lung inflammation; it says nothing about mitochondria or "
        "apoptosis."),
    ("832", "12948892"): (
        "Ca2+-permeable AMPA receptors drive glioblastoma growth via Akt; nothing on NFAT4 or IP3 "
        "receptors."),
    ("839", "13923069"): (
        "Collagen IV-targeted nanoparticles carrying a peptide treat atherosclerosis; no aptamers or "
        "lipid nanoparticles targeting cell types."),
    ("852", "474325"): (
        "Helmet versus face mask for NIV in COPD; it does not address NIV after an inadequate response to"
        " conventional treatment."),
    ("985", "34071621"): (
        "Nuclear PTEN regulates SRF in smooth muscle cells; nothing on the PTENP1 pseudogene or miRNA "
        "decoys."),
    ("993", "25842866"): (
        "Antibodies detect telomeric G-quadruplexes in Stylonychia; pyridostatin is not mentioned."),
    ("1021", "34287602"): (
        "Genetic diversity of West Nile virus in mosquitoes and birds; nothing on interferon-induced "
        "genes or neuron survival."),
    ("1049", "24737389"): (
        "A review of ribosomopathies, growth control and p53; it says nothing about how cell- or "
        "tissue-specific their pathology is."),
    ("1089", "7915836"): (
        "SMC5/6 and MMS21 SUMOylate telomere proteins in ALT cells; nothing on ATP-dependent activation "
        "of Mms21."),
    ("1202", "6144969"): "Enterovirus-induced gene expression in pancreatic islets; nothing on granulomas.",
    ("1232", "6957332"): (
        "Diagnosis and management of infant gastro-oesophageal reflux; nothing on FOXO3 or Crohn's "
        "disease."),
    ("1303", "40631095"): (
        "Exercise and respiratory training in pulmonary hypertension; tirasemtiv and fast-twitch muscle "
        "are not mentioned."),
}


def words(text: str) -> list[str]:
    return [w for w in re.findall(r"\w+", text.lower()) if w not in STOPWORDS]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class Bm25:
    def __init__(self, docs: dict[str, str]) -> None:
        self.ids = list(docs)
        self.tf = [Counter(words(docs[d])) for d in self.ids]
        self.length = [sum(tf.values()) for tf in self.tf]
        self.avg = sum(self.length) / len(self.length)
        df = Counter(term for tf in self.tf for term in tf)
        n = len(self.ids)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def ranking(self, query: str) -> list[str]:
        terms = set(words(query))
        scores = []
        for doc_id, tf, length in zip(self.ids, self.tf, self.length):
            score = sum(self.idf[t] * tf[t] * (K1 + 1) / (tf[t] + K1 * (1 - B + B * length / self.avg))
                        for t in terms if t in tf)
            if score > 0:
                scores.append((-score, doc_id))
        return [doc_id for _, doc_id in sorted(scores)]


def load(folder: Path):
    corpus = {d["_id"]: d for d in read_jsonl(folder / "corpus.jsonl")}
    claims = {q["_id"]: q["text"] for q in read_jsonl(folder / "queries.jsonl")}
    qrels: dict[str, list[str]] = defaultdict(list)
    for row in (folder / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        query_id, doc_id, _score = row.split("\t")
        qrels[query_id].append(doc_id)
    rationales: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in read_jsonl(folder / "evidence_rationales.jsonl"):
        rationales[(r["query_id"], r["doc_id"])].append(r)
    return corpus, claims, qrels, rationales


def chosen_claims(claims, qrels, corpus, rationales) -> list[str]:
    eligible = [q for q in sorted(claims, key=int)
                if len(qrels.get(q, [])) == 1 and len(corpus[qrels[q][0]]["text"]) < MAX_TEXT
                and (q, qrels[q][0]) in rationales and q not in USED_ELSEWHERE]
    return sorted(random.Random(SEED).sample(eligible, CLAIMS), key=int)


def chunk(doc: dict) -> str:
    return doc["title"] + "\n" + doc["text"]


def negatives(claim_id: str, claim: str, bm25: Bm25, qrels, corpus) -> list[str]:
    """The claim's negative candidates, best BM25 match first."""
    return [d for d in bm25.ranking(claim)
            if d not in qrels[claim_id] and len(corpus[d]["text"]) < MAX_TEXT]


def build(folder: Path) -> list[dict]:
    corpus, claims, qrels, rationales = load(folder)
    bm25 = Bm25({d: chunk(doc) for d, doc in corpus.items()})
    lines = []
    for claim_id in chosen_claims(claims, qrels, corpus, rationales):
        gold = qrels[claim_id][0]
        evidence = rationales[(claim_id, gold)]
        verdict = "supports" if evidence[0]["label"] == "SUPPORT" else "refutes"
        note = GOLD_NOTES.get((claim_id, gold),
                              f"SciFact's annotators: it {verdict} the claim: \"{evidence[0]['rationale'][0]}\"")
        lines.append({"id": f"scifact:{claim_id}:{gold}", "query": claims[claim_id], "answers": [],
                      "chunk": chunk(corpus[gold]), "label": 1, "domain": "scifact", "kind": "gold",
                      "note": note})
        ranked = negatives(claim_id, claims[claim_id], bm25, qrels, corpus)
        skipped = [d for d in ranked if (claim_id, d) in REJECTED]
        negative = next(d for d in ranked if (claim_id, d) not in REJECTED)
        note = NEGATIVE_NOTES.get((claim_id, negative))
        if note is None:
            raise SystemExit(f"claim {claim_id}: negative {negative} has not been read (no note)")
        if skipped:
            note += (f" (It replaces the higher BM25 match{'es' if len(skipped) > 1 else ''} "
                     f"{', '.join(skipped)}, set aside on reading as evidence on the claim: see the README.)")
        lines.append({"id": f"scifact:{claim_id}:{negative}", "query": claims[claim_id], "answers": [],
                      "chunk": chunk(corpus[negative]), "label": 0, "domain": "scifact",
                      "kind": "bm25_negative", "note": note})
    return lines


def show_candidates(folder: Path, depth: int) -> None:
    corpus, claims, qrels, rationales = load(folder)
    bm25 = Bm25({d: chunk(doc) for d, doc in corpus.items()})
    for claim_id in chosen_claims(claims, qrels, corpus, rationales):
        gold = qrels[claim_id][0]
        print(f"=== claim {claim_id}: {claims[claim_id]}")
        print(f"  gold {gold} [{rationales[(claim_id, gold)][0]['label']}]: {corpus[gold]['title']}")
        for doc_id in negatives(claim_id, claims[claim_id], bm25, qrels, corpus)[:depth]:
            key = (claim_id, doc_id)
            mark = "REJECTED" if key in REJECTED else "noted" if key in NEGATIVE_NOTES else ""
            print(f"  --- {doc_id} {mark}\n  {chunk(corpus[doc_id])}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scifact", type=Path, default=SCIFACT, help="BEIR SciFact folder")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file on disk differs")
    parser.add_argument("--candidates", type=int, metavar="N", help="print the top N negatives per claim")
    parser.add_argument("--out", type=Path, default=OUT, help="the gold set file to write (or --check)")
    args = parser.parse_args()
    if args.candidates:
        show_candidates(args.scifact, args.candidates)
        return 0
    text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in build(args.scifact))
    if args.check:
        same = args.out.exists() and args.out.read_bytes() == text.encode("utf-8")
        if not same:
            print(f"differs from a rebuild: {shown(args.out)}", file=sys.stderr)
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(text.encode("utf-8"))
    print(f"wrote {shown(args.out)}")
    return 0


def shown(path: Path) -> Path:
    """`path` relative to the project when it is inside it."""
    return path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path


if __name__ == "__main__":
    sys.exit(main())
