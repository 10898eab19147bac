"""Build the embedded demo dataset in `resources/data/demo/` (BEIR format).

The corpus is cut from the help topics that ship with Python itself
(`pydoc_data.topics.topics`: language reference and library text, one long
string per topic). Each topic is split into paragraphs, the paragraphs are
packed into passages of roughly 60-150 words without ever cutting one, and
passages that are short or mostly code/tables are dropped. Nothing is random,
so the same Python release always yields the same corpus.

The questions, their short answers, the single judged passage per question
(the qrels) and the unjudged passages we verified by hand as also answering
it (the "holes") are the literal list `QUESTIONS` below.

Writes corpus.jsonl, queries.jsonl, qrels/test.tsv and holes.jsonl, after
checking that every id exists and every answer occurs in its passages.

    python3 scripts/build_demo_dataset.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import pydoc_data.topics
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PYTHON_VERSION = (3, 11, 7)  # the passages, ids and judgements below match this release
OUT_DIR = Path(__file__).resolve().parent.parent / "resources" / "data" / "demo"

# Topics used, in corpus order. Each text is used once: left out are topics that
# repeat others verbatim ("naming" and "exceptions" are part of "execmodel";
# "compound" holds "if", "for", "try"...; "specialnames" holds "customization",
# "attribute-access"...; "else" equals "if"; "augassign", "in", "id-classes" and
# "typesseq-mutable" are sections of larger topics), the pdb manual ("debugger")
# and the format mini-language ("formatstrings"), mostly command and option
# lists, and topics too short for one passage ("await", "bltin-null-object"...).
TOPICS = (
    "assert", "assignment", "async", "atom-identifiers", "atom-literals",
    "attribute-access", "attribute-references", "binary", "bitwise",
    "bltin-code-objects", "bltin-type-objects", "booleans", "break", "calls", "class",
    "comparisons", "context-managers", "continue", "conversions", "customization",
    "del", "dict", "execmodel", "exprlists", "floating", "for", "function", "global",
    "identifiers", "if", "imaginary", "import", "integers", "lambda", "lists",
    "nonlocal", "numbers", "numeric-types", "objects", "operator-summary", "pass",
    "power", "raise", "return", "sequence-types", "shifting", "slicings",
    "specialattrs", "string-methods", "strings", "subscriptions", "truth", "try",
    "types", "typesfunctions", "typesmapping", "typesmethods", "typesmodules",
    "typesseq", "unary", "while", "with", "yield",
)

MIN_WORDS = 40        # shorter passages are dropped
TARGET_WORDS = 60     # a passage is not closed before it has this many words...
MAX_WORDS = 150       # ...and not grown past this many (a longer paragraph stays whole)
TERM_WORDS = 12       # a paragraph this short can be a term or signature (see `pack`)
MAX_CODE_SHARE = 0.5  # passages with a larger share of words in code/table paragraphs are dropped

HEADING_UNDERLINE = re.compile(r"^([*=\-^~])\1{2,}$")
WRAPPED_HYPHEN = re.compile(r"(\w-)\n\s*(?=[a-z])")  # "built-\n   in" -> "built-in"
# A plain word, possibly quoted, emphasised or followed by punctuation.
PROSE_WORD = re.compile(r"^[\"“(*]*[A-Za-z][a-z’'\-]*[\"”)*]*[.,;:?!]?[\")”]*$")


@dataclass(frozen=True)
class Paragraph:
    text: str  # whitespace already normalised
    is_code: bool
    indent: int  # of the first line; a deeper paragraph belongs to the one before

    @property
    def words(self) -> int:
        return len(self.text.split())


def looks_like_code(raw: str) -> bool:
    """Code, grammar rules and tables: prompts, `::=`, or mostly non-word tokens."""
    if ">>>" in raw or "::=" in raw:
        return True
    tokens = raw.split()
    prose = sum(1 for token in tokens if PROSE_WORD.match(token))
    return prose < 0.6 * len(tokens)


def split_sections(text: str) -> list[list[Paragraph]]:
    """The topic's paragraphs, grouped by section (headings start a new section)."""
    sections: list[list[Paragraph]] = [[]]
    for raw in re.split(r"\n\s*\n", text):
        lines = raw.strip("\n").splitlines()
        if not lines:
            continue
        if len(lines) == 2 and HEADING_UNDERLINE.match(lines[1].strip()):
            sections.append([])
            continue
        indent = len(lines[0]) - len(lines[0].lstrip())
        body = WRAPPED_HYPHEN.sub(r"\1", "\n".join(lines))
        sections[-1].append(Paragraph(" ".join(body.split()), looks_like_code(body), indent))
    return [section for section in sections if section]


