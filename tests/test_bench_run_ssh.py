"""`invoke bench` end to end against a server `invoke serve` started: the SGLang test double
(tests/doubles/sglang: its launch_server and its bench_serving client write the real formats), over a
real sshd and on a local host. A server that dies half-way brings home what was written and fails."""
from __future__ import annotations

import json

import pytest

from draftops.history import History
from tests.support.bench_folders import bench_a_faulty_double, bench_folder, prompts_file
from tests.support.serving import ok, profile, project, refused, serve_draft  # noqa: F401
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh


@pytest.mark.parametrize(("where", "laptop"), [("box", "full"), ("loc", "full"), ("box", "base")],
                         indirect=["laptop"])   # the base install drives the ssh host too
def test_bench_brings_everything_home_and_records_it(project, tmp_path, where, laptop):  # noqa: F811
    root = project(where)
    serve_draft(root, tmp_path)
    out = ok(invoke(root, "bench", "--prompts", "5", "--repeats", "3", "--output-len", "24",
                    "--dataset", prompts_file(tmp_path), "--name", "double"))
    folder = bench_folder(root, out)
    names = {p.name for p in folder.iterdir()}
    assert {"bench-result.json", "plan.json", "runner.json", "host.json", "client-warmup.jsonl",
            "client-rep1.jsonl", "client-rep3.jsonl", "server-info-rep2.json", "server-log-rep1.txt",
            "server-info.json", "prompts.sharegpt.json"} <= names, names
    res = json.loads((folder / "bench-result.json").read_text())
    assert res["status"] == "succeeded" and res["engine"] == {"name": "sglang", "version": "0.5.10"}
    assert res["settings"]["dataset_kind"] == "text" and res["settings"]["temperature"] == 0.0
    assert res["speculative"]["num_steps"] == 3 and res["speculative"]["num_draft_tokens"] == 4
    assert res["draft"]["layer_ids"] == [1, 15, 28] and res["draft"]["digest"].startswith("sha256:")
    accept = res["accept_length"]
    # the client's value is the server's since its flush; the decode log is counted independently
    assert accept["server_source"] == "decode log" and accept["cross_check"]["agree"] is True
    assert 1.0 < accept["value"] <= 4.0 and len(accept["client"]["values"]) == 3
    assert res["metrics"]["output_throughput"]["median"] > 0 and res["metrics"]["completed"] == 15
    log = (folder / "server-log-rep2.txt").read_text()
    assert "Decode batch, #running-req:" in log and "accept len:" in log
    argv = json.loads((folder / "plan.json").read_text())["steps"][1]["argv"]
    assert "--flush-cache" in argv and "--seed" in argv and str(folder.name) not in argv[0]
    row = History(root / "runs" / "history.sqlite").get(folder.name)
    assert row is not None and row.kind == "bench" and row.verdict == "succeeded"
    assert row.metrics["accept_length"] == pytest.approx(accept["value"])
    listed = ok(invoke(root, "runs", "--local", "--kind", "bench"))
    assert folder.name[:15] in listed
    ok(invoke(root, "serve.stop", "--all"))


def test_a_server_dying_half_way_brings_home_what_was_written(project, tmp_path):  # noqa: F811
    # warm-up: 1 + 4 requests, repeat 1: 1 + 5; the server dies on the 14th /generate, in repeat 2
    root, result = bench_a_faulty_double(project, tmp_path, {"DRAFTOPS_SGLANG_DOUBLE_DIE_AFTER": "14"},
                                         prompts=5, repeats=3, output_len=16)
    text = refused(result)
    assert "failed" in text and "the server died during the repeat 2/3" in text
    folder = bench_folder(root, result.stdout)
    res = json.loads((folder / "bench-result.json").read_text())
    assert res["status"] == "failed" and "server died" in res["failure"]
    assert [r["index"] for r in res["repeats"] if r["record"]] == [1]        # repeat 1 still counts
    assert res["metrics"]["output_throughput"]["values"][0] > 0
    assert "Scheduler hit an exception" in (folder / "server-log-rep2.txt").read_text()
    row = History(root / "runs" / "history.sqlite").get(folder.name)
    assert row is not None and row.verdict == "failed"
    assert "invoke serve`, then bench" in refused(invoke(root, "bench", "--prompts", "4"))   # the program as started
    ok(invoke(root, "serve.stop", "--all"))


