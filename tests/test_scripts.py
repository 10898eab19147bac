"""Every script under scripts/ runs at its smallest size (issue 58, "Scripts rot unseen"), so that a
benchmark the README quotes can always be run again: each case starts the script as a
subprocess (`python scripts/X.py ...`, from the project root), on the shipped demo data,
../shared/data or a test lake, writing into the test's temporary folder, and checks what it
printed or wrote, not only its exit status.

Cases that load the real local model (qwen-0.5b, llama.cpp, on one thread: one_thread_models)
take up to about 30 s on two cores; those marked slow cannot get under that (the scale
benchmark with its growth run, two Dagster executors, ranx's first numba compilation). A new
script needs a case here: test_every_script_has_a_case says so."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixtures.paths import PROJECT_ROOT, shared_data

SCRIPTS = PROJECT_ROOT / "scripts"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "GX_ANALYTICS_ENABLED": "false",
           "DAGSTER_DISABLE_TELEMETRY": "1"}
MINI = PROJECT_ROOT / "resources" / "goldsets" / "nq_scifact_mini" / "goldset.jsonl"
DEMO = PROJECT_ROOT / "resources" / "data" / "demo"
BRIDGE = Path(sys.executable).with_name("bridge")
CHROMIUM = Path(os.environ.get("BRIDGE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium")
NUMBER = r"[\d.,]+"


def script_env(**extra: str) -> dict[str, str]:
    """The environment a script runs in: this one (the test's lake, the shared index cache), the
    project importable, offline, Dagster's instance the lake's own."""
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(PROJECT_ROOT), **extra}
    env.pop("DAGSTER_HOME", None)
    return env


def run(command: list[str], *, timeout: float = 600, **extra: str) -> subprocess.CompletedProcess:
    """`command` from the project root, in script_env() with `extra`; fails with its output unless it
    exits 0. (What a script writes, its arguments point into the test's temporary folder.)"""
    done = subprocess.run(command, cwd=PROJECT_ROOT, env=script_env(**extra), capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, (f"{' '.join(map(str, command))} exited {done.returncode}\n--- stdout\n"
                                  f"{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")
    return done


def script(name: str, *args: object, **extra: str) -> subprocess.CompletedProcess:
    """`python scripts/<name> args...`"""
    return run([sys.executable, str(SCRIPTS / name), *map(str, args)], **extra)


def bridge(*args: object, **extra: str) -> subprocess.CompletedProcess:
    """The `bridge` command line of this environment."""
    return run([str(BRIDGE), *map(str, args)], **extra)


@pytest.fixture(scope="module")
def one_thread_models(tmp_path_factory) -> str:
    """A models.yaml that differs from the shipped one only in `threads: 1` for the local models,
    as conftest.py makes under pytest-xdist (then that one): llama.cpp's threads wait for each other
    at every layer, so on two cores that other work keeps busy, two threads are several times
    slower than one (measured here: bench_batched_decode.py's debate case, 208 s with two threads,
    39 s with one, back to back at a load average of 4-5)."""
    if os.environ.get("BRIDGE_MODELS"):
        return os.environ["BRIDGE_MODELS"]
    import yaml

    models = yaml.safe_load((PROJECT_ROOT / "resources" / "models.yaml").read_text())
    for profile in models["profiles"].values():
        if profile.get("backend") == "llama_cpp":
            profile["threads"] = 1
    path = tmp_path_factory.mktemp("models") / "models.yaml"
    path.write_text(yaml.safe_dump(models, sort_keys=False))
    return str(path)


def local_model(request: pytest.FixtureRequest, profile: str = "qwen-0.5b") -> dict[str, str]:
    """The real local model's weights, provisioned (the project ships them offline); the
    environment that runs it on one thread (one_thread_models)."""
    pytest.importorskip("llama_cpp")
    from bridge_assets.llm import get_profile, weights

    weights.provision(get_profile(profile))
    return {"BRIDGE_MODELS": request.getfixturevalue("one_thread_models")}


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def table_rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of the markdown table rows of `text` whose first cell is `first_cell`."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            rows.append(cells)
    return rows


@dataclass(frozen=True)
class Case:
    script: str
    check: Callable[[Path, pytest.FixtureRequest], None]
    marks: tuple


CASES: dict[str, Case] = {}


def case(script_name: str, variant: str = "", *marks) -> Callable:
    """Register a check of `script_name` (test id: the script, and the variant if any)."""
    def register(check: Callable[[Path, pytest.FixtureRequest], None]) -> Callable:
        name = f"{script_name} {variant}".strip()
        assert name not in CASES, name
        CASES[name] = Case(script_name, check, marks)
        return check
    return register


# --- benchmarks ------------------------------------------------------------------------------


@case("bench_annotate_plan.py")
def check_bench_annotate_plan(tmp_path, request):
    out = script("bench_annotate_plan.py", "--pending", 20, "--systems", 3, "--queries", 10, "--votes", 3,
                 "--runs", 1, "--lake", tmp_path / "lake").stdout
    assert "synthetic lake: 3 systems x 10 queries x top-10, 20 pending pairs" in out
    assert re.search(r"^pending_impact: 20 rows in", out, re.M)
    assert re.search(r"^bench: 20 pending pair\(s\) open on nDCG@10", out, re.M)
    assert re.search(rf"^plan in process: best {NUMBER}s, first {NUMBER}s", out, re.M)
    # both fresh processes timed (the script exits 1 when one of them fails)
    assert len(re.findall(rf": best {NUMBER}s, median {NUMBER}s of 1 ", out)) == 2


@case("bench_annotation_page.py")
def check_bench_annotation_page(tmp_path, request):
    out = script("bench_annotation_page.py", "--pairs", 4, "--annotators", 2, "--votes", 2).stdout
    assert "4 escalated pairs, 2 annotators x 2 votes" in out
    for name in ("page", "vote"):  # 2 annotators x 2 rounds
        assert re.search(rf"^{name}: mean \d+ ms, median \d+ ms, p95 \d+ ms \(4\)$", out, re.M), out
    assert int(re.search(r"^progress checksum (\d+)$", out, re.M).group(1)) > 0


@case("bench_batched_decode.py", "widths")
def check_bench_batched_decode_widths(tmp_path, request):
    model = local_model(request)
    out = script("bench_batched_decode.py", "widths", "--profile", "qwen-0.5b", "--tokens", 2,
                 "--prompt-tokens", 64, **model).stdout
    assert "qwen-0.5b, KV unified, 2 tokens per sequence, prompts of [64, 64, 64, 64, 64, 64, 64, 64]" in out
    arms = ["width 1", "width 2", "width 4", "width 4, other neighbours", "width 4, prompt 0 last",
            "width 4, prompt 0 twice", "width 8"]
    rows = {arm: table_rows(out, arm) for arm in arms}
    assert all(len(found) == 1 for found in rows.values()), out
    # alone, prompt 0 is its own reference: the same tokens, no logit difference
    assert rows["width 1"][0][4:] == ["yes", "0.000", "-"]
    assert all(re.fullmatch(r"yes|no, from token \d+", found[0][4]) for found in rows.values())


@case("bench_batched_decode.py", "debate")
def check_bench_batched_decode_debate(tmp_path, request):
    model = local_model(request)
    out = script("bench_batched_decode.py", "debate", "--profile", "qwen-0.5b", "--pairs", 1, "--width", 2,
                 "--reason-words", 5, **model).stdout
    assert "qwen-0.5b, 1 pairs of demo, 2 agents, 2 rounds" in out
    for arm in ("one at a time, pair by pair", "2 lanes, round by round"):
        (row,) = table_rows(out, arm)
        assert int(row[3]) in (2, 4) and int(row[4]) > 0  # calls (a debate of 1 or 2 rounds), tokens out
    assert re.search(r"pairs with the same outcome and label: [01] of 1$", out, re.M)


@case("bench_debate.py")
def check_bench_debate(tmp_path, request):
    model = local_model(request)
    out = script("bench_debate.py", "--pairs", 1, "--profile", "qwen-0.5b", "--rounds", 1, "--reason-words", 10,
                 "--order", "both", "--json", **model).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    assert (figures["dataset"], figures["pairs"], figures["rounds"], figures["agents"]) == ("demo", 1, 1, 2)
    assert [arm["order"] for arm in figures["arms"]] == ["round", "pair"]
    for arm in figures["arms"]:
        assert arm["calls"] == 2 and arm["call_failures"] == 0  # 2 agents, 1 round
        assert arm["prompt_tokens_computed"] > 0 and arm["tokens_out"] > 0 and arm["pairs_per_min"] > 0
        assert len(arm["replies"]) == 2
    assert re.fullmatch(r"[0-2]/2", figures["replies_identical"])


def executor_tables(keep: Path, executor: str) -> dict[str, list]:
    (path,) = keep.glob(f"bench_executors_*/{executor}.tables.json")
    return json.loads(path.read_text())


@case("bench_executors.py")
def check_bench_executors(tmp_path, request):
    out = script("bench_executors.py", "--executors", "in_process", "--retrievers", "bm25", "--keep",
                 tmp_path / "keep").stdout
    assert re.search(r"^fastest=in_process in_process_s=[\d.]+ in_process_mb=\d+ tables_equal=n/a$", out, re.M), out
    (row,) = [line.split() for line in out.splitlines() if line.startswith("in_process ")]
    assert row[1] == "yes" and float(row[2]) > 0
    tables = executor_tables(tmp_path / "keep", "in_process")
    # the demo's 320 passages and 12 questions, and bm25's top 10 for each
    assert {t: v[0] for t, v in tables.items()} == {"corpus": 320, "original_qrels": 12, "queries": 12,
                                                    "retrieval_run": 120}


@case("bench_executors.py", "two executors", pytest.mark.slow)  # two lakes, a process per step: 40-50 s
def check_bench_executors_two_executors(tmp_path, request):
    out = script("bench_executors.py", "--executors", "in_process", "multiprocess", "--retrievers", "bm25",
                 "--keep", tmp_path / "keep").stdout
    assert "tables equal across executors (row counts): " in out
    assert re.search(r"^fastest=\w+ in_process_s=[\d.]+ multiprocess_s=[\d.]+ in_process_mb=\d+ multiprocess_mb=\d+ "
                     r"tables_equal=yes$", out, re.M), out
    assert executor_tables(tmp_path / "keep", "in_process") == executor_tables(tmp_path / "keep", "multiprocess")


@case("bench_kv_cache.py")
def check_bench_kv_cache(tmp_path, request):
    model = local_model(request)
    out = script("bench_kv_cache.py", "--pairs", 1, "--max-tokens", 2, "--simulate", 16, **model).stdout
    assert "1 demo pairs, 2 agents, 2 rounds: 4 debate calls" in out
    simulated = table_rows(out, "**total**")[0]
    assert simulated[1] == "4" and int(simulated[3].replace(",", "")) > 0  # calls, computed with the cache off
    assert "### state cache off (run 1)" in out and "### state cache on (run 1)" in out
    (on,) = table_rows(out, "on")
    assert on[4] == "4/4 texts, 4/4 log-prob lists"  # a restored state changes no reply


@case("bench_llm.py")
def check_bench_llm(tmp_path, request):
    model = local_model(request)
    out = script("bench_llm.py", "--prompts", 2, "--concurrency", "1,2", **model).stdout
    runs = {match[0].strip(): (int(match[1]), int(match[2])) for match in
            re.findall(r"^((?:in-process llama\.cpp|http llama\.cpp server c=\d)\s*?)\s+(\d+)\s+(\d+)\s", out, re.M)}
    # every request answered (valid JSON for its schema), in process and through the server
    assert runs == {"in-process llama.cpp": (2, 2), "http llama.cpp server c=1": (2, 2),
                    "http llama.cpp server c=2": (2, 2)}, out


def previous_revision_args() -> list[str]:
    """bench_metrics' --previous default is a git revision: without that history, leave it out."""
    text = (SCRIPTS / "bench_metrics.py").read_text()
    revision = re.search(r'^PREVIOUS = "(\w+)"', text, re.M).group(1)
    known = subprocess.run(["git", "cat-file", "-e", f"{revision}^{{commit}}"], cwd=PROJECT_ROOT,
                           capture_output=True).returncode == 0
    return [] if known else ["--previous", "none"]


@case("bench_metrics.py")
def check_bench_metrics(tmp_path, request):
    previous = previous_revision_args()
    out = script("bench_metrics.py", "--systems", 2, "--queries", 20, "--repeat", 1, "--layout", "ties-ascending",
                 *previous).stdout
    assert "data: 2 systems x 20 queries x top-10 = 400 run rows" in out
    assert int(re.search(r"^equal values: ([\d,]+) per-query comparisons within 1e-9", out, re.M)
               .group(1).replace(",", "")) > 0
    tools = [line.split()[0] for line in out.split("CPU (all threads)")[1].split("ratios")[0].splitlines()[1:]]
    assert tools == (["BRIDGE", "pytrec_eval"] if previous else ["BRIDGE", "BRIDGE", "pytrec_eval"])
    if not previous:
        assert re.search(r"^BRIDGE before \(\w+\): all [\d,]+ values .* equal to BRIDGE's", out, re.M)


@case("bench_metrics.py", "ranx", pytest.mark.slow)  # ranx's numba kernels compile on first use: ~100 s
def check_bench_metrics_ranx(tmp_path, request):
    out = script("bench_metrics.py", "--systems", 2, "--queries", 20, "--repeat", 1, "--previous", "none",
                 "--source", "frames").stdout
    assert "every tool starts from polars frames" in out
    assert re.search(r"^ranx\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.M), out
    assert re.search(r"^  ranx\s+with conversion [\d.]+x", out, re.M)


@case("bench_retrieval.py")
def check_bench_retrieval(tmp_path, request):
    out = script("bench_retrieval.py", "--dataset", "demo", "--systems", "bm25", "--lake", tmp_path / "lake",
                 "--json", tmp_path / "bench.json").stdout
    (result,) = json.loads((tmp_path / "bench.json").read_text())
    assert "error" not in result, out
    assert (result["system"], result["kind"], result["queries"], result["documents"]) == ("bm25", "bm25", 12, 320)
    assert result["queries_per_second"] > 0 and result["peak_rss_mb"] > 0
    assert re.search(r"^bm25\s+bm25\s+12\s", out, re.M) and "FAILED" not in out


@case("bench_retriever_step.py")
def check_bench_retriever_step(tmp_path, request):
    out = script("bench_retriever_step.py", "--queries", 2, "--positives", 1, "--negatives", 1, "--max-length", 16,
                 "--encode-chunk", 2).stdout
    assert re.search(rf"^2 queries x \(1 positives \+ 1 negatives\), 16 tokens, encode_chunk 2: 1 step in "
                     rf"{NUMBER} s, peak {NUMBER} GiB$", out, re.M), out


BENCH_SCALE_STAGES = ["generate", "write", "pool", "filter", "debate", "human", "qrels", "metrics", "shift", "signif",
                      "saturation", "partial", "report"]


def scale_summary(out: str) -> dict[str, int]:
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"calls_per_s=\d+ total_s=\d+ peak_mb=\d+", last), out
    return {key: int(value) for key, value in (item.split("=") for item in last.split())}


@case("bench_scale.py")
def check_bench_scale(tmp_path, request):
    skipped = BENCH_SCALE_STAGES[8:]  # what the run's stage pipeline ends with: the analysis and the report
    out = script("bench_scale.py", "--fraction", 0.0005, "--no-growth", "--keep", tmp_path / "keep",
                 *(f"--skip={stage}" for stage in skipped)).stdout
    summary = scale_summary(out)
    assert summary["calls_per_s"] > 0 and summary["peak_mb"] > 0
    stages = json.loads((tmp_path / "keep" / "big.json").read_text())["stages"]
    assert [s["stage"] for s in stages] == BENCH_SCALE_STAGES[:8]
    detail = {s["stage"]: s for s in stages}
    assert (detail["generate"]["queries"], detail["generate"]["run_rows"]) == (2, 2 * 25 * 100)
    # the instant server answered the filter (a call per unjudged candidate) and the debate
    assert 0 < detail["filter"]["llm_calls"] <= detail["pool"]["candidates"] and detail["debate"]["llm_calls"] > 0
    assert 0 < detail["filter"]["kept"] < detail["filter"]["llm_calls"]
    assert re.search(r"^LLM calls: \d+ in [\d.]+ s; non-LLM stages over 60 s: ", out, re.M)


@case("bench_scale.py", "growth", pytest.mark.slow)  # every stage, twice (F/10 and F): 30-80 s
def check_bench_scale_growth(tmp_path, request):
    out = script("bench_scale.py", "--fraction", 0.001, "--keep", tmp_path / "keep").stdout
    scale_summary(out)
    assert "s @F/10  growth  MB @F/10" in out
    for name in ("small", "big"):
        stages = json.loads((tmp_path / "keep" / f"{name}.json").read_text())["stages"]
        assert [s["stage"] for s in stages] == BENCH_SCALE_STAGES
    for stage in BENCH_SCALE_STAGES:  # seconds, peak MB at F; seconds, growth, peak MB at F/10
        assert re.search(rf"^{stage}\s+[\d.]+\s+\d+\s+[\d.]+\s+[\d.]+\s+\d+$", out, re.M), stage


@case("bench_student.py")
def check_bench_student(tmp_path, request):
    out = script("bench_student.py", "--gold", MINI, "--labels", 16, "--max-length", 64, "--epochs", 1, "--pairs", 20,
                 "--precisions", "float32,bfloat16").stdout
    assert re.search(r"^training \(all-minilm-l6-v2\): 16 labels x 1 epochs \(\d+ trained on, \d+ calibrated on\): "
                     r"[\d.]+ s; weights sha256 [0-9a-f]{16}$", out, re.M), out
    for precision in ("float32", "bfloat16"):
        assert re.search(rf"^scoring in {precision} \(\w+ here\): 20 pairs: .* same side of 0.5 \d+/20$", out, re.M)
    # the first arm against itself
    assert "scoring in float32 (float32 here): 20 pairs" in out and "mean |diff| 0.00000, max 0.00000" in out
    assert re.search(rf"^peak memory: {NUMBER} GiB$", out, re.M)


@case("bench_student.py", "lake")
def check_bench_student_lake(tmp_path, request):
    from fixtures.labeled_lake import EXPECTED, VERIFIED_LABELS, materialize_qrels

    lake = request.getfixturevalue("labeled_lake")
    materialize_qrels(lake)
    out = script("bench_student.py", "--dataset", "demo", "--lake", lake, "--epochs", 1, "--max-length", 32).stdout
    relevant = sum(relevance == 1 for relevance, _ in VERIFIED_LABELS.values())
    assert re.search(rf"^demo: {len(VERIFIED_LABELS)} verified labels, {relevant} relevant; max_labels 800: ",
                     out, re.M), out
    assert re.search(r"^training: \d+ labels x 1 epochs, calibration ", out, re.M), out
    pool = int(re.search(r"^scoring: (\d+) pool pairs: ", out, re.M).group(1))
    by_source = {m[0]: int(m[1]) for m in re.findall(r"^  (.+): (\d+) pairs, P\(relevant\) mean [\d.]+", out, re.M)}
    assert sum(by_source.values()) == pool and by_source["pending (pending)"] == 1  # the one pending pair
    assert sum(n for name, n in by_source.items() if name != "not in the qrels") <= len(EXPECTED)


# --- builds of shipped data --------------------------------------------------------------------


@case("build_demo_dataset.py")
def check_build_demo_dataset(tmp_path, request):
    if sys.version_info[:3] != (3, 11, 7):
        pytest.skip("the demo's passages are tied to Python 3.11.7's pydoc_data (the script refuses others)")
    out = script("build_demo_dataset.py", "--out", tmp_path / "demo").stdout
    assert out.startswith("320 passages, 12 questions, 12 holes -> ")
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "holes.jsonl"):  # the shipped files, rebuilt
        assert (tmp_path / "demo" / name).read_bytes() == (DEMO / name).read_bytes(), name


@case("build_goldset.py")
def check_build_goldset(tmp_path, request):
    shared_data("scifact"), shared_data("nq_open_mini")
    out = script("build_goldset.py", "--per-domain", 1, "--out", tmp_path / "mini.jsonl").stdout
    assert f"{tmp_path / 'mini.jsonl'}: 4 triplets (2 relevant, 2 not)" in out
    triplets = lines_of(tmp_path / "mini.jsonl")
    assert [(t["domain"], t["label"]) for t in triplets] == [("scifact", 1), ("scifact", 0), ("nq", 1), ("nq", 0)]
    assert all(t["query"] and t["chunk"] and t["answers"] for t in triplets)
    assert triplets[0]["query"] == triplets[1]["query"] and triplets[0]["id"] != triplets[1]["id"]


@case("build_scifact_claims.py")
def check_build_scifact_claims(tmp_path, request):
    shared_data("scifact")
    out = script("build_scifact_claims.py", "--out", tmp_path / "goldset.jsonl").stdout
    assert out.strip() == f"wrote {tmp_path / 'goldset.jsonl'}"
    shipped = PROJECT_ROOT / "resources" / "goldsets" / "scifact_claims" / "goldset.jsonl"
    assert (tmp_path / "goldset.jsonl").read_bytes() == shipped.read_bytes()
    triplets = lines_of(tmp_path / "goldset.jsonl")
    assert len(triplets) == 40 and sum(t["label"] for t in triplets) == 20


@case("diras_split.py")
def check_diras_split(tmp_path, request):
    out = script("diras_split.py", "--out-dir", tmp_path).stdout
    written = {"resources/data/diras_general_qa/split.json", "resources/goldsets/diras_silver/goldset.jsonl",
               "resources/goldsets/diras_silver/calibration.jsonl"}
    assert {line.removeprefix(f"wrote {tmp_path}/") for line in out.splitlines()} == written
    for name in written:  # the shipped files, rebuilt
        assert (tmp_path / name).read_bytes() == (PROJECT_ROOT / name).read_bytes(), name
    split = json.loads((tmp_path / "resources/data/diras_general_qa/split.json").read_text())
    assert (split["counts"]["test"]["questions"], split["counts"]["calibration"]["questions"]) == (50, 50)
    gold = lines_of(tmp_path / "resources/goldsets/diras_silver/goldset.jsonl")
    assert (len(gold), sum(t["label"] for t in gold)) == (200, 100)


# --- studies on label-eval outputs ---------------------------------------------------------------


@pytest.fixture(scope="module")
def student_label_evals(tmp_path_factory) -> dict[str, Path]:
    """Two real labelers on the 48 triplets of nq_scifact_mini: `bridge label-eval --method student`
    (students trained on the other query fold: no LLM) reading 32 and 48 tokens; their --items
    (id, gold, label, score) and --json files, as the studies read them."""
    folder = tmp_path_factory.mktemp("label-eval")
    files = {}
    for tokens in (32, 48):
        name = f"student{tokens}"
        done = bridge("label-eval", "--gold", MINI, "--method", "student", "--set", "epochs=1",
                      "--set", f"max_length={tokens}", "--items", folder / f"{name}.items.jsonl", "--json",
                      BRIDGE_DATA_LAKE=str(folder / "lake"))
        (folder / f"{name}.json").write_text(done.stdout)
        files[name] = folder / f"{name}.json"
        files[f"{name}.items"] = folder / f"{name}.items.jsonl"
    return files


@case("combiner_study.py")
def check_combiner_study(tmp_path, request):
    evals = request.getfixturevalue("student_label_evals")
    out = script("combiner_study.py", "--gold", MINI, "--signal", f"s32={evals['student32.items']}",
                 "--signal", f"s48={evals['student48.items']}", "--answer-check", "--folds", 2,
                 "--json", tmp_path / "study.json").stdout
    assert f"{MINI}: 48 pairs (24 relevant), 24 queries; combiner cross-fitted over 2 query folds (seed 0)" in out
    study = json.loads((tmp_path / "study.json").read_text())
    assert (study["n"], study["relevant"]) == (48, 24)
    assert [row["signal"] for row in study["rows"]] == [
        "s32", "s48", "answer_check", "s32, recalibrated", "s48, recalibrated", "answer_check, recalibrated",
        "combiner (s32 + s48 + answer_check)"]
    assert all(0.0 <= row["auroc"][1] <= row["auroc"][2] <= 1.0 and 0.0 <= row["auroc"][0] <= 1.0
               for row in study["rows"])
    assert set(study["weights"]) == {"s32", "s48", "answer_check"}
    assert len(table_rows(out, "combiner (s32 + s48 + answer_check)")) == 1


@case("escalation_signal.py")
def check_escalation_signal(tmp_path, request):
    evals = request.getfixturevalue("student_label_evals")
    out = script("escalation_signal.py", "--labels", evals["student48.items"], "--lara", evals["student32.items"],
                 "--signal", f"s32={evals['student32.items']}", "--confidences", "0.6,0.9", "--up-to", 0.2).stdout
    assert f"{evals['student48.items']}: 48 triplets" in out
    reference, signal = table_rows(out, "P(yes) of --lara"), table_rows(out, "s32")
    assert reference[0][2] == "+0.000 [+0.000, +0.000]"  # the reference minus itself
    assert signal[0][1] == reference[0][1]  # the same scores rank the same: the same AUROC
    assert [row[1] for row in signal[1:]] == ["P >= 0.6", "P >= 0.9", "up to 20%"]
    (alone,) = table_rows(out, "(labeler alone)")
    assert re.fullmatch(r"\d+ of 48, [\d.]+% \(0\)", alone[2])


@case("escalation_signal.py", "test half")
def check_escalation_signal_test_half(tmp_path, request):
    out = script("escalation_signal.py", "--write-test-half", MINI, tmp_path / "half.jsonl").stdout
    half = lines_of(tmp_path / "half.jsonl")
    assert out.strip() == f"{len(half)} triplets -> {tmp_path / 'half.jsonl'}"
    mini = {t["id"]: t for t in lines_of(MINI)}
    assert 0 < len(half) < len(mini) and all(mini[t["id"]] == t for t in half)
    # a query fold: every query whole, on one side
    kept = {t["id"] for t in half}
    assert {t["query"] for t in half}.isdisjoint(t["query"] for t in mini.values() if t["id"] not in kept)


@case("general_student.py")
def check_general_student(tmp_path, request):
    out = script("general_student.py", "--max-labels", 16, "--epochs", 1, "--max-length", 32, "--batch-size", 16,
                 "--teacher-pairs", 40, "--gold", MINI, "--out", tmp_path / "student", "--items", tmp_path / "items",
                 "--json", tmp_path / "report.json").stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["training"]["trained_on"] == 16 and report["training"]["weights"]
    assert (report["teacher_test"]["n"], report["teacher_test"]["relevant"]) == (40, 7)
    for name in ("auroc", "bacc", "ece", "brier"):
        low, high = report["teacher_test"][name][1:]
        assert 0.0 <= low <= high <= 1.0
    assert report[str(MINI)]["student"]["n"] == 48
    items = lines_of(tmp_path / "items" / "nq_scifact_mini.student.items.jsonl")
    assert len(items) == 48 and all(0.0 <= item["score"] <= 1.0 for item in items)
    assert (tmp_path / "student" / "calibration.json").exists()
    assert "bAcc threshold (best on the 40 calibration pairs)" in out


@case("labeler_eval_table.py")
def check_labeler_eval_table(tmp_path, request):
    evals = request.getfixturevalue("student_label_evals")
    out = script("labeler_eval_table.py", evals["student32"], evals["student48"]).stdout
    assert out.startswith("| run | n | irrel. recall | rel. recall | bAcc [95% CI] |")
    for name in ("student32", "student48"):
        (row,) = table_rows(out, name)
        assert row[1] == "48" and re.fullmatch(r"[\d.]+ \[[\d.]+, [\d.]+\]", row[4]) and row[7] == "0"  # no LLM call


@case("labeler_eval_table.py", "paired")
def check_labeler_eval_table_paired(tmp_path, request):
    evals = request.getfixturevalue("student_label_evals")
    out = script("labeler_eval_table.py", "--paired", evals["student32.items"], evals["student48.items"]).stdout
    (row,) = table_rows(out, "48")  # n, then how many outcomes are the same
    assert 0 <= int(row[1]) <= 48 and re.fullmatch(r"[+-][\d.]+( \[[+-][\d.]+, [+-][\d.]+\])?", row[2])
    assert row[4] == "0 -> 0"  # a student escalates nothing


@case("student_prefilter.py")
def check_student_prefilter(tmp_path, request):
    out = script("student_prefilter.py", "--gold", MINI, "--limit", 16, "--epochs", 1, "--max-length", 32,
                 "--thresholds", "0.3,0.5").stdout
    assert f"## {MINI} (out-of-fold scores, relevant = gold label)" in out
    for threshold in ("0.3", "0.5"):
        (row,) = table_rows(out, threshold)
        skipped = int(row[2].split()[0])
        assert row[1] == "16" and 0 <= skipped <= 16 and row[3] == str(skipped) and row[4] == "8"


# --- a lake's ledger, the UI, the annotation order, the trained retriever --------------------------


@case("llm_time_by_stage.py")
def check_llm_time_by_stage(tmp_path, request):
    model = local_model(request)
    lake = request.getfixturevalue("data_lake")
    # two real filter calls into the lake's ledger: one NQ question against its passage and a BM25 negative
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(t) + "\n" for t in [t for t in lines_of(MINI) if t["domain"] == "nq"][:2]))
    bridge("label-eval", "--gold", gold, "--method", "filter", "--profile", "qwen-0.5b", **model)
    out = script("llm_time_by_stage.py", "--lake", lake, "--by", "purpose,profile", "--simulate", 16, "--replay", 1,
                 "--max-tokens", 4, **model).stdout
    (stage,) = table_rows(out, "filter")[:1]
    assert stage[1:5] == ["qwen-0.5b", "2", "0", "2"]  # profile, calls, failed, measured (prefill known)
    computed, reused = (int(stage[c].split()[0].replace(",", "")) for c in (6, 7))
    assert computed + reused == int(stage[5].replace(",", "")) > 0  # the prompt tokens, split
    assert "simulated: 1 recorded calls, qwen-0.5b's tokenizer" in out  # (as many as --replay takes)
    assert "replay: 1 recorded calls through qwen-0.5b" in out
    (on,) = table_rows(out, "on")
    assert on[4].startswith("1/1 texts")


