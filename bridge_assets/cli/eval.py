"""`bridge eval`: trec_eval's report for a TREC run and qrels, computed by our own SQL."""

from __future__ import annotations

from pathlib import Path

import typer

from bridge_assets.metrics.measure_names import resolve_measures
from bridge_assets.metrics.trec_files import evaluate_trec_files, trec_eval_lines


def eval_command(
    qrels: Path = typer.Option(..., "--qrels", help="TREC qrels: qid iter docid rel."),
    run: Path = typer.Option(..., "--run", help="TREC run: qid Q0 docid rank score tag."),
    measure: list[str] = typer.Option(
        None, "--measure", "-m",
        help="trec_eval measure, repeatable: map, P, P.5,10, P_10, ndcg_cut_10, success_10, "
             "recip_rank, Rprec, bpref, num_rel_ret, ... or 'official' (the default). "
             "BRIDGE's own: recip_rank_cut_k (MRR@k), judged_k, hole_k (needs --original-qrels)."),
    query: bool = typer.Option(False, "--query", "-q", help="Also print every query's values."),
    complete: bool = typer.Option(
        False, "--complete", "-c",
        help="Average over every query of the qrels (missing ones score 0), as trec_eval -c."),
    level: int = typer.Option(1, "--level", "-l", help="Lowest relevance value that counts as relevant."),
    max_docs: int = typer.Option(None, "--max-docs", "-M", help="Evaluate only each query's top N."),
    original_qrels: Path = typer.Option(
        None, "--original-qrels", help="For hole_k: the qrels before refinement."),
) -> None:
    """Evaluate a TREC run against TREC qrels and print trec_eval-style lines
    (measure, query or 'all', value); the values equal trec_eval's."""
    selection = resolve_measures(measure or ["official"])
    frame, run_id = evaluate_trec_files(qrels, run, selection, original_qrels=original_qrels,
                                        relevance_level=level, complete=complete,
                                        max_docs=max_docs, per_query=query)
    for line in trec_eval_lines(frame, selection, run_id, per_query=query):
        typer.echo(line)
