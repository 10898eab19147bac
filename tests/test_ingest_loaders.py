"""Dataset loaders: real datasets' counts, every local format, and every kind of bad input."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from bridge_assets.ingest.errors import DatasetError, SourceUnreachable
from bridge_assets.ingest.loaders import (
    load_beir_folder,
    load_bridge_release,
    load_dataset,
    load_nq_open,
    load_trec,
    read_trec_topics,
)
from bridge_assets.registry.datasets import DatasetSpec, get_dataset, load_registry
from fixtures.datasets import READERS, valid_line2, write_beir, write_kind
from fixtures.paths import shared_data


def test_demo_dataset_ships_with_answers_and_one_judgment_per_query():
    tables = load_dataset(get_dataset("demo"))
    counts = tables.counts()
    assert 200 <= counts["documents"] <= 400
    assert 10 <= counts["queries"] <= 20
    assert counts["queries_with_answers"] == counts["queries"]
    assert counts["qrels"] == counts["queries"]
    judged = tables.qrels.join(tables.corpus, on="doc_id").join(
        tables.queries.rename({"text": "question"}), on="query_id")
    for row in judged.iter_rows(named=True):  # every gold answer occurs in its judged passage
        assert any(a.lower() in row["text"].lower() for a in row["answers"]), row["query_id"]


def test_nq_open_mini_counts():
    tables = load_nq_open(shared_data("nq_open_mini/nq-open-oracle.jsonl.gz"))
    assert tables.queries.height == 2655
    assert tables.counts()["queries_with_answers"] == 2655
    assert tables.qrels.height == 2655
    # identical gold passages are merged into one document, keeping every question's qrel
    assert tables.corpus.height == tables.qrels["doc_id"].n_unique()
    assert tables.corpus.height == 2599  # 56 passages are gold for several questions
    assert tables.corpus["doc_id"].is_unique().all()


def test_scifact_counts():
    tables = load_beir_folder(shared_data("scifact"), "test")
    assert (tables.corpus.height, tables.queries.height, tables.qrels.height) == (5183, 300, 339)


def test_registry_lists_the_shipped_datasets():
    registry = load_registry()
    assert {"demo", "nq_open_mini", "scifact"} <= set(registry)
    assert registry["nq_open_mini"].kind == "nq_open"


def test_beir_answers_from_a_separate_file(tmp_path):
    folder = write_beir(tmp_path / "b", queries=[{"_id": "q1", "text": "a?"}, {"_id": "q2", "text": "b?"}])
    (folder / "answers.jsonl").write_text('{"query_id": "q1", "answers": ["Paris"]}\n')
    tables = load_beir_folder(folder)
    assert tables.queries.filter(tables.queries["query_id"] == "q1")["answers"].to_list() == [["Paris"]]
    assert tables.queries.filter(tables.queries["query_id"] == "q2")["answers"].to_list() == [[]]


def test_trec_topics_and_qrels(tmp_path):
    (tmp_path / "docs.tsv").write_text("d1\tParis is in France\nd2\tBerlin is in Germany\n")
    (tmp_path / "topics.txt").write_text(
        "<top>\n<num> Number: 301\n<title> french capital\n<desc> ...\n</top>\n"
        "<top>\n<num> Number: 302\n<title> german capital\n</top>\n")
    (tmp_path / "qrels.txt").write_text("301 0 d1 1\n302 0 d2 2\n302 0 d1 0\n")
    tables = load_trec(tmp_path / "docs.tsv", tmp_path / "topics.txt", tmp_path / "qrels.txt", None)
    assert tables.queries["query_id"].to_list() == ["301", "302"]
    assert tables.queries["text"].to_list() == ["french capital", "german capital"]
    assert sorted(tables.qrels["relevance"].to_list()) == [0, 1, 2]


TOPICS = """<top>
<num> Number: 301
<title> Topic: international organized crime
<desc> Description:
Identify organizations that take part in
international criminal activity.
<narr> Narrative:
A relevant document names an organization
and its activity; mere mentions are not relevant.
</top>
<top><num>302</num><title>poliomyelitis</title><desc>Is polio coming back?</desc></top>
<top>
<num>303</num>
<title>hubble telescope</title>
</top>
"""


def _trec(tmp_path, query_field: str = "title"):
    (tmp_path / "docs.tsv").write_text("d1\tCrime syndicates\nd2\tPolio cases\n")
    (tmp_path / "topics.txt").write_text(TOPICS)
    (tmp_path / "qrels.txt").write_text("301 0 d1 3\n302 0 d2 2\n303 0 d1 0\n")
    return load_trec(tmp_path / "docs.tsv", tmp_path / "topics.txt", tmp_path / "qrels.txt", None,
                     query_field)


def test_trec_topics_keep_title_description_and_narrative(tmp_path):
    queries = _trec(tmp_path).queries.drop("definition")
    assert queries.rows() == [
        ("301", "international organized crime", [],
         "Identify organizations that take part in international criminal activity.",
         "A relevant document names an organization and its activity; mere mentions are not relevant."),
        ("302", "poliomyelitis", [], "Is polio coming back?", None),  # closing tags end the fields
        ("303", "hubble telescope", [], None, None)]


@pytest.mark.parametrize("query_field, expected", [
    ("description", "Is polio coming back?"), ("title_description", "poliomyelitis Is polio coming back?")])
def test_query_field_picks_the_topic_field_that_is_the_query(tmp_path, query_field, expected):
    topics = TOPICS.replace("<top>\n<num>303</num>\n<title>hubble telescope</title>\n</top>\n", "")
    (tmp_path / "docs.tsv").write_text("d1\tx\nd2\ty\n")
    (tmp_path / "topics.txt").write_text(topics)
    (tmp_path / "qrels.txt").write_text("302 0 d2 2\n")
    queries = load_trec(tmp_path / "docs.tsv", tmp_path / "topics.txt", tmp_path / "qrels.txt", None,
                        query_field).queries
    assert queries.filter(queries["query_id"] == "302")["text"].to_list() == [expected]
    assert queries["description"].null_count() == 0  # the description stays beside the query


def test_a_query_field_the_topics_lack_is_named(tmp_path):
    with pytest.raises(DatasetError, match=r'topics.txt, line 12, field "desc": query_field '
                                           r'description needs a <desc>'):
        _trec(tmp_path, "description")
    (tmp_path / "topics.tsv").write_text("301\tcrime\n")
    with pytest.raises(DatasetError, match="TSV topics have a title only"):
        load_trec(tmp_path / "docs.tsv", tmp_path / "topics.tsv", tmp_path / "qrels.txt", None,
                  "description")


def test_query_field_and_label_scale_are_registry_fields(tmp_path):
    _trec(tmp_path)
    spec = DatasetSpec(name="t", kind="trec", corpus=str(tmp_path / "docs.tsv"),
                       topics=str(tmp_path / "topics.txt"), qrels=str(tmp_path / "qrels.txt"),
                       query_field="title_description", label_scale="graded")
    with pytest.raises(DatasetError, match="line 12"):  # topic 303 has no <desc>
        load_dataset(spec)
    assert DatasetSpec(name="b", kind="beir", path="x").label_scale == "binary"
    with pytest.raises(ValueError, match="query_field description applies to kind trec"):
        DatasetSpec(name="b", kind="beir", path="x", query_field="description")
    with pytest.raises(ValueError):
        DatasetSpec(name="b", kind="beir", path="x", label_scale="fine")


def test_other_loaders_leave_description_and_narrative_null(tmp_path):
    tables = load_beir_folder(write_beir(tmp_path / "b"))
    assert tables.queries.columns == ["query_id", "text", "answers", "description", "narrative", "definition"]
    assert tables.queries["description"].null_count() == tables.queries["narrative"].null_count() == 2


def test_a_query_line_may_state_its_own_relevance_definition(tmp_path):
    folder = write_beir(tmp_path / "b")
    lines = (folder / "queries.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "definition": "  A passage   naming the year counts. "})
    (folder / "queries.jsonl").write_text("\n".join(lines) + "\n")
    queries = load_beir_folder(folder).queries
    assert queries["definition"].to_list() == ["A passage naming the year counts.", None]
    lines[0] = json.dumps({**first, "definition": "   "})
    (folder / "queries.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match="queries.jsonl, line 1, field 'definition'|definition"):
        load_beir_folder(folder)


def test_bridge_release_layout(tmp_path):
    (tmp_path / "corpus.jsonl").write_text('{"_id": "c1", "text": "x"}\n{"_id": "c2", "text": "y"}\n')
    (tmp_path / "bridge.jsonl").write_text(
        '{"q_id": "7", "query": "what?", "doc_id": ["c1", "c2"], "answers": ["x"]}\n')
    tables = load_bridge_release(tmp_path / "bridge.jsonl", tmp_path / "corpus.jsonl")
    assert tables.qrels.height == 2 and tables.queries["answers"].to_list() == [["x"]]


@pytest.mark.parametrize("case, expected", [
    ("malformed_json", "corpus.jsonl, line 2: malformed JSON"),
    ("duplicate_id", 'corpus.jsonl, line 2, field "_id": duplicate id "d1" (first on line 1)'),
    ("unknown_doc", 'test.tsv, line 3, field "corpus-id": unknown document "d9"'),
    ("missing_file", "queries.jsonl: file not found"),
    ("empty_text", 'queries.jsonl, line 1, field "text": empty value'),
])
def test_bad_input_names_file_line_and_problem(tmp_path, case, expected):
    folder = tmp_path / "bad"
    if case == "malformed_json":
        write_beir(folder, corpus=[{"_id": "d1", "text": "x"}, '{"_id": "d2", "text": '])
    elif case == "duplicate_id":
        write_beir(folder, corpus=[{"_id": "d1", "text": "x"}, {"_id": "d1", "text": "y"}])
    elif case == "unknown_doc":
        write_beir(folder, qrels=["q1\td1\t1", "q2\td9\t1"])
    elif case == "missing_file":
        write_beir(folder)
        (folder / "queries.jsonl").unlink()
    elif case == "empty_text":
        write_beir(folder, queries=[{"_id": "q1", "text": "  "}])
    with pytest.raises(DatasetError) as error:
        load_beir_folder(folder)
    assert expected in str(error.value)
    assert str(folder) in str(error.value)


def test_unknown_dataset_name_lists_known_ones():
    with pytest.raises(DatasetError, match=r"unknown dataset 'nope' \(known: .*demo"):
        get_dataset("nope")


def test_nq_open_line_without_answers(tmp_path):
    path = tmp_path / "nq.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps({"question": "q", "answers": ["a"], "ctxs": [
            {"title": "t", "text": "a", "isgold": True}]}) + "\n")
        handle.write(json.dumps({"question": "q2", "answers": [], "ctxs": []}) + "\n")
    with pytest.raises(DatasetError, match=r'line 2, field "answers": question without answers'):
        load_nq_open(path)


@pytest.mark.parametrize("spec", [
    DatasetSpec(name="hub", kind="huggingface", id="DISLab/BRIDGE"),
    DatasetSpec(name="zip", kind="beir_url",
                url="https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/scifact.zip"),
    DatasetSpec(name="ird", kind="ir_datasets", id="beir/scifact/test"),
])
def test_remote_sources_fail_fast_when_unreachable(spec, data_lake, monkeypatch):
    monkeypatch.setenv("IR_DATASETS_HOME", str(data_lake / "ir_datasets"))
    started = time.monotonic()
    with pytest.raises(SourceUnreachable, match="unreachable"):
        load_dataset(spec, data_lake / "downloads")
    assert time.monotonic() - started < 30


def test_a_remote_source_is_fetched_only_into_a_downloads_folder_it_is_handed():
    """The ingest asset hands its store's downloads/ folder; no lake is looked up from here."""
    with pytest.raises(DatasetError, match="downloads/ folder"):
        load_dataset(DatasetSpec(name="hub", kind="huggingface", id="DISLab/BRIDGE"))


