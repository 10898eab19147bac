"""Issue 26 in a real browser (Debian's chromium, headless, driven by Playwright; never
`playwright install`): three annotators label a queue with an impact order; the items come in
that order, every vote keeps its time, and the stopping-point counter falls as the deciding
pairs are completed. The admin page shows the plan (a screenshot is kept when
BRIDGE_PLAN_SCREENSHOT names a file)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pytest
from fastapi.testclient import TestClient

from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.app import AppSettings, annotation_app
from bridge_assets.human.security import SESSION_COOKIE
from fixtures.escalated_set import write_escalated_set, write_impact
from fixtures.human_app import login, served
from fixtures.paths import annotations, location, votes_db

CHROMIUM = Path(os.environ.get("BRIDGE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SECRET = "browser-test-secret-123"
IMPACT_ORDER = [("q4", "d8"), ("q3", "d7"), ("q1", "d5"), ("q2", "d6")]  # write_impact's


def served_pair(lake, assignment_id: str) -> tuple[tuple[str, str], bool, int | None]:
    with duckdb.connect(str(votes_db(lake))) as con:
        q, d, check, expected = con.execute(
            "select query_id, doc_id, is_attention_check, expected_label from annotation_assignments "
            "where assignment_id = ?", [assignment_id]).fetchone()
    return (q, d), check, expected


def admin_cookie(token: str) -> str:
    """A session cookie of the admin with `token`, from a login whose redirect is not followed."""
    lake = Path(os.environ["BRIDGE_DATA_LAKE"])
    client = TestClient(annotation_app(AppSettings(lake=location(lake), secret=SECRET)),
                        follow_redirects=False)
    assert login(client, token).status_code == 303
    return client.cookies[SESSION_COOKIE]


def counter(page) -> int | None:
    spot = page.locator("#stopping-point strong")
    return int(spot.inner_text()) if spot.count() else None


def test_three_annotators_follow_the_impact_order_timed_while_the_stopping_point_falls(data_lake, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: `make browser` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    write_escalated_set(data_lake)
    write_impact(data_lake)
    with annotations() as con:
        tokens = {name: add_annotator(con, name, admin=name == "boss") for name in ("alice", "bob", "carol", "boss")}
    app = annotation_app(AppSettings(lake=location(data_lake), secret=SECRET,
                                     attention_rate=0.25, seed=2))
    order: dict[str, list[tuple[str, str]]] = {}
    counts: list[int | None] = []
    checks = 0
    with served(app) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            for name in ("boss", "alice", "bob", "carol", "boss"):
                context = browser.new_context(viewport={"width": 1280, "height": 1000})
                page = context.new_page()
                if name == "boss":
                    # the login lands on /annotate, which would serve the admin an item (holding
                    # a vote slot): log in without following it, and hand the browser the cookie
                    context.add_cookies([{"name": SESSION_COOKIE, "value": admin_cookie(tokens[name]),
                                          "url": base}])
                else:
                    page.goto(f"{base}/login")
                    page.fill("#token", tokens[name])
                    with page.expect_navigation():
                        page.click("button[type=submit]")
                if name == "boss" and order:  # after the annotators: their times, an empty queue
                    page.goto(f"{base}/admin")
                    assert page.locator("#times tr").count() == 4  # header + alice, bob, carol
                    queue_text = page.inner_text("#queue")
                    context.close()
                    continue
                if name == "boss":
                    page.goto(f"{base}/admin")
                    rows = page.locator("#queue tr").all_inner_texts()[1:]
                    assert [tuple(r.split("\t")[2:4]) for r in rows] == IMPACT_ORDER
                    assert "decides bm25 vs dense on nDCG@10: rank 2 in both" in rows[0]
                    shot = tmp_path / "plan.png"
                    page.locator("#queue-order").screenshot(path=str(shot))
                    assert shot.stat().st_size > 5_000
                    if os.environ.get("BRIDGE_PLAN_SCREENSHOT"):
                        shutil.copy(shot, os.environ["BRIDGE_PLAN_SCREENSHOT"])
                    context.close()
                    continue
                while page.locator("#vote-form").count():
                    counts.append(counter(page))
                    assignment_id = page.locator("input[name=assignment_id]").get_attribute("value")
                    pair, is_check, expected = served_pair(data_lake, assignment_id)
                    if is_check:
                        checks += 1
                        label = expected
                    else:
                        order.setdefault(name, []).append(pair)
                        label = 1
                    with page.expect_navigation():
                        page.keyboard.press("y" if label else "n")
                counts.append(counter(page))
                context.close()
        finally:
            browser.close()

    assert "No impact order yet" in queue_text
    assert order == {name: IMPACT_ORDER for name in ("alice", "bob", "carol")}
    assert checks >= 1
    # 2 deciding pairs until carol completes q4/d8 (1 left), then q3/d7 (none left)
    assert counts[0] == 2 and counts[-1] == 0 and counts == sorted(counts, reverse=True) and 1 in counts
    with annotations() as con:
        seconds = [r[0] for r in con.execute("select seconds from human_votes").fetchall()]
    assert len(seconds) == 12 + checks and all(s is not None and 0 <= s <= 300 for s in seconds)
