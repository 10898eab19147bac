"""The fixed by-question split of the DIRAS teacher data and the silver gold set drawn from it.

Reads `resources/data/diras_general_qa/train.jsonl.gz` (GPT-4's Yes/No labels, see that folder's
README) and writes, deterministically (standard library only):
- `resources/data/diras_general_qa/split.json`: the 499 distinct questions ordered by the
  SHA-256 hex digest of their UTF-8 text (ascending); the first 50 are `test`, the next 50
  `calibration`, the rest `train`. Every pair of a question goes where its question goes.
- `resources/goldsets/diras_silver/goldset.jsonl`: from the test questions only,
  `random.Random(0)` samples 100 teacher-Yes pairs, then (same generator) 100 teacher-No pairs,
  each from the class's pairs in id order; all of a class if it has fewer. Lines are ordered by
  id (dataset, then the id's number).
- `resources/goldsets/diras_silver/calibration.jsonl`: the same draw (50 per class) from the
  calibration questions: what thresholds are chosen on, never the test questions.

    python scripts/diras_split.py           # (re)write both files
    python scripts/diras_split.py --check   # exit 1 if either file on disk differs
    python scripts/diras_split.py --out-dir DIR   # write them under DIR instead (same relative paths)
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "resources" / "data" / "diras_general_qa" / "train.jsonl.gz"
SPLIT = ROOT / "resources" / "data" / "diras_general_qa" / "split.json"
GOLDSET = ROOT / "resources" / "goldsets" / "diras_silver" / "goldset.jsonl"
CALIBRATION = GOLDSET.with_name("calibration.jsonl")
CALIBRATION_PER_CLASS = 50

SPLITS = (("test", 50), ("calibration", 50), ("train", None))  # None: the rest
SEED = 0
PER_CLASS = 100
RULE = ("Split by question: the distinct questions (field `query`) are ordered by the SHA-256 hex "
        "digest of their UTF-8 text, ascending; the first 50 are `test`, the next 50 "
        "`calibration`, the rest `train`. Every pair goes to its question's split.")


def read_pairs(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def question_order(question: str) -> str:
    return hashlib.sha256(question.encode("utf-8")).hexdigest()


def id_order(pair_id: str) -> tuple[str, int]:
    """`asqa-train-12` -> ("asqa-train", 12): ids in dataset, then numeric, order."""
    prefix, _, number = pair_id.rpartition("-")
    return prefix, int(number)


def split_questions(pairs: list[dict]) -> dict[str, list[str]]:
    """Each split's questions (sorted), by the rule above."""
    ordered = sorted({p["query"] for p in pairs}, key=question_order)
    splits, start = {}, 0
    for name, size in SPLITS:
        end = len(ordered) if size is None else start + size
        splits[name] = sorted(ordered[start:end])
        start = end
    return splits


def split_document(pairs: list[dict], splits: dict[str, list[str]]) -> dict:
    where = {q: name for name, questions in splits.items() for q in questions}
    counts = {name: {"questions": len(questions), "pairs": 0, "teacher_yes": 0}
              for name, questions in splits.items()}
    for pair in pairs:
        counts[where[pair["query"]]]["pairs"] += 1
        counts[where[pair["query"]]]["teacher_yes"] += pair["teacher_label"]
    counts["all"] = {key: sum(c[key] for c in counts.values()) for key in ("questions", "pairs", "teacher_yes")}
    return {"rule": RULE, "counts": counts, "questions": splits}


def silver_goldset(pairs: list[dict], test_questions: list[str], per_class: int | None = None) -> list[dict]:
    per_class = PER_CLASS if per_class is None else per_class
    test = set(test_questions)
    pool = sorted((p for p in pairs if p["query"] in test), key=lambda p: id_order(p["id"]))
    rng = random.Random(SEED)
    chosen = []
    for label in (1, 0):
        of_class = [p for p in pool if p["teacher_label"] == label]
        chosen += of_class if len(of_class) <= per_class else rng.sample(of_class, per_class)
    return [{"id": p["id"], "query": p["query"], "answers": [], "chunk": p["chunk"],
             "label": p["teacher_label"], "domain": p["dataset"],
             "note": f"teacher confidence {p['teacher_confidence']}"}
            for p in sorted(chosen, key=lambda p: id_order(p["id"]))]


def render(data: Path = DATA) -> dict[Path, str]:
    """The text of each output file, as it is written."""
    pairs = read_pairs(data)
    splits = split_questions(pairs)
    gold = silver_goldset(pairs, splits["test"])
    calibration = silver_goldset(pairs, splits["calibration"], CALIBRATION_PER_CLASS)
    return {
        SPLIT: json.dumps(split_document(pairs, splits), ensure_ascii=False, indent=2) + "\n",
        GOLDSET: "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in gold),
        CALIBRATION: "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in calibration),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the teacher data (train.jsonl.gz)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file on disk differs from what would be written")
    parser.add_argument("--out-dir", type=Path, help="write the files under this folder, at their paths "
                        "relative to the project (default: the project itself)")
    args = parser.parse_args()
    outputs = render(args.data)
    if args.check:
        stale = [path for path, text in outputs.items()
                 if not path.exists() or path.read_bytes() != text.encode("utf-8")]
        for path in stale:
            print(f"differs from a rebuild: {path.relative_to(ROOT)}", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs.items():
        target = args.out_dir / path.relative_to(ROOT) if args.out_dir else path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text.encode("utf-8"))
        print(f"wrote {target if args.out_dir else path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