# --- damage on ingest: quotes, encodings, sizes, numbers ------------------------------------

def test_tsv_quotes_are_text_and_never_merge_lines(tmp_path):
    passages = ['"Quoted at the start, and the quote never closes', 'He said "hi" mid-text',
                'plain', '"fully quoted"', 'ends with a quote"']
    (tmp_path / "docs.tsv").write_text("".join(f"d{i}\t{p}\n" for i, p in enumerate(passages)))
    (tmp_path / "topics.tsv").write_text('1\t"what did he say?\n')
    (tmp_path / "qrels.txt").write_text("1 0 d1 1\n")
    tables = load_trec(tmp_path / "docs.tsv", tmp_path / "topics.tsv", tmp_path / "qrels.txt", None)
    assert tables.corpus["text"].to_list() == passages
    assert tables.queries["text"].to_list() == ['"what did he say?']


def test_tsv_field_over_csv_field_size_limit_loads(tmp_path):
    text = "word " * 60_000  # 300,000 characters, over csv's 131,072 limit
    (tmp_path / "docs.tsv").write_text(f"d1\t{text}\n")
    (tmp_path / "topics.tsv").write_text("1\tq\n")
    (tmp_path / "qrels.txt").write_text("1 0 d1 1\n")
    tables = load_trec(tmp_path / "docs.tsv", tmp_path / "topics.tsv", tmp_path / "qrels.txt", None)
    assert tables.corpus["text"].to_list() == [text.strip()]