def test_bench_refusals(project, tmp_path):  # noqa: F811
    root = project("loc")
    said = refused(invoke(root, "bench"))
    assert "has no draftops servers; start one with `" in said and " -m invoke serve`" in said
    ok(invoke(root, "serve", "--baseline"))
    text = refused(invoke(root, "bench", "--prompts", "0", "--repeats", "x"))
    assert "--repeats 'x' is not a whole number" in text
    text = refused(invoke(root, "bench", "--prompts", "0"))
    assert "--prompts 0 must be a whole number from 1 to 100000" in text
    ok(invoke(root, "serve.stop", "--all"))


def test_a_plan_too_long_for_one_command_line_argument_is_refused_before_starting(project, tmp_path):  # noqa: F811
    """--repeats 200 made an 180 KB --plan-json; Linux refuses one argument over 128 KiB (E2BIG), and
    the user read that the log stream ended early, as if the connection had dropped."""
    root = project("loc")
    ok(invoke(root, "serve", "--baseline"))
    text = refused(invoke(root, "bench", "--repeats", "200", "--prompts", "1", "--output-len", "4"))
    assert "--repeats 200" in text and "128 KiB" in text and "at most" in text
    assert "connection dropped" not in text
    assert not [p for p in (root / "runs").iterdir() if "-bench-" in p.name]     # nothing was started
    ok(invoke(root, "serve.stop", "--all"))


def test_an_interrupted_bench_is_finished_by_bench_collect(project, tmp_path):  # noqa: F811
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    root = project("loc")
    serve_draft(root, tmp_path)
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    bench = subprocess.Popen([sys.executable, "-m", "invoke", "bench", "--prompts", "5", "--repeats", "2",
                              "--output-len", "16", "--dataset", prompts_file(tmp_path)], cwd=root, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             # Ctrl-C as from a terminal, also when the suite runs with SIGINT ignored
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    runs = tmp_path / "locroot" / "runs"
    deadline, status = time.monotonic() + 60, None
    while time.monotonic() < deadline and status is None:
        found = [p for p in runs.glob("*-bench-*") if (p / "status.json").exists()] if runs.exists() else []
        status = json.loads((found[0] / "status.json").read_text()) if found else None
        time.sleep(0.05)
    assert status is not None and status.get("pgid"), status
    run_id = found[0].name
    os.killpg(status["pgid"], signal.SIGSTOP)            # the job is held while its `invoke bench` is stopped
    try:
        time.sleep(0.5)
        bench.send_signal(signal.SIGINT)
        out = " ".join(bench.communicate(timeout=60)[0].split())
    finally:
        os.killpg(status["pgid"], signal.SIGCONT)
    assert bench.returncode == 130 and f"job {run_id} keeps running" in out, out
    assert f" -m invoke bench.collect {run_id}` builds its result" in out      # loc is the default host
    assert not (root / "runs" / run_id / "bench-result.json").exists()
    text = ok(invoke(root, "bench.collect", run_id))                # follows it to its end, then builds
    res = json.loads((root / "runs" / run_id / "bench-result.json").read_text())
    assert res["status"] == "succeeded" and res["settings"]["repeats"] == 2 and res["settings"]["prompts"] == 5
    assert res["speculative"]["num_steps"] == 3 and res["draft"]["layer_ids"] == [1, 15, 28]
    assert res["settings"]["dataset_kind"] == "text" and run_id in text
    row = History(root / "runs" / "history.sqlite").get(run_id)
    assert row is not None and row.kind == "bench" and row.verdict == "succeeded"
    again = ok(invoke(root, "bench.collect", run_id))               # an ended run: built again, same row
    assert run_id in again and History(root / "runs" / "history.sqlite").get(run_id) is not None
    serve_run = next(p.name for p in runs.iterdir() if "-serve-" in p.name)
    assert "not a bench run" in refused(invoke(root, "bench.collect", serve_run))
    plan = root / "runs" / run_id / "plan.json"
    doc = json.loads(plan.read_text())
    doc.pop("collect")
    (runs / run_id / "plan.json").write_text(json.dumps(doc))      # as a draftops before bench.collect wrote it
    assert "does not hold what its result is built from" in refused(invoke(root, "bench.collect", run_id))
    ok(invoke(root, "serve.stop", "--all"))
