"""One client process for the whole bench (issue #26, item 3): the runner starts
remote.bench.client_session once, which imports the engine's client module and runs the warm-up and
every repeat in it, each writing its result file as the CLI does. Checked against the SGLang double's
client (tests/doubles/sglang/bench_serving.py, which has the real library entry run_benchmark), on a
local host; and the session on its own: a hung server, a SIGTERM, an engine without the entry."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from remote.bench import client_link
from remote.bench.runner import pid_alive
from tests.support.bench_folders import bench_folder, prompts_file
from tests.support.serving import DOUBLES, draft_config, ok, profile, project, refused, write_model  # noqa: F401
from tests.support.tasks import invoke

SERVE = ("serve", "--draft", "DRAFT", "--steps", "3", "--topk", "1", "--draft-tokens", "4")


def served_bench(root: Path, tmp_path: Path, *extra: str):
    draft = write_model(tmp_path / "draft", draft_config([1, 15, 28]))
    ok(invoke(root, *[draft if a == "DRAFT" else a for a in SERVE]))
    return invoke(root, "bench", "--prompts", "5", "--repeats", "3", "--output-len", "16",
                  "--dataset", prompts_file(tmp_path), *extra)


def older_doubles(tmp: Path) -> Path:
    """The SGLang double as an older engine's client: the same CLI, no run_benchmark(args)."""
    folder = tmp / "older-doubles"
    shutil.copytree(DOUBLES, folder, ignore=shutil.ignore_patterns("__pycache__"))
    client = folder / "sglang" / "bench_serving.py"
    client.write_text(client.read_text().replace("run_benchmark", "_run_old"))
    return folder


@pytest.mark.ssh
def test_the_warmup_and_every_repeat_run_in_one_client_process(project, tmp_path):  # noqa: F811
    root = project("loc")
    out = ok(served_bench(root, tmp_path))
    folder = bench_folder(root, out)
    runner = json.loads((folder / "runner.json").read_text())
    client = runner["client"]
    assert client["mode"] == "library" and client["entry"] == "sglang.bench_serving.run_benchmark", client
    assert not pid_alive(client["pid"])                     # closed with the bench
    for name in ("warmup", "rep1", "rep2", "rep3"):
        log = (folder / f"client-{name}.log").read_text()
        assert f"(in the bench's client process: {client['entry']})" in log and "Serving Benchmark Result" in log
        assert len((folder / f"client-{name}.jsonl").read_text().splitlines()) == 1     # as the CLI appends
    steps = runner["steps"]
    assert [s["name"] for s in steps] == ["warmup", "rep1", "rep2", "rep3"]
    assert all(0 < s["client_call_s"] <= s["seconds"] for s in steps)
    res = json.loads((folder / "bench-result.json").read_text())
    assert res["status"] == "succeeded" and res["metrics"]["completed"] == 15
    assert len(res["accept_length"]["client"]["values"]) == 3


@pytest.mark.ssh
@pytest.mark.parametrize("why", ["asked", "older engine"])
def test_one_process_per_step_when_asked_or_without_the_library_entry(project, tmp_path, why):  # noqa: F811
    serve = profile(tmp_path)
    if why == "asked":
        serve["env"] = {**serve["env"], client_link.MODE_VAR: "process"}
    else:
        serve["env"] = {**serve["env"], "PYTHONPATH": str(older_doubles(tmp_path))}
    root = project("loc", default=serve)
    out = ok(served_bench(root, tmp_path))
    folder = bench_folder(root, out)
    client = json.loads((folder / "runner.json").read_text())["client"]
    assert client["mode"] == "process"
    said = {"asked": "one client process per step was asked for (DRAFTOPS_BENCH_CLIENT=process)",
            "older engine": "the engine's client has no library entry (ImportError: sglang.bench_serving has no "
                            "run_benchmark(args))"}[why]
    assert client["why"] == said
    job_log = tmp_path / "locroot" / "runs" / folder.name / "log"        # the job's own output
    assert f"{said}; each step starts its own client process" in job_log.read_text()
    assert "in the bench's client process" not in (folder / "client-rep2.log").read_text()
    res = json.loads((folder / "bench-result.json").read_text())
    assert res["status"] == "succeeded" and len(res["accept_length"]["client"]["values"]) == 3


@pytest.mark.ssh
def test_a_repeat_failing_inside_the_client_process_is_one_error_with_its_index(project, tmp_path):  # noqa: F811
    serve = profile(tmp_path, double={"DRAFTOPS_SGLANG_DOUBLE_CLIENT_FAIL_RUN": "3"})    # warm-up, rep1, rep2
    root = project("loc", default=serve)
    result = served_bench(root, tmp_path)
    text = refused(result)
    assert ("the client failed inside the bench's client process (RuntimeError: double client: failing on cue "
            "in its run 3) in the repeat 2/3") in text, text
    folder = bench_folder(root, result.stdout)
    res = json.loads((folder / "bench-result.json").read_text())
    assert res["status"] == "failed" and [r["index"] for r in res["repeats"] if r["record"]] == [1]
    assert "Traceback" in (folder / "client-rep2.log").read_text()
    ok(invoke(root, "serve.stop", "--all"))


@pytest.fixture
def hung_server():
    """A server that takes requests and never answers them (until the test ends)."""
    release = threading.Event()

    class Hung(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            release.wait(60)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hung)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    release.set()
    server.shutdown()