@pytest.mark.parametrize("ending", ["\r\n", "\r"])
def test_windows_and_old_mac_line_endings(tmp_path, ending):
    (tmp_path / "docs.tsv").write_bytes(f"\ufeffd1\tone{ending}d2\ttwo{ending}".encode())
    (tmp_path / "topics.tsv").write_bytes(f"1\tq{ending}".encode())
    (tmp_path / "qrels.txt").write_bytes(f"1 0 d1 1{ending}1 0 d2 0{ending}".encode())
    tables = load_trec(tmp_path / "docs.tsv", tmp_path / "topics.tsv", tmp_path / "qrels.txt", None)
    # the byte order mark is not part of the first id
    assert tables.corpus["doc_id"].to_list() == ["d1", "d2"]
    assert tables.corpus["text"].to_list() == ["one", "two"]


@pytest.mark.parametrize("kind, damaged", READERS)
def test_every_reader_loads_its_valid_file(tmp_path, kind, damaged):
    tables = load_dataset(write_kind(tmp_path, kind, damaged, valid_line2(kind, damaged)))
    assert tables.queries.height == 2 and tables.qrels.height == 2


@pytest.mark.parametrize("kind, damaged", READERS)
def test_a_byte_that_is_not_utf8_names_file_and_line(tmp_path, kind, damaged):
    line = valid_line2(kind, damaged)
    spec = write_kind(tmp_path, kind, damaged, line + b" caf\xe9")
    with pytest.raises(DatasetError) as error:
        load_dataset(spec)
    assert f"{tmp_path / damaged}, line 2: not UTF-8 text (byte 0xe9 at byte {len(line) + 5} " \
        in str(error.value)


