"""`invoke serve` end to end with the SGLang test double (tests/doubles/sglang), as a user types it, over
a real sshd and on a local host: start, readiness, read-back, status, logs, stop, crashes, ports."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from draftops import history
from draftops.serve import engines
from remote.bench.digest import config_digest
from tests.conftest import REPO
from tests.support.serving import (  # noqa: F401  (fixtures)
    DOUBLES,
    FAST,
    draft_config,
    ok,
    processes_of_runs_under,
    profile,
    project,
    refused,
    registry,
    run_id_of,
    run_processes,
    stop_processes,
    target_config,
    write_model,
)
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh


def generate(port: int) -> dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", method="POST",
                                 data=json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 8}}).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize(("where", "laptop"), [("box", "full"), ("loc", "full"), ("box", "base")],
                         indirect=["laptop"])   # the base install drives the ssh host too
def test_serve_status_logs_stop_and_the_server_outlives_the_link(project, tmp_path, where, laptop):  # noqa: F811
    root = project(where)
    port = registry(root)[where]["serve"]["default"]["port"]
    draft = write_model(tmp_path / "my draft's \"dir\"", draft_config([1, 15, 28]))    # quotes, a space
    out = ok(invoke(root, "serve", "--draft", draft, "--steps", "3", "--topk", "1", "--draft-tokens", "4"))
    assert "ready: SGLang" in out and "asked for vs effective" in out
    assert "the server runs with other values" not in out
    run_id = run_id_of(out)
    # the invoke call is over and its SSH connection closed: the server still serves
    assert generate(port)["meta_info"]["completion_tokens"] == 8
    status = ok(invoke(root, "serve.status"))
    row = next(line for line in status.splitlines() if f"│ {port} " in line or line.startswith(f"port {port} "))
    assert "sglang" in row and "alive" in row and run_id[:12] in status
    assert "num_draft_tokens=4" in status
    logs = ok(invoke(root, "serve.logs", "--lines", "400"))
    assert "The server is fired up and ready to roll!" in logs and "server_args=ServerArgs(" in logs
    decoded = [engines.get("sglang").parse_log_line(line) for line in logs.splitlines()]
    assert any(d and 1.0 <= d["accept_len"] <= 4.0 for d in decoded)       # steps 3: 1 .. steps+1
    assert run_processes(run_id)
    stopped = ok(invoke(root, "serve.stop"))
    assert f"port {port}" in stopped and "no process left" in stopped
    assert run_processes(run_id) == []
    assert "no draftops servers" in ok(invoke(root, "serve.status"))
    served = history.for_project(root).query(kind="serve")
    assert [(r.run_id, r.verdict, r.engine, r.draft) for r in served] == [(run_id, "ready", "sglang", draft)]
    assert served[0].settings["steps"] == 3 and served[0].metrics["effective"]
    assert served[0].draft_digest == config_digest(json.dumps(draft_config([1, 15, 28])))
    assert run_id[:12] in ok(invoke(root, "runs", "--local", "--kind", "serve"))


def test_topk1_override_is_refused_and_when_allowed_the_difference_is_shown(project, tmp_path):  # noqa: F811
    root = project("loc")
    draft = write_model(tmp_path / "draft", draft_config([1, 15, 28]))
    args = ("serve", "--draft", draft, "--steps", "1", "--topk", "1", "--draft-tokens", "16")
    text = refused(invoke(root, *args))
    assert "silently replaces --draft-tokens 16 by --steps + 1 = 2" in text and "started run" not in text
    out = ok(invoke(root, *args, "--allow-override"))
    flat = " ".join(out.split())
    assert "the server runs with other values than asked for: num draft tokens" in flat
    row = next(line for line in out.splitlines() if "num draft tokens" in line)
    assert row.split("│")[2].strip() == "16" and row.split("│")[3].strip() == "2"
    assert "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1" in flat
    ok(invoke(root, "serve.stop", "--all"))


def test_a_server_crashing_at_start_up_shows_its_log_tail_and_leaves_no_process(project, tmp_path):  # noqa: F811
    root = project("box", default=profile(tmp_path, target=write_model(
        tmp_path / "odd", target_config(arch="FooForCausalLM"))))
    draft = write_model(tmp_path / "draft", draft_config([1, 15, 28]))
    result = invoke(root, "serve", "--draft", draft)
    text = refused(result)
    assert "exited during start-up" in text and "Last 50 log lines" in text
    assert "Model architectures ['FooForCausalLM'] are not supported" in text
    run_id = run_id_of(result.stdout)
    assert run_processes(run_id) == []          # including the double's orphaned detokenizer
    assert "no draftops servers" in ok(invoke(root, "serve.status"))
    assert [(r.run_id, r.verdict) for r in history.for_project(root).query(kind="serve")] == [(run_id, "failed")]


def test_a_server_not_ready_in_time_is_stopped(project, tmp_path):  # noqa: F811
    slow = profile(tmp_path, ready_timeout=2, double={"DRAFTOPS_SGLANG_DOUBLE_LOAD_S": "60"})
    root = project("loc", default=slow)
    result = invoke(root, "serve", "--baseline")
    text = refused(result)
    assert "was not ready after 2 s" in text and "Load weight begin" in text
    assert run_processes(run_id_of(result.stdout)) == []


def test_port_in_use_is_refused_and_replace_stops_the_old_server(project, tmp_path):  # noqa: F811
    root = project("loc")
    first = run_id_of(ok(invoke(root, "serve", "--baseline")))
    text = refused(invoke(root, "serve", "--baseline"))
    assert f"is in use by the sglang server of run {first}" in text and "--replace" in text
    out = ok(invoke(root, "serve", "--baseline", "--replace"))
    second = run_id_of(out)
    assert second != first and f"stopped the sglang server of run {first}" in " ".join(out.split())
    assert run_processes(first) == [] and run_processes(second)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        text = refused(invoke(root, "serve", "--baseline", "--port", str(busy.getsockname()[1])))
    assert "in use by a process draftops did not start" in text
    ok(invoke(root, "serve.stop", "--all"))
    assert run_processes(second) == []


def test_replace_says_and_records_how_long_the_old_server_took_to_exit(project, tmp_path):  # noqa: F811
    """The old server's shutdown is the engine's time, not draftops': serve --replace measures it on
    the host (from TERM until its last process is gone) and keeps it in the serve run's record."""
    slow = profile(tmp_path, double={"DRAFTOPS_SGLANG_DOUBLE_EXIT_S": "1.5"})
    root = project("loc", default=slow)
    first = run_id_of(ok(invoke(root, "serve", "--baseline")))
    out = " ".join(ok(invoke(root, "serve", "--baseline", "--replace")).split())
    said = float(out.split(f"stopped the sglang server of run {first}", 1)[1].split("it exited in ", 1)[1].split()[0])
    assert 1.5 <= said < 10.0, out
    rows = history.for_project(root).query(kind="serve")
    assert [r.metrics.get("replaced_exit_s") for r in rows] == [pytest.approx(said, abs=0.051), None]
    stopped = " ".join(ok(invoke(root, "serve.stop", "--all")).split())
    assert 1.5 <= float(stopped.split(" in ", 1)[1].split(" s,")[0]) < 10.0, stopped


