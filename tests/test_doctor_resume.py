"""`invoke doctor` before its first step and on `--resume`, run as a user runs it (the real `invoke`
on the built-in `local` host, a real job for the server a tampered state names): every argument is
checked before anything runs, a state file that is not what a doctor writes is one paragraph naming
the field, a resume refuses a differing flag by name and takes the port, a doctor being run is locked,
only a server whose host records match is stopped, the check-only doctor shows its findings.
The steps themselves (the demo's check, fix and re-check) are tests/test_doctor.py."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from draftops.doctor import plan, state
from draftops.link.host import open_host
from draftops.runs import jobs
from tests.conftest import REPO, copy_remote_package

FINDING = {"id": "layer-convention-shift", "severity": "bad",
           "text": "the config names layers one off what was dumped.",
           "fix": "invoke draft-config --ckpt DRAFT --from-report RUN"}


@pytest.fixture
def project(make_project, no_inventory_env) -> Path:
    root = make_project()
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    return root


def invoke(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)


def one_paragraph(done: subprocess.CompletedProcess) -> str:
    """The refusal: exit 1, no traceback, one paragraph (the console may wrap it: joined here)."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Error:" not in done.stderr.replace("error:", ""), done.stderr
    return " ".join(done.stderr.split())


def doctors(root: Path) -> list[Path]:
    return sorted((root / "runs").glob("*-doctor-*"))


def checked(root: Path, args: plan.Args, outcome: dict[str, Any] | None = None) -> state.State:
    """A doctor whose check step is done (test-drafter said MISMATCH with ``FINDING``), the rest pending."""
    made = state.new(root / "runs", "local", args)
    check = made.step(plan.CHECK)
    check.state, check.runs = "done", ["20261206-000000-test-drafter-abcd"]
    check.outcome = outcome or {"run_id": check.runs[0], "status": "MISMATCH", "fixable": True,
                                "findings": [FINDING], "bad_findings": [FINDING["id"]]}
    made.status = "unhealthy"
    made.save()
    return made


def tamper(made: state.State, change: Any) -> None:
    path = made.folder / "doctor.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


# --- arguments, before the first step ------------------------------------------------------------------

@pytest.mark.parametrize(("flags", "said"), [
    (["--port", "99999"], "--port 99999 is not a TCP port"),
    (["--profile", "nope"], "no serve profile 'nope'"),
    (["--draft", "mydraft", "--data", "dumps", "--fix"], "Give it with --target PATH"),
    (["--draft", "demo", "--target", "/models/other"], "drop --target /models/other"),
])
def test_every_argument_is_checked_before_the_first_step(project, flags, said):
    args = ["--draft", "demo", *flags] if "--draft" not in flags else flags
    text = one_paragraph(invoke(project, "doctor", *args))
    assert said in text and "Traceback" not in text
    assert doctors(project) == []                  # nothing ran: no doctor, no run
    assert not (project / ".draftops" / "runs").exists() or not any((project / ".draftops" / "runs").iterdir())


def test_fix_before_the_engine_is_installed_names_the_one_command_first(project):
    hosts = {"here": {"transport": "local", "root": str(project / "hostroot"), "engine": "vllm",
                      "engine_python": str(project / "no-vllm-yet")}}
    (project / "hosts.yaml").write_text(yaml.safe_dump({"default": "local", "hosts": hosts}))
    text = one_paragraph(invoke(project, "doctor", "--draft", "demo", "--fix", "--host", "here"))
    assert "invoke env.setup --engine vllm --host here" in text
    assert f"{project / 'no-vllm-yet'}/bin/python" in text and "does not exist" in text
    assert "baseline" in text and doctors(project) == []       # refused before the check ran
    assert not any((project / "hostroot" / "runs").glob("*")) if (project / "hostroot" / "runs").exists() else True


# --- the state file -------------------------------------------------------------------------------------

def _deep(doc: dict[str, Any]) -> None:
    nested: Any = 1
    for _ in range(900):
        nested = [nested]
    doc["steps"][0]["outcome"]["deep"] = nested


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d["steps"][0].update(name="nonsense"), "steps.0.name"),
    (lambda d: d.update(servers=[1, "x", None]), "servers.0"),
    (lambda d: d.update(steps=[]), "'steps'"),
    (lambda d: d["args"].update(port="8000"), "args.port"),
    (_deep, "nests deeper than"),
    (lambda d: d["steps"][0].update(runs="abc"), "steps.0.runs"),
    (lambda d: d.update(doctor_id="20261206-000000-doctor-ffff"), "doctor_id"),
    (lambda d: d["args"].update(fix=True), "'steps' names ['check']"),
])
def test_a_tampered_state_is_one_paragraph_naming_the_field(project, change, field):
    made = checked(project, plan.Args(draft="demo"))
    tamper(made, change)
    text = one_paragraph(invoke(project, "doctor", "--resume", made.doctor_id))
    assert str(made.folder / "doctor.json") in text and field in text, text
    assert "without --resume" in text


