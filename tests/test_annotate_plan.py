"""`bridge annotate plan` and the pending_impact asset on the labeled lake (issue 26, item 2):
the pairs in impact order, the stopping point, the pairs deciding a named system pair; the
admin page shows the same order with its reasons."""

from __future__ import annotations

import dagster as dg
from typer.testing import CliRunner

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.analysis import impact_asset
from bridge_assets.cli import annotate as cli
from bridge_assets.qrels import assets as qrels_assets
from fixtures.labeled_lake import DATASET, read
from fixtures.paths import lake_resources, location


def materialize(lake) -> dg.ExecuteInProcessResult:
    result = dg.materialize([qrels_assets.bridge_qrels, analysis_assets.retrieval_metrics,
                             impact_asset.pending_impact], partition_key=DATASET,
                            resources=lake_resources(lake))
    assert result.success
    return result


def test_pending_impact_asset_and_the_plan_command(labeled_lake):
    result = materialize(labeled_lake)
    metadata = result.asset_materializations_for_node("pending_impact")[0].metadata
    frame = read(labeled_lake, "select * from pending_impact order by impact_rank")
    # the labeled lake's one pending pair: q2/d10, third in bm25's ranking only
    assert frame.select("query_id", "doc_id").rows() == [("q2", "d10")]
    row = frame.row(0, named=True)
    assert metadata["stopping_point"].value == (1 if row["impact"] > 0 else 0)
    assert metadata["pending_pairs"].value == 1

    out = CliRunner().invoke(cli.app, ["plan", "--dataset", DATASET])
    assert out.exit_code == 0, out.output
    assert out.output.startswith(f"{DATASET}: 1 pending pair(s) open on nDCG@10")
    assert f"stopping point: {metadata['stopping_point'].value} label(s)" in out.output
    assert "q2" in out.output and "d10" in out.output and row["reason"] in out.output

    named = CliRunner().invoke(cli.app, ["plan", "--dataset", DATASET, "--systems", "bm25", "dense"])
    assert named.exit_code == 0, named.output
    deciding = [p for p in row["system_pairs"] if {p["system_a"], p["system_b"]} == {"bm25", "dense"}]
    assert f"pairs that decide bm25 vs dense: {len(deciding)}" in named.output


def test_plan_without_pending_impact_says_what_to_materialize(labeled_lake):
    out = CliRunner().invoke(cli.app, ["plan", "--dataset", DATASET])
    assert out.exit_code == 0, out.output
    assert "materialize pending_impact" in out.output


def test_the_summary_and_the_report_state_the_stopping_point(labeled_lake, tmp_path):
    import time

    from bridge_assets.cli.summary import run_summary
    from bridge_assets.lake import store
    from bridge_assets.reports.build import build_report

    materialize(labeled_lake)
    frame = read(labeled_lake, "select * from pending_impact")
    deciding = frame.filter(frame["impact"] > 0).height
    with store.connect(location(labeled_lake)) as con:
        summary = run_summary(con, DATASET, time.time())
        files = build_report(con, DATASET, tmp_path / "report")
    line = [x for x in summary.splitlines() if x.startswith("stopping point:")]
    assert line == [f"stopping point: {deciding} more label(s), in impact order, decide every rank change on "
                    f"nDCG@10 ({frame['pairs_in_doubt'][0]} system pair(s) in doubt; the other {1 - deciding} "
                    f"pending pair(s) cannot change any): bridge annotate plan --dataset {DATASET}"]
    section = next(s for s in files.sections if s.key == "impact")
    assert section.notes[0].startswith(f"Stopping point: {deciding} more label(s), in impact order")
    assert "Stopping point:" in files.markdown.read_text()


def test_the_app_serves_by_impact_times_votes_and_counts_down_to_the_stopping_point(escalated_lake):
    import re

    from bridge_assets.human.annotators import add_annotator
    from fixtures.escalated_set import write_impact
    from fixtures.human_app import answer, login, make_client, served_pair
    from fixtures.paths import annotations

    write_impact(escalated_lake)
    with annotations(escalated_lake) as con:
        tokens = {name: add_annotator(con, name, admin=name == "boss") for name in ("a", "b", "c", "boss")}
    admin = make_client(escalated_lake)
    login(admin, tokens["boss"])
    page = admin.get("/admin").text
    queue = page.split('id="queue"', 1)[1].split("</table>", 1)[0]
    assert queue.index("q4") < queue.index("q3") < queue.index("q1")
    assert "decides bm25 vs dense on nDCG@10: rank 2 in both" in queue
    assert re.search(r"demo <strong>2</strong>", page)

    left = []
    for name in ("a", "b", "c"):
        client = make_client(escalated_lake)
        login(client, tokens[name])
        shown, _ = answer(client, "1")
        assert served_pair(escalated_lake, shown.text)[:2] == ("q4", "d8")
        left.append(int(re.search(r'id="stopping-point"[^>]*>\s*<strong>(\d+)</strong>', shown.text).group(1)))
        nxt = client.get("/annotate").text
        assert served_pair(escalated_lake, nxt)[:2] == ("q3", "d7")
    assert left == [2, 2, 2]
    final = re.search(r'id="stopping-point"[^>]*>\s*<strong>(\d+)</strong>', nxt).group(1)
    assert final == "1"  # q4/d8 has its three votes: one deciding pair left
    with annotations(escalated_lake) as con:
        seconds = [r[0] for r in con.execute("select seconds from human_votes").fetchall()]
    assert len(seconds) == 3 and all(s is not None and 0 <= s <= 300 for s in seconds)
    assert 'id="times"' in admin.get("/admin").text