@case("screenshot_ui.py")
def check_screenshot_ui(tmp_path, request):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: `make browser` installs Debian's chromium")
    pytest.importorskip("playwright.sync_api")
    from PIL import Image

    shot = tmp_path / "graph.png"
    out = script("screenshot_ui.py", shot, "--settle", 0, "--width", 800, "--height", 600).stdout
    assert re.fullmatch(rf"http://127\.0\.0\.1:\d+/asset-groups -> {re.escape(str(shot))}", out.strip())
    with Image.open(shot) as image:
        assert (image.format, image.size) == ("PNG", (800, 600))
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or range(1 << 16)) > 16  # a page, not blank


@case("simulate_annotation_order.py")
def check_simulate_annotation_order(tmp_path, request):
    done = script("simulate_annotation_order.py", "--dataset", "demo", "--build", "--retrievers", "bm25", "bm25_rm3",
                  "--orders", 2, "--lake", tmp_path / "lake", "--write")
    out = done.stdout
    match = re.search(r"^demo: (\d+) pending pairs \((\d+) relevant by the stand-in: holes\), 2 systems "
                      r"\(bm25, bm25_rm3\), nDCG@10$", out, re.M)
    assert match and int(match.group(1)) > int(match.group(2)) > 0, out
    pending = int(match.group(1))
    for order in ("impact order", "current order (query, chunk)"):
        (row,) = table_rows(out, order)
        assert 0 <= int(row[1]) <= pending
    (random_row,) = table_rows(out, "random (2 orders, seed 0)")
    assert random_row[1].startswith("mean ")
    assert re.search(r"^target \(impact order at most half the random mean, [\d.]+\): (met|NOT met)$", out, re.M)
    assert "wrote bridge_qrels, retrieval_metrics, pending_impact" in done.stderr