def pack(paragraphs: list[Paragraph]) -> list[list[Paragraph]]:
    """Greedily group consecutive paragraphs into passages of TARGET..MAX words.

    A short paragraph followed by a deeper indented one introduces it (a
    signature such as "object.__bool__(self)" and its description, "Note:"
    and its text), so when a passage would end between the two, it moves along.
    """
    groups: list[list[Paragraph]] = []
    current: list[Paragraph] = []
    for paragraph in paragraphs:
        size = sum(p.words for p in current)
        if current and size >= TARGET_WORDS and size + paragraph.words > MAX_WORDS:
            last = current[-1]
            introduces_next = paragraph.indent > last.indent and last.words <= TERM_WORDS
            carried = [current.pop()] if introduces_next else []
            groups.append(current)
            current = carried
        current.append(paragraph)
    if current:
        groups.append(current)
    return groups


def keep(group: list[Paragraph]) -> bool:
    """Whether a packed group is long enough and mostly prose."""
    words = sum(p.words for p in group)
    code = sum(p.words for p in group if p.is_code)
    return words >= MIN_WORDS and code <= MAX_CODE_SHARE * words


def topic_passages(topic: str) -> list[dict]:
    """The kept passages of one topic, ids `pydoc-<topic>-<n>` numbered from 1."""
    text = pydoc_data.topics.topics[topic]
    title = text.splitlines()[0].strip()
    groups = [g for section in split_sections(text) for g in pack(section) if keep(g)]
    return [
        {"_id": f"pydoc-{topic}-{n}", "title": title, "text": " ".join(p.text for p in group)}
        for n, group in enumerate(groups, start=1)
    ]


def build_corpus() -> list[dict]:
    """All passages of all TOPICS, in order."""
    return [passage for topic in TOPICS for passage in topic_passages(topic)]


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    answers: tuple[str, ...]  # short gold answers, each found in the judged passage
    judged: str               # the one passage in the qrels
    holes: tuple[str, ...]    # unjudged passages read and verified to answer it too
    note: str
    partial: tuple[str, ...] = ()  # passages that answer only in part (neither hole nor miss)


QUESTIONS = (
    Question(
        "q01", "How do I write a small anonymous function inline in Python?",
        ("lambda expression", "lambda"), "pydoc-lambda-1", ("pydoc-function-7",),
        "pydoc-function-7 says anonymous functions are created with lambda expressions.",
    ),
    Question(
        "q02", "Which exception is raised when a generator has no more values to produce?",
        ("StopIteration",), "pydoc-types-21", ("pydoc-return-1",),
        "pydoc-return-1: a return in a generator function causes StopIteration to be "
        "raised. Not a hole: pydoc-typesseq-2 (sequence iterators, not generators).",
    ),
    Question(
        "q03", "Which method of a context manager is called when a with block is entered?",
        ("__enter__",), "pydoc-context-managers-1", ("pydoc-with-1",),
        "pydoc-with-1 lists the steps of a with statement: the context manager's "
        "__enter__() method is invoked. Partial: pydoc-with-3 shows it only as code.",
        ("pydoc-with-3",),
    ),
    Question(
        "q04", "In what order does a Python dictionary keep its keys?",
        ("insertion order",), "pydoc-typesmapping-9",
        ("pydoc-types-15", "pydoc-typesmapping-10", "pydoc-types-16"),
        "pydoc-types-15: dictionaries preserve insertion order; pydoc-typesmapping-10: "
        "keys are iterated in insertion order, guaranteed since 3.7; pydoc-types-16: "
        "the 3.7 change note (the weakest of the three).",
    ),
    Question(
        "q05", "How can a nested function assign to a variable of its enclosing function?",
        ("nonlocal",), "pydoc-nonlocal-1", ("pydoc-execmodel-7",),
        "pydoc-execmodel-7: the nonlocal statement makes names refer to variables in the "
        "nearest enclosing function scope. Partial: pydoc-assignment-4.",
        ("pydoc-assignment-4",),
    ),
    Question(
        "q06", "What should an operator method like __add__ or __lt__ return when it "
        "does not support the other operand?",
        ("NotImplemented",), "pydoc-types-3",
        ("pydoc-numeric-types-2", "pydoc-customization-10"),
        "pydoc-numeric-types-2 (arithmetic methods) and pydoc-customization-10 (rich "
        "comparison methods) both say to return NotImplemented. Partial: "
        "pydoc-numeric-types-3, pydoc-customization-11.",
        ("pydoc-numeric-types-3", "pydoc-customization-11"),
    ),
    Question(
        "q07", "Which special method decides whether an object counts as true or false?",
        ("__bool__",), "pydoc-booleans-1", ("pydoc-customization-17", "pydoc-truth-1"),
        "pydoc-customization-17 documents object.__bool__ as implementing truth value "
        "testing; pydoc-truth-1 says an object is true unless __bool__() returns False "
        "(or __len__() returns zero). Partial: pydoc-sequence-types-2.",
        ("pydoc-sequence-types-2",),
    ),
    Question(
        "q08", "What error do I get when I look up a dictionary key that does not exist?",
        ("KeyError",), "pydoc-typesmapping-4", ("pydoc-sequence-types-4",),
        "pydoc-sequence-types-4: for mappings, __getitem__ raises KeyError for a missing "
        "key. Not holes: pydoc-typesmapping-5/6/7 (KeyError from del, pop, popitem).",
    ),
    Question(
        "q09", "What exception does a failing assert statement raise?",
        ("AssertionError",), "pydoc-assert-1", (),
        "Only the judged passage answers.",
    ),
    Question(
        "q10", "What does the pass statement do?",
        ("null operation", "nothing happens"), "pydoc-pass-1", (),
        "Only the judged passage answers.",
    ),
    Question(
        "q11", "Which attribute of a class holds its method resolution order?",
        ("__mro__",), "pydoc-specialattrs-1", (),
        "Only the judged passage answers. Not holes: pydoc-attribute-access-11 uses "
        "__mro__ without explaining it; pydoc-types-29 describes the C3 order.",
    ),
    Question(
        "q12", "What encoding does str.encode() use by default?",
        ("utf-8",), "pydoc-string-methods-3", (),
        "Only the judged passage answers. Not a hole: pydoc-types-37 (utf-8 byte offsets).",
    ),
)


