"""A real browser: Debian's chromium, headless, driven by Playwright (never `playwright install`).

Three annotators log in to the annotation app (uvicorn on a free 127.0.0.1 port), label the
queue of a small escalated set with the keyboard shortcuts, answer the attention checks mixed
in, and human_labels (the plain function and the asset) then holds their majority labels.
Markup in the data (script, img onerror, javascript: links) is shown as text and never runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import pytest
from statsmodels.stats.inter_rater import fleiss_kappa as statsmodels_fleiss_kappa

from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.app import AppSettings, annotation_app
from bridge_assets.human.assets import human_labels
from bridge_assets.human.labels import compute_human_labels
from bridge_assets.lake import store
from fixtures.escalated_set import DATASET, QUERIES, write_escalated_set
from fixtures.human_app import served
from fixtures.paths import annotations, lake_resources, location, votes_db

# Debian's chromium (`make browser` installs it); BRIDGE_CHROMIUM points at another build.
CHROMIUM = Path(os.environ.get("BRIDGE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Where to keep a screenshot of the annotation page besides the test's temp folder.
SCREENSHOT_ENV = "BRIDGE_ANNOTATION_SCREENSHOT"

# Each annotator's answer per escalated pair, and the majority that must come out.
PLAN = {("q1", "d5"): {"alice": 1, "bob": 1, "carol": 0},
        ("q2", "d6"): {"alice": 0, "bob": 0, "carol": 1},
        ("q3", "d7"): {"alice": 1, "bob": 1, "carol": 1},
        ("q4", "d8"): {"alice": 0, "bob": 1, "carol": 0}}
MAJORITY = {("q1", "d5"): 1, ("q2", "d6"): 0, ("q3", "d7"): 1, ("q4", "d8"): 0}


def served_item(lake, assignment_id: str) -> tuple[tuple[str, str], bool, int | None]:
    with duckdb.connect(str(votes_db(lake)), read_only=False) as con:
        query_id, doc_id, is_check, expected = con.execute(
            "select query_id, doc_id, is_attention_check, expected_label from annotation_assignments "
            "where assignment_id = ?", [assignment_id]).fetchone()
    return (query_id, doc_id), is_check, expected


def test_three_annotators_label_the_queue_in_chromium_and_human_labels_holds_the_majority(
        data_lake, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: `make browser` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    write_escalated_set(data_lake)
    with annotations() as con:
        tokens = {name: add_annotator(con, name) for name in ("alice", "bob", "carol")}
    app = annotation_app(AppSettings(lake=location(data_lake),
                                     secret="browser-test-secret-123", attention_rate=0.25, seed=2))
    screenshot = tmp_path / "annotation_page.png"
    seen: dict[str, list[tuple[str, str]]] = {}
    checks = 0
    with served(app) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            for name, token in tokens.items():
                context = browser.new_context(viewport={"width": 1280, "height": 1000})
                page = context.new_page()
                page.goto(f"{base}/annotate")
                assert page.url == f"{base}/login"  # no session: the login page
                page.fill("#token", token)
                with page.expect_navigation():
                    page.click("button[type=submit]")
                while page.locator("#vote-form").count():
                    assignment_id = page.locator("input[name=assignment_id]").get_attribute("value")
                    pair, is_check, expected = served_item(data_lake, assignment_id)
                    assert page.inner_text("#query") == QUERIES[pair[0]][0]
                    if is_check:
                        checks += 1
                        label = expected
                    else:
                        label = PLAN[pair][name]
                        seen.setdefault(name, []).append(pair)
                        # each agent's quote is highlighted in the chunk, reasons shown by round
                        assert page.locator("#chunk mark").count() >= 1
                        assert page.locator("#history .round").count() == 2
                        if not screenshot.exists():
                            page.screenshot(path=str(screenshot), full_page=True)
                    # typing a comment with y and n in it must not trigger the shortcuts
                    page.keyboard.press("c")
                    page.keyboard.type(f"{name}: yes or no, I say {label}")
                    page.keyboard.press("Escape")
                    assert page.locator("#vote-form").count() == 1
                    with page.expect_navigation():
                        page.keyboard.press("y" if label else "n")
                assert page.locator("#done").count() == 1
                if name == "carol":  # the last one completes every pair
                    assert "4 of 4 escalated pairs have all their votes" in page.inner_text("#done")
                context.close()
        finally:
            browser.close()

    assert screenshot.stat().st_size > 10_000
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copy(screenshot, os.environ[SCREENSHOT_ENV])
    assert {name: sorted(pairs) for name, pairs in seen.items()} == \
        {name: sorted(PLAN) for name in tokens}
    assert checks >= 1  # attention checks were mixed in, and answered right

    with annotations() as con:
        result = compute_human_labels(con, DATASET)
        comments = con.execute("select annotator_id, label, comment from human_votes "
                               "where not is_attention_check").fetchall()
    assert {(r["query_id"], r["doc_id"]): r["label"] for r in result.labels.to_dicts()} == MAJORITY
    assert result.open_pairs == 0 and result.excluded_votes == 0
    assert all(comment == f"{who}: yes or no, I say {label}" for who, label, comment in comments)
    table = np.array([[3 - sum(v.values()), sum(v.values())] for v in PLAN.values()])
    assert result.kappa == pytest.approx(statsmodels_fleiss_kappa(table))

    materialized = dg.materialize([human_labels], partition_key=DATASET,
                                  resources=lake_resources(data_lake))
    assert materialized.success
    meta = materialized.asset_materializations_for_node("human_labels")[0].metadata
    assert meta["coverage"].value == 1.0 and meta["fleiss_kappa"].value == pytest.approx(result.kappa)
    with store.connect(location(data_lake)) as con:
        rows = con.execute("select query_id, doc_id, label, votes from human_labels "
                           "where dataset = ?", [DATASET]).fetchall()
    assert {(q, d): label for q, d, label, _ in rows} == MAJORITY and {r[3] for r in rows} == {3}


# Markup in every text the page shows; each payload would set window.__xss if it ran.
HOSTILE = {
    "query": 'What does <script>window.__xss = "query"</script> return?',
    "answers": ['<img src=x onerror="window.__xss = \'answer\'">', "javascript:window.__xss='url'"],
    "title": '<svg onload="window.__xss = \'title\'"></svg>',
    "chunk": ('Sized containers. <img src=x onerror="window.__xss = \'chunk\'"> Calling len '
              '<script>window.__xss = "chunk script"</script> asks the object. '
              '<a href="javascript:window.__xss=\'link\'">click me</a> Objects raise TypeError.'),
    "quote_a": '<img src=x onerror="window.__xss = \'chunk\'">',
    "quote_b": '<a href="javascript:window.__xss=\'link\'">click me</a>',
    "reason": '</p><script>window.__xss = "reason"</script><img src=x onerror="window.__xss=\'r\'">',
}


def test_markup_in_chunk_query_answers_and_debate_is_shown_as_text_and_never_runs(data_lake):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: `make browser` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    write_escalated_set(data_lake)
    with annotations() as con:
        token = add_annotator(con, "alice")
    with store.connect(location()) as con:
        con.execute("update queries set text = ?, answers = ? where query_id = 'q1'",
                    [HOSTILE["query"], HOSTILE["answers"]])
        con.execute("update corpus set text = ?, title = ? where doc_id = 'd5'",
                    [HOSTILE["chunk"], HOSTILE["title"]])
        for agent, quote in (("A", HOSTILE["quote_a"]), ("B", HOSTILE["quote_b"])):
            con.execute("update debate_turns set reference = ?, reason = ? where query_id = 'q1' "
                        "and doc_id = 'd5' and agent = ?", [[quote], HOSTILE["reason"], agent])
    app = annotation_app(AppSettings(lake=location(data_lake),
                                     secret="browser-test-secret-123", attention_rate=0.0))
    with served(app) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            dialogs = []
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(f"{base}/login")
            page.fill("#token", token)
            with page.expect_navigation():
                page.click("button[type=submit]")
            assert page.url == f"{base}/annotate"
            page.wait_for_load_state("load")
            # shown as text, exactly
            assert page.inner_text("#query") == HOSTILE["query"]
            assert page.locator("#answers li").all_inner_texts() == HOSTILE["answers"]
            assert page.inner_text("#chunk") == HOSTILE["chunk"]
            assert HOSTILE["title"] in page.inner_text("main")
            assert page.locator("#history blockquote").all_inner_texts() == \
                [HOSTILE["quote_a"], HOSTILE["quote_b"]] * 2
            assert page.locator("#history .turn p").all_inner_texts() == [HOSTILE["reason"]] * 4
            # the quotes are still highlighted, as text
            assert page.locator("#chunk mark").all_inner_texts() == [HOSTILE["quote_a"], HOSTILE["quote_b"]]
            # no element came from the data: one script (the page's own), no img/svg/a in main
            assert page.locator("script").count() == 1
            assert page.locator("main img, main svg, main a[href^='javascript']").count() == 0
            page.locator("#chunk mark").nth(1).click()  # the would-be link
            page.wait_for_timeout(300)
            assert page.evaluate("typeof window.__xss") == "undefined"
            assert dialogs == [] and page.url == f"{base}/annotate"
            with page.expect_navigation():
                page.keyboard.press("n")  # the page still works
            assert page.evaluate("typeof window.__xss") == "undefined"
        finally:
            browser.close()
    with annotations() as con:
        assert con.execute("select annotator_id, query_id, label from human_votes").fetchall() == \
            [("alice", "q1", 0)]