@case("trained_retriever.py")
def check_trained_retriever(tmp_path, request):
    from fixtures.labeled_lake import materialize_qrels

    lake = request.getfixturevalue("labeled_lake")
    materialize_qrels(lake)
    out = script("trained_retriever.py", "--lake", lake, "--dataset", "demo", "--epochs", 1, "--folds", 2).stdout
    assert re.search(r"^dataset demo: 4 queries, 12 chunks, 4 original relevant pairs, \d+ verified relevant refined "
                     r"pairs, 1 pending pairs", out, re.M), out
    # every query held out once (2 folds of 2), scored against both qrels: nDCG@10 and R@10 [95% CI]
    (untrained,) = table_rows(out, "untrained MiniLM")
    assert untrained[1:3] == ["-", "4"] and all(re.fullmatch(r"[\d.]+ \[[\d.]+, [\d.]+\]", c) for c in untrained[3:])
    for source in ("original", "refined"):
        trained, difference = table_rows(out, f"trained on {source}")  # its row, then its row minus the untrained
        assert trained[1:3] == ["2/2", "4"] and len(trained) == len(difference) + 2 == 7
        assert re.search(rf"^trained on {source}: weights sha256\[:12\] per fold [0-9a-f]{{12}}, [0-9a-f]{{12}}; ",
                         out, re.M)
    assert re.search(r"^total \d+ s$", out, re.M)