def test_file_checks_refuse_over_ssh_and_a_mismatch_verdict_needs_force(project, tmp_path):  # noqa: F811
    root = project("box", default=profile(tmp_path), ghost=profile(tmp_path, python="/no/such/env/bin/python"))
    text = refused(invoke(root, "serve", "--baseline", "--profile", "ghost"))
    assert "The python /no/such/env/bin/python does not exist on host 'box'" in text
    wrong = write_model(tmp_path / "wrong", draft_config([1, 15, 31]))
    text = refused(invoke(root, "serve", "--draft", wrong, "--steps", "3", "--topk", "1", "--draft-tokens", "4"))
    assert "can only capture ids -1..30; [31] is outside" in text and "started run" not in text
    draft = write_model(tmp_path / "draft", draft_config([1, 15, 28]))
    report = {"schema": "draftops.drafter-report/1", "checkpoint": {"path": draft, "configured_layer_ids": [1, 15, 28]},
              "verdict": {"status": "MISMATCH", "message": "Trained on [-1, 1, 15].", "serving_convention": "sglang"}}
    (root / "runs" / "20261130-000000-test-drafter-abcd").mkdir(parents=True)
    (root / "runs" / "20261130-000000-test-drafter-abcd" / "report.json").write_text(json.dumps(report))
    text = refused(invoke(root, "serve", "--draft", draft))
    assert "is MISMATCH: Trained on [-1, 1, 15]." in text and "--force" in text
    out = " ".join(ok(invoke(root, "serve", "--draft", draft, "--force")).split())
    assert "Serving anyway (--force)" in out and "ready: SGLang" in out
    ok(invoke(root, "serve.stop"))