def session(tmp_path: Path) -> client_link.ClientSession:
    env = {**os.environ, "PYTHONPATH": f"{Path(__file__).resolve().parent.parent}:{DOUBLES}"}
    linked = client_link.ClientSession(sys.executable, "sglang", "sglang.bench_serving", tmp_path / "session.log", env)
    assert linked.start(lambda: True) is None and linked.entry == "sglang.bench_serving.run_benchmark"
    return linked


def args(base: str, out: Path) -> list[str]:
    return ["--base-url", base, "--model", "m", "--dataset-name", "random-ids", "--random-input-len", "4",
            "--num-prompts", "2", "--warmup-requests", "1", "--output-file", str(out)]


def test_a_hung_server_ends_the_step_at_its_bound_and_kills_the_client_process(tmp_path, hung_server):
    linked = session(tmp_path)
    started = time.monotonic()
    code, seconds, why, _ = linked.run("bench", args(hung_server, tmp_path / "o.jsonl"), tmp_path / "step.log",
                                       3.0, lambda: True)
    assert why == "timed out" and 3.0 <= seconds < 10 and time.monotonic() - started < 10
    assert linked.proc is not None and linked.proc.poll() is not None       # killed, not left behind


def test_a_server_that_dies_ends_the_step(tmp_path, hung_server):
    linked = session(tmp_path)
    gone = threading.Event()
    threading.Timer(1.0, gone.set).start()
    _, seconds, why, _ = linked.run("bench", args(hung_server, tmp_path / "o.jsonl"), tmp_path / "step.log",
                                    600.0, lambda: not gone.is_set())
    assert why == "server died" and seconds < 15
    assert linked.proc is not None and linked.proc.poll() is not None


def test_sigterm_stops_the_client_process_mid_step(tmp_path, hung_server):
    """`invoke kill` TERMs the job's process group, the client process with it."""
    linked = session(tmp_path)
    assert linked.pid is not None
    threading.Timer(1.0, os.kill, (linked.pid, signal.SIGTERM)).start()
    code, seconds, why, _ = linked.run("bench", args(hung_server, tmp_path / "o.jsonl"), tmp_path / "step.log",
                                       600.0, lambda: True)
    assert code == -signal.SIGTERM and why.startswith("client process ended (exit -15)") and seconds < 10


def test_argparse_errors_and_steps_after_them_in_one_process(tmp_path, hung_server):
    """A bad argument is that step's failure (exit 2, argparse's words in its log); the process lives on."""
    linked = session(tmp_path)
    code, _, why, _ = linked.run("bench", ["--no-such-flag"], tmp_path / "bad.log", 30.0, lambda: True)
    assert code == 2 and why == "exited 2" and "unrecognized arguments: --no-such-flag" in (
        tmp_path / "bad.log").read_text()
    assert linked.proc is not None and linked.proc.poll() is None
    linked.close()
    assert linked.proc.poll() == 0


def test_client_args_strip_the_client_command():
    assert client_link.client_args(["/v/bin/vllm", "bench", "serve", "--seed", "1"]) == ["--seed", "1"]
    assert client_link.client_args(["/v/bin/python", "-m", "sglang.bench_serving", "--x"]) == ["--x"]
    assert client_link.client_args(["/v/bin/other", "run"]) is None


@pytest.mark.parametrize("version", ["0.4.10.post2", "0.5.10", "0.5.23"])
def test_real_sglang_clients_have_the_entry_the_client_process_runs(version):
    """The module the probe names (remote.bench.probe.CLIENTS, newest first) defines run_benchmark(args)
    and a ``__main__`` block that parses the flags and calls it: what client_session runs per step."""
    import ast
    import zipfile

    from remote.bench.probe import CLIENTS
    from tests.support.sglang_wheels import wheel
    with zipfile.ZipFile(wheel(version)) as whl:
        names = set(whl.namelist())
        module, rel = next((m, r) for m, r in CLIENTS["sglang"] if f"sglang/{r}" in names)
        tree = ast.parse(whl.read(f"sglang/{rel}").decode())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "run_benchmark" in defined, (version, module)
    mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert len(mains) == 1 and ("run_benchmark(" in ast.unparse(mains[0]) or "cli_main" in ast.unparse(mains[0]))
    if "cli_main" in ast.unparse(mains[0]):
        cli = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cli_main")
        assert "run_benchmark(" in ast.unparse(cli)


def test_a_client_that_floods_its_channel_with_foreign_lines_still_ends_at_the_bound(tmp_path):
    """Lines that are not replies (a library printing to the protocol's fd) are skipped, but never
    stretch the step's bound: the wait counts from the request, not from the last line."""
    flood = tmp_path / "flood-python"
    flood.write_text("#!/bin/sh\necho '{\"ready\": true, \"entry\": \"flood\"}'\n"
                     "while :; do echo 'not a reply'; sleep 0.05; done\n")
    flood.chmod(0o755)
    linked = client_link.ClientSession(str(flood), "sglang", None, tmp_path / "session.log", dict(os.environ))
    assert linked.start(lambda: True) is None and linked.entry == "flood"
    started = time.monotonic()
    code, seconds, why, _ = linked.run("bench", ["--x"], tmp_path / "step.log", 2.0, lambda: True)
    assert why == "timed out" and 2.0 <= seconds < 8 and time.monotonic() - started < 8
    assert linked.proc is not None and linked.proc.poll() is not None       # killed, not left behind