# --- what a resume takes --------------------------------------------------------------------------------

def test_resume_refuses_a_differing_flag_by_name_and_takes_the_port(project):
    made = checked(project, plan.Args(draft="demo"))
    text = one_paragraph(invoke(project, "doctor", "--resume", made.doctor_id, "--no-bench"))
    # the resume hint as cmdline prints it: this process's program, no --host for the default host
    assert "--no-bench" in text and f"invoke doctor --resume {made.doctor_id}`" in text
    text = one_paragraph(invoke(project, "doctor", "--resume", made.doctor_id, "--fix"))
    assert "--fix: False then, True now" in text
    # the port may change (a port taken since); the resumed check-only doctor exits with its status
    done = invoke(project, "doctor", "--resume", made.doctor_id, "--port", "8031")
    assert done.returncode == 3, done.stdout + done.stderr
    assert json.loads((made.folder / "doctor.json").read_text())["args"]["port"] == 8031
    # the check-only doctor shows the findings its verdict speaks of, and their fix
    flat = " ".join(done.stdout.split())
    assert "NOT HEALTHY" in flat and f"bad {FINDING['id']}: {FINDING['text']}" in flat
    assert f"fix: {FINDING['fix']}" in flat


def test_resume_with_the_same_folder_as_a_relative_path_is_the_same_doctor(project):
    made = checked(project, plan.Args(draft=str(project / "mydraft"), data=str(project / "dumps")))
    done = invoke(project, "doctor", "--resume", made.doctor_id, "--draft", "mydraft", "--data", "./dumps")
    assert done.returncode == 3, done.stdout + done.stderr          # resumed (the check was done): not healthy
    text = one_paragraph(invoke(project, "doctor", "--resume", made.doctor_id, "--draft", "other"))
    assert f"--draft: '{project / 'mydraft'}' then, '{project / 'other'}' now" in text


def test_a_doctor_being_run_is_locked_against_a_second_resume(project):
    made = checked(project, plan.Args(draft="demo"))
    with open(made.folder / state.LOCK_NAME, "a+") as held:          # as a running doctor holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        text = one_paragraph(invoke(project, "doctor", "--resume", made.doctor_id))
    assert "being run by another `" in text and "invoke doctor`" in text and "Nothing was run" in text
    assert json.loads((made.folder / "doctor.json").read_text())["resumed"] == []     # untouched
    text = one_paragraph(invoke(project, "doctor", "--resume", "20991231-000000-doctor-ffff"))
    assert "there is no doctor 20991231-000000-doctor-ffff" in text


def test_a_tampered_server_entry_never_stops_a_job_the_doctor_did_not_start(project):
    assert invoke(project, "sync").returncode == 0          # the code is on the host before the user's run starts
    host = open_host(None, project)
    job = jobs.start(host, "test-drafter", "sleep 120", task="test-drafter")     # a user's own run
    try:
        made = state.new(project / "runs", "local", plan.Args(draft="demo", fix=True))
        for step in made.steps:
            step.state = "done"
        made.step(plan.CHECK).outcome = {"status": "MISMATCH", "fixable": True, "findings": [FINDING],
                                         "bad_findings": [FINDING["id"]]}
        made.step(plan.FIX).outcome = {"run_id": "20261206-000000-draft-config-abcd"}
        made.step(plan.BASELINE).runs = [job.id]                       # even named as the step's own run
        made.servers = [{"run_id": job.id, "port": 8000, "role": "baseline", "state": "ready"}]
        made.status = "not-fixed"
        made.save()
        done = invoke(project, "doctor", "--resume", made.doctor_id)
        assert done.returncode == 3, done.stdout + done.stderr
        assert jobs.status(host, job.id)["state"] == "running"            # the user's run lives on
        flat = " ".join(done.stdout.split())
        assert f"left alone: run {job.id} is a job 'test-drafter'" in flat and "left running: nothing" in flat
        doc = json.loads((made.folder / "doctor.json").read_text())
        assert doc["servers"][0]["state"] == "not-ours"
        # a server entry whose run is no run of the doctor's step is left alone too
        tamper(made, lambda d: d["steps"][1].update(runs=[]) or d["servers"][0].update(state="ready"))
        done = invoke(project, "doctor", "--resume", made.doctor_id)
        assert done.returncode == 3 and "is no run of this doctor's step 'baseline'" in " ".join(done.stdout.split())
        assert jobs.status(host, job.id)["state"] == "running"
    finally:
        jobs.kill(host, job.id, 2.0)
