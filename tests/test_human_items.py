"""What the annotation page shows (issue 13): attention checks that look like real items, quotes
the chunk does not contain marked as such, highlighting that scales with matches, not chunk size."""

from __future__ import annotations

import html
import random
import re
import time
import tracemalloc
from html.parser import HTMLParser

import pytest

from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.items import highlight
from bridge_assets.lake import store
from fixtures.escalated_set import CORPUS, ESCALATED
from fixtures.human_app import expected_of, login, make_client, post_answer, served_pair
from fixtures.paths import annotations, location


@pytest.fixture
def tokens(escalated_lake) -> dict[str, str]:
    with annotations() as con:
        return {name: add_annotator(con, name) for name in ("ann", "bob", "cat", "dan")}


class Skeleton(HTMLParser):
    """The page's elements (tag, class, id) in order, text and attribute values aside; the
    highlights of one chunk in any order (real items quote A before B or B before A)."""

    def __init__(self, page: str):
        super().__init__()
        self.tags: list[tuple[str, str, str]] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append((tag, attributes.get("class") or "", attributes.get("id") or ""))

    def shape(self) -> tuple:
        runs: list = []
        for tag in self.tags:
            if tag[0] == "mark" and runs and isinstance(runs[-1], list):
                runs[-1].append(tag)
            else:
                runs.append([tag] if tag[0] == "mark" else tag)
        return tuple(tuple(sorted(r)) if isinstance(r, list) else r for r in runs)


def quotes_of(page: str) -> list[str]:
    return [html.unescape(q) for q in re.findall(r"<blockquote[^>]*>(.*?)</blockquote>", page)]


def test_an_attention_check_quotes_its_own_chunk_and_looks_like_a_real_item(escalated_lake, tokens):
    real_shapes = set()
    for name in ("bob", "cat"):  # every real item, as served
        client = make_client(escalated_lake)
        login(client, tokens[name])
        for _ in ESCALATED:
            page = client.get("/annotate").text
            real_shapes.add(Skeleton(page).shape())
            post_answer(client, page, 1)
    checks = make_client(escalated_lake, attention_rate=1.0, seed=5)
    login(checks, tokens["ann"])
    served = set()
    for _ in range(6):
        page = checks.get("/annotate").text
        query_id, doc_id, is_check = served_pair(escalated_lake, page)
        assert is_check
        served.add((query_id, doc_id))
        quotes = quotes_of(page)
        assert quotes and all(q in CORPUS[doc_id] for q in quotes), (doc_id, quotes)
        assert page.count("<mark") >= 3  # the legend's agents, and their quotes in the chunk
        assert "not in the chunk" not in page and f"about {query_id}/" not in page
        assert Skeleton(page).shape() in real_shapes
        assert quotes_of(checks.get("/annotate").text) == quotes  # the same on reload
        assert post_answer(checks, page, expected_of(escalated_lake, page)).status_code == 303
    assert len(served) >= 3


def test_without_history_no_item_shows_a_debate(escalated_lake, tokens):
    for rate, name in ((0.0, "ann"), (1.0, "bob")):
        client = make_client(escalated_lake, with_history=False, attention_rate=rate)
        login(client, tokens[name])
        page = client.get("/annotate").text
        assert served_pair(escalated_lake, page)[2] == bool(rate)
        assert 'id="no-history"' in page and "<blockquote" not in page and "<mark" not in page


def test_a_quote_the_chunk_does_not_contain_is_marked_in_words(escalated_lake, tokens):
    own_words = "Agent A says len counts the characters of anything."
    reflowed = "calling LEN on them\n asks the object for its size"
    with store.connect(location()) as con:
        con.execute("update debate_turns set reference = ? where query_id = 'q1' and doc_id = 'd5' "
                    "and agent = 'A' and round = 1", [[own_words, reflowed]])
    client = make_client(escalated_lake)
    login(client, tokens["ann"])
    page = client.get("/annotate").text
    assert served_pair(escalated_lake, page)[:2] == ("q1", "d5")
    marked = re.findall(r'<blockquote class="not-in-chunk">(.*?)</blockquote>', page, re.S)
    assert marked == [f'{own_words} <span class="missing">(not in the chunk)</span>']
    assert f"<blockquote>{reflowed}</blockquote>" in page  # case and line breaks aside, it is there
    assert page.count("(not in the chunk)") == 1


# --- highlighting ---------------------------------------------------------------------------------

def per_character_highlight(text, quotes_by_agent):
    """The reference: who quoted each character, then runs of equal owners."""
    owners = [set() for _ in text]
    for agent, quotes in quotes_by_agent.items():
        for quote in quotes:
            words = quote.split()
            if words:
                for match in re.finditer(r"\s+".join(map(re.escape, words)), text, re.IGNORECASE):
                    for i in range(*match.span()):
                        owners[i].add(agent)
    runs = []
    for i, char in enumerate(text):
        if runs and owners[i] == runs[-1][1]:
            runs[-1][0] += char
        else:
            runs.append([char, owners[i]])
    return [(t, tuple(sorted(o))) for t, o in runs]


def test_highlight_agrees_with_a_per_character_reference():
    rng = random.Random(13)
    words = ["alpha", "beta", "Gamma", "delta", "eps", "zeta"]
    for _ in range(300):
        text = "".join(rng.choice(words) + rng.choice([" ", "  ", "\n", ". "]) for _ in range(rng.randint(0, 30)))
        quotes = {agent: [" ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
                          for _ in range(rng.randint(0, 4))] for agent in "ABC"[:rng.randint(1, 3)]}
        got = [(s.text, s.agents) for s in highlight(text, quotes)]
        assert got == per_character_highlight(text, quotes), (text, quotes)


def test_highlighting_a_200_kb_chunk_with_many_quotes_is_fast_and_allocates_per_match():
    sentences = [f"Sentence {i} is about topic {i % 97} and item {i * 7 % 1009}." for i in range(4500)]
    text = " ".join(sentences)
    assert len(text) > 200_000
    quotes = {"A": sentences[::40], "B": sentences[20::40] + ["topic 5 and"],  # ~50 matches
              "C": [s[10:] for s in sentences[::45]]}                           # overlaps A
    tracemalloc.start()
    started = time.perf_counter()
    segments = highlight(text, quotes)
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert elapsed < 5.0
    # per-character bookkeeping needs a set per character (~40 MB here); intervals need far less
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB"
    assert "".join(s.text for s in segments) == text
    marked = {s.text: s.agents for s in segments if s.agents}
    assert marked[sentences[40]] == ("A",) and marked[sentences[20]] == ("B",)
    assert marked[sentences[0][:11]] == ("A",) and marked[sentences[0][11:]] == ("A", "C")