def contains(passage: dict, answer: str) -> bool:
    return answer.lower() in passage["text"].lower()


def check(corpus: list[dict], questions: tuple[Question, ...]) -> None:
    """Fail unless ids are unique and every judged passage and hole holds an answer."""
    passages = {p["_id"]: p for p in corpus}
    problems = []
    if len(passages) != len(corpus):
        problems.append("duplicate passage ids")
    if len({q.id for q in questions}) != len(questions):
        problems.append("duplicate question ids")
    for q in questions:
        for doc_id in (q.judged, *q.holes, *q.partial):
            if doc_id not in passages:
                problems.append(f"{q.id}: no passage {doc_id}")
        if q.judged in q.holes:
            problems.append(f"{q.id}: judged passage listed as a hole")
        if q.judged in passages:
            problems += [f"{q.id}: '{a}' not in {q.judged}"
                         for a in q.answers if not contains(passages[q.judged], a)]
        problems += [f"{q.id}: no answer in {h}" for h in q.holes
                     if h in passages and not any(contains(passages[h], a) for a in q.answers)]
    if problems:
        sys.exit("demo dataset check failed:\n  " + "\n  ".join(problems))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_dataset(corpus: list[dict], questions: tuple[Question, ...], out: Path) -> None:
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "corpus.jsonl", corpus)
    write_jsonl(out / "queries.jsonl",
                [{"_id": q.id, "text": q.text, "answers": list(q.answers)} for q in questions])
    qrels = ["query-id\tcorpus-id\tscore"] + [f"{q.id}\t{q.judged}\t1" for q in questions]
    (out / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    write_jsonl(out / "holes.jsonl",
                [{"query_id": q.id, "doc_ids": list(q.holes), "partial": list(q.partial), "note": q.note}
                 for q in questions])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="the folder to write (default: the shipped demo's)")
    args = parser.parse_args()
    if sys.version_info[:3] != PYTHON_VERSION:
        sys.exit(f"run with Python {'.'.join(map(str, PYTHON_VERSION))}: the passages "
                 "and judgements are tied to that release's pydoc_data")
    corpus = build_corpus()
    check(corpus, QUESTIONS)
    write_dataset(corpus, QUESTIONS, args.out)
    holes = sum(len(q.holes) for q in QUESTIONS)
    print(f"{len(corpus)} passages, {len(QUESTIONS)} questions, {holes} holes -> {args.out}")


if __name__ == "__main__":
    main()