# --------------------------------------------------------------------------------------------------


def test_every_script_has_a_case():
    """A script without a case here would rot unseen: each one runs at its smallest size."""
    assert sorted(path.name for path in SCRIPTS.glob("*.py")) == sorted({c.script for c in CASES.values()})


@pytest.mark.parametrize("name", [pytest.param(name, marks=c.marks, id=name) for name, c in CASES.items()])
def test_script_runs_at_its_smallest_size(name, data_lake, tmp_path, request):
    """Whatever a script does not point elsewhere goes to the test's own lake (data_lake)."""
    CASES[name].check(tmp_path, request)


def test_bench_metrics_previous_revision_brings_its_own_modules(monkeypatch):
    """--previous REV loads REV's measures with REV's modules (measure_names, judged_rows, paths,
    its SQL), not this tree's, and leaves this process's bridge_assets as it was."""
    import importlib.util
    import inspect

    import bridge_assets.metrics.measures as current

    if subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=PROJECT_ROOT,
                      capture_output=True).returncode:
        pytest.skip("no git history here")
    spec = importlib.util.spec_from_file_location("bench_metrics", SCRIPTS / "bench_metrics.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_metrics", bench)  # its dataclasses look themselves up there
    spec.loader.exec_module(bench)
    previous = bench.previous_measures("HEAD")
    folder = Path(previous.__file__).parents[2]
    assert folder != PROJECT_ROOT and (folder / "sql" / "retrieval_metrics.sql").exists()
    for name in ("measure_values", "resolve_measures", "read_sql"):  # what it imported: the revision's
        assert Path(inspect.getfile(getattr(previous, name))).is_relative_to(folder), name
    assert sys.modules["bridge_assets.metrics.measures"] is current

