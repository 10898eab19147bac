"""Fuzzed input for every local reader: each one loads, or raises DatasetError naming the file and
the line, never any other exception. Random bytes, text in other encodings, quotes, lines over
the cap, malformed JSON/TSV/TREC and random mutations of a valid file.

The number of examples is bounded (BRIDGE_FUZZ_EXAMPLES, 40 by default) so the file stays fast."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge_assets.ingest.errors import DatasetError
from bridge_assets.ingest.loaders import load_dataset
from fixtures.datasets import READERS, valid_line2, write_kind

FUZZ = settings(max_examples=int(os.environ.get("BRIDGE_FUZZ_EXAMPLES", "40")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Small caps, so that lines and texts over them are cheap to make.
CAPS = {"max_line_bytes": 2048, "max_text_chars": 300}

FRAGMENTS = ['{', '}', '[', ']', ',', ':', '"', "'", '\\', '\\"', '\\ud800', '\\ud83d\\ude00', '\t',
             ' ', '\x00', '\x0b', '\u2028', '\ufeff', '_id', '"_id": ', '"text": ', '"title": ',
             '"query_id": ', '"q_id": ', '"query": ', '"doc_id": ', '"answers": ', '"question": ',
             '"ctxs": ', '"isgold": true', '"metadata": ', 'd1', 'd2', 'q1', 'q2', 'c1', '1', '2', '0',
             '-1', 'inf', '-inf', 'nan', 'NaN', 'Infinity', '1e999', '1.5', '3000000000', '9' * 5000,
             'null', 'true', '<top>', '</top>', '<num>', 'Number:', '<title>', 'Topic:', '</title>',
             '#', 'query-id\tcorpus-id\tscore', 'x' * 3000]
NEWLINES = ["\n", "\r\n", "\r"]
ENCODINGS = ["utf-8", "latin-1", "cp1252", "utf-16", "utf-16-le", "utf-32", "utf-8-sig"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10)
json_records = st.dictionaries(
    st.sampled_from(["_id", "doc_id", "id", "text", "contents", "title", "query_id", "q_id", "query",
                     "question", "answers", "ctxs", "metadata", "isgold"]), json_values, max_size=6)


def assert_loads_or_names_file_and_line(kind: str, damaged: str, content: bytes, *,
                                        raw: bool = False) -> None:
    """Replace file `damaged` by `content` (gzipped when its name says so, unless `raw`)."""
    if damaged.endswith(".gz") and not raw:
        content = gzip.compress(content)
    with tempfile.TemporaryDirectory() as folder:
        spec = write_kind(Path(folder), kind, damaged, valid_line2(kind, damaged))
        (Path(folder) / damaged).write_bytes(content)
        try:
            load_dataset(spec.model_copy(update=CAPS))
        except DatasetError as error:
            assert error.file and error.line is not None, str(error)
            assert str(error).startswith(f"{error.file}, line {error.line}")


readers = st.sampled_from(READERS)


@FUZZ
@given(readers, st.binary(max_size=3000), st.booleans())
def test_random_bytes(reader, content, raw):
    assert_loads_or_names_file_and_line(*reader, content, raw=raw)


@FUZZ
@given(readers, st.text(max_size=400), st.sampled_from(ENCODINGS))
def test_text_in_other_encodings(reader, text, encoding):
    assert_loads_or_names_file_and_line(*reader, text.encode(encoding, errors="replace"))


@FUZZ
@given(readers, st.lists(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=12),
                         max_size=8), st.sampled_from(NEWLINES))
def test_malformed_lines_of_fragments(reader, lines, newline):
    content = newline.join("".join(parts) for parts in lines)
    assert_loads_or_names_file_and_line(*reader, content.encode())


@FUZZ
@given(readers, st.lists(json_records, max_size=5))
def test_json_records_with_values_of_any_type(reader, records):
    content = "\n".join(json.dumps(r) for r in records)
    assert_loads_or_names_file_and_line(*reader, content.encode())


@FUZZ
@given(readers, st.data())
def test_mutations_of_a_valid_file(reader, data):
    kind, damaged = reader
    with tempfile.TemporaryDirectory() as folder:
        write_kind(Path(folder), kind, damaged, valid_line2(kind, damaged))
        content = bytearray((Path(folder) / damaged).read_bytes())
    if damaged.endswith(".gz"):
        content = bytearray(gzip.decompress(content))
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(content)))
        insert = data.draw(st.sampled_from([f.encode() for f in FRAGMENTS[:40]]) | st.binary(max_size=3))
        content[at:at + data.draw(st.integers(0, 4))] = insert
    assert_loads_or_names_file_and_line(kind, damaged, bytes(content))