@pytest.mark.parametrize("kind, damaged", READERS)
def test_a_line_over_the_cap_names_file_and_line(tmp_path, kind, damaged, monkeypatch):
    monkeypatch.setenv("BRIDGE_MAX_LINE_BYTES", "100")
    spec = write_kind(tmp_path, kind, damaged, valid_line2(kind, damaged) + b" " * 101)
    with pytest.raises(DatasetError, match=r"line 2: line longer than 100 bytes") as error:
        load_dataset(spec)
    assert str(tmp_path / damaged) in str(error.value)


def test_the_dataset_entry_overrides_the_environment_cap(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_MAX_TEXT_CHARS", "1")
    spec = write_kind(tmp_path, "beir", "corpus.jsonl", b'{"_id": "d2", "text": "' + b"x" * 30 + b'"}')
    with pytest.raises(DatasetError, match="over the cap of 1 "):
        load_dataset(spec)
    capped = spec.model_copy(update={"max_text_chars": 20})
    with pytest.raises(DatasetError) as error:
        load_dataset(capped)
    assert f'{tmp_path / "corpus.jsonl"}, line 2, field "text": text of 30 characters is over ' \
        'the cap of 20' in str(error.value)
    assert load_dataset(spec.model_copy(update={"max_text_chars": 30})).corpus.height == 2


@pytest.mark.parametrize("kind, damaged, field", [
    ("trec_top", "topics.txt", "title"), ("nq_open", "nq.jsonl.gz", "ctxs.text"),
    ("bridge_release", "bridge.jsonl", "query"), ("trec_tsv", "docs.tsv", "text")])
def test_a_text_over_the_cap_names_file_line_and_field(tmp_path, kind, damaged, field):
    long = "y" * 50
    line2 = {"topics.txt": f"<num> Number: 1 <title> {long}", "docs.tsv": f"d2\t{long}",
             "bridge.jsonl": json.dumps({"q_id": "2", "query": long, "doc_id": ["c2"]}),
             "nq.jsonl.gz": json.dumps({"question": "q2?", "answers": ["a"], "ctxs": [{"text": long}]}),
             }[damaged].encode()
    spec = write_kind(tmp_path, kind, damaged, line2).model_copy(update={"max_text_chars": 49})
    with pytest.raises(DatasetError, match=f'line [12], field "{field}": text of 50 characters'):
        load_dataset(spec)


def test_registry_entry_takes_the_caps(tmp_path):
    registry = tmp_path / "datasets.yaml"
    registry.write_text("datasets:\n  mine:\n    kind: beir\n    path: x\n    max_line_bytes: 1000\n"
                        "    max_text_chars: 500\n")
    spec = load_registry(registry)["mine"]
    assert (spec.max_line_bytes, spec.max_text_chars) == (1000, 500)
    registry.write_text("datasets:\n  mine:\n    kind: beir\n    path: x\n    max_text_chars: 0\n")
    with pytest.raises(DatasetError, match="(?s)invalid entry 'mine'.*max_text_chars"):
        load_registry(registry)


def test_a_bad_cap_in_the_environment_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_MAX_LINE_BYTES", "8MB")
    with pytest.raises(DatasetError, match="BRIDGE_MAX_LINE_BYTES='8MB' is not a positive whole number"):
        load_beir_folder(write_beir(tmp_path / "b"))


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", "3000000000", "1.5", "-"])
@pytest.mark.parametrize("kind, damaged, field", [("trec_tsv", "qrels.txt", "rel"),
                                                  ("beir", "qrels/test.tsv", "score")])
def test_a_relevance_that_is_not_a_32_bit_whole_number_names_file_line_and_field(
        tmp_path, kind, damaged, field, value):
    sep = " " if kind.startswith("trec") else "\t"
    line2 = valid_line2(kind, damaged).rsplit(sep.encode(), 1)[0] + f"{sep}{value}".encode()
    with pytest.raises(DatasetError) as error:
        load_dataset(write_kind(tmp_path, kind, damaged, line2))
    assert f'{tmp_path / damaged}, line 2, field "{field}": relevance "{value}" is not a' \
        in str(error.value)


def test_whole_relevance_written_as_float_or_negative_loads(tmp_path):
    (tmp_path / "docs.tsv").write_text("d1\tone\nd2\ttwo\n")
    (tmp_path / "topics.tsv").write_text("1\tq\n")
    (tmp_path / "qrels.txt").write_text("1 0 d1 2.0\n1 0 d2 -1\n")
    tables = load_trec(tmp_path / "docs.tsv", tmp_path / "topics.tsv", tmp_path / "qrels.txt", None)
    assert tables.qrels["relevance"].to_list() == [2, -1]


@pytest.mark.parametrize("line2, problem", [
    (b'{"_id": "d2", "text": "\\ud800"}', "lone UTF-16 surrogate"),
    (b'{"_id": "d2", "text": "x", "n": ' + b"9" * 5000 + b"}", "malformed JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "malformed JSON"),
])
def test_json_that_python_parses_but_is_not_data_names_file_and_line(tmp_path, line2, problem):
    with pytest.raises(DatasetError, match=f"corpus.jsonl, line 2: .*{problem}"):
        load_dataset(write_kind(tmp_path, "beir", "corpus.jsonl", line2))


def test_nq_open_passages_must_be_objects(tmp_path):
    spec = write_kind(tmp_path, "nq_open", "nq.jsonl.gz",
                      b'{"question": "q2?", "answers": ["two"], "ctxs": ["two"]}')
    with pytest.raises(DatasetError, match='line 2, field "ctxs": expected a list of passage objects'):
        load_dataset(spec)


def test_beir_metadata_that_is_not_an_object_is_ignored(tmp_path):
    spec = write_kind(tmp_path, "beir", "queries.jsonl",
                      b'{"_id": "q2", "text": "second?", "metadata": "none"}')
    assert load_dataset(spec).queries.height == 2


def test_a_damaged_gzip_file_names_file_and_line(tmp_path):
    spec = write_kind(tmp_path, "nq_open", "nq.jsonl.gz", valid_line2("nq_open", "nq.jsonl.gz"))
    data = (tmp_path / "nq.jsonl.gz").read_bytes()
    (tmp_path / "nq.jsonl.gz").write_bytes(data[:-12])  # cut off the end of the stream
    with pytest.raises(DatasetError, match=r"nq.jsonl.gz, line \d+: cannot read the file"):
        load_dataset(spec)
    (tmp_path / "nq.jsonl.gz").write_bytes(b"not gzip at all\n")
    with pytest.raises(DatasetError, match=r"nq.jsonl.gz, line 1: cannot read the file"):
        load_dataset(spec)


def test_a_top_without_its_end_tag_is_named_not_merged_into_the_next(tmp_path):
    spec = write_kind(tmp_path, "trec_top", "topics.txt", b"<num> Number: 1")
    topics = tmp_path / "topics.txt"
    topics.write_text(topics.read_text().replace("</top>", "", 1))
    with pytest.raises(DatasetError, match=r"topics.txt, line 1: <top> without </top>"):
        load_dataset(spec)
    topics.write_text(topics.read_text() + "\n<top>\n<num> Number: 3\n")
    with pytest.raises(DatasetError, match=r"topics.txt, line 1: <top> without </top>"):
        load_dataset(spec)


def test_topics_with_long_whitespace_load_in_linear_time(tmp_path):
    spaces = " " * 100_000
    spec = write_kind(tmp_path, "trec_top", "topics.txt", f"<num>{spaces}1 <title> a{spaces}b".encode())
    started = time.monotonic()
    assert load_dataset(spec).queries["text"].to_list()[0] == f"a{spaces}b"
    (tmp_path / "topics.txt").write_text(f"<top><num>{spaces}</top>\n")
    with pytest.raises(DatasetError, match="topic without <num> or <title>"):
        load_dataset(spec)
    assert time.monotonic() - started < 5  # a backtracking pattern takes minutes here


def test_answers_for_an_unknown_query_name_their_line(tmp_path):
    spec = write_kind(tmp_path, "beir", "answers.jsonl", b'{"query_id": "q9", "answers": ["x"]}')
    with pytest.raises(DatasetError) as error:
        load_dataset(spec)
    assert f'{tmp_path / "answers.jsonl"}, line 2, field "query_id": answers for unknown query "q9"' \
        in str(error.value)


def test_a_topic_whose_top_is_missing_is_refused_with_the_line_of_its_fields(tmp_path):
    topics = "".join(f"<top>\n<num> Number: {n}\n<title> topic {n}\n<desc> Description:\nabout {n}\n</top>\n\n"
                     for n in range(1, 6))
    lost = topics.replace("<top>\n<num> Number: 3", "<num> Number: 3", 1)  # 5 topics, one <top> gone
    path = tmp_path / "topics.txt"
    path.write_text(lost)
    line = lost[:lost.index("<num> Number: 3")].count("\n") + 1
    with pytest.raises(DatasetError, match=rf"topics.txt, line {line}, field \"num\": <num> outside a <top>"):
        read_trec_topics(path)
    path.write_text("<title> before any topic\n" + topics)
    with pytest.raises(DatasetError, match=r"topics.txt, line 1, field \"title\": <title> outside"):
        read_trec_topics(path)
    path.write_text(topics + "<narr> after the last topic\n")
    with pytest.raises(DatasetError, match=rf"line {topics.count(chr(10)) + 1}, field \"narr\""):
        read_trec_topics(path)
    path.write_text("# a comment outside the blocks is fine\n" + topics)
    assert read_trec_topics(path)["query_id"].to_list() == ["1", "2", "3", "4", "5"]