def test_embedding_ids_need_the_capture_patch_then_serve_with_the_ids_exported(project, tmp_path):  # noqa: F811
    from tests.support.sglang_wheels import extract
    venv = tmp_path / "sgl-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    extract("0.5.13", site)                       # real SGLang sources: what the patcher reads
    for name in ("__init__.py", "launch_server.py"):   # plus the double's server entry point
        (site / "sglang" / name).write_text((DOUBLES / "sglang" / name).read_text())
    python = str(venv / "bin" / "python")
    serve = profile(tmp_path, python=python, target=write_model(tmp_path / "t6", target_config(layers=6)),
                    env=FAST)
    root = project("box", default=serve)
    hosts = yaml.safe_load((root / "hosts.yaml").read_text())
    hosts["hosts"]["box"]["python"] = python          # the patcher runs with the host's ml-env python
    (root / "hosts.yaml").write_text(yaml.safe_dump(hosts))
    draft = write_model(tmp_path / "draft", draft_config([-1, 1, 3]))
    text = refused(invoke(root, "serve", "--draft", draft))
    assert "include -1 (the embedding output), which SGLang 0.5.13" in text
    assert "invoke patch-sglang.apply --host box" in text
    ok(invoke(root, "patch-sglang.apply"))
    out = ok(invoke(root, "serve", "--draft", draft))
    assert "captures the embedding (id -1)" in " ".join(out.split())
    pids = run_processes(run_id_of(out))
    environs = [Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for pid in pids]
    assert any(b"DRAFTOPS_EAGLE3_LAYER_IDS=-1,1,3" in env for env in environs)
    ok(invoke(root, "serve.stop"))
    deadline = time.monotonic() + 5
    while run_processes(run_id_of(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run_processes(run_id_of(out)) == []


def test_two_serve_calls_racing_for_one_port_start_one_server(project, tmp_path):  # noqa: F811
    root = project("loc")
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    calls = [subprocess.Popen([sys.executable, "-m", "invoke", "serve", "--baseline"], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(c.wait(timeout=240), *c.communicate()) for c in calls]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    loser = next(" ".join((out + err).split()) for code, out, err in results if code == 1)
    assert "claimed" in loser or "is in use by the sglang server" in loser, loser
    status = ok(invoke(root, "serve.status"))
    assert status.count("alive") == 1
    ok(invoke(root, "serve.stop", "--all"))


def test_the_project_fixtures_clean_up_stops_every_job_left_under_its_roots(tmp_path):
    """What the `project` fixture runs after each test: a job left running under a host root (with a
    child of its own, as the double's detokenizer) is stopped; a job of another root is not."""
    def job(run_dir: Path) -> subprocess.Popen:
        env = {**os.environ, "DRAFTOPS_RUN_DIR": str(run_dir)}
        return subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & wait"], env=env, start_new_session=True)

    left, other = job(tmp_path / "hostroot" / "runs" / "r1"), job(tmp_path.parent / "elsewhere" / "runs" / "r2")
    try:
        deadline = time.monotonic() + 10
        while len(processes_of_runs_under(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = processes_of_runs_under(tmp_path)
        assert left.pid in found and len(found) == 2 and other.pid not in found       # the shell and its sleep
        stop_processes(found, grace_s=0.5)                                            # TERM is ignored: KILL
        left.wait(timeout=5)
        assert processes_of_runs_under(tmp_path) == [] and other.poll() is None
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait(timeout=5)
