"""`invoke test-drafter --gpus N [--hosts a,b]` as a user runs it: 2 gloo ranks on `local`, and 2 nodes of
1 rank over the real sshd (two hosts.yaml entries that both reach 127.0.0.1, each with its own root),
each giving the report one process gives, recorded in the history like any test-drafter run."""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ssh_entry
from tests.support.drafter_support import task_project
from tests.support.sshd import free_port
from tests.support.tasks import invoke
from tests.support.torchrun import comparable

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, sshd: Any) -> Path:
    base = tmp_path_factory.mktemp("torchrun-task")
    hosts = {name: ssh_entry(sshd, base / name, python=sys.executable) for name in ("a", "b")}
    return task_project(base, hosts, "local", demo_roots=(base / "a" / "hostroot", base / "b" / "hostroot"),
                        local_demo=True)


def report_of(project: Path, before: set[str]) -> tuple[str, dict[str, Any]]:
    new = sorted({p.name for p in (project / "runs").glob("*-test-drafter-*")} - before)
    assert len(new) == 1, new
    return new[0], json.loads((project / "runs" / new[0] / "report.json").read_text())


def runs_here(project: Path) -> set[str]:
    return {p.name for p in (project / "runs").glob("*-test-drafter-*")} if (project / "runs").is_dir() else set()


@pytest.fixture(scope="module")
def one_process(project: Path) -> dict[str, Any]:
    before = runs_here(project)
    result = invoke(project, "sync", "test-drafter", "--host", "local", "--full")
    assert result.returncode == 0, result.stdout + result.stderr
    return report_of(project, before)[1]


def test_gpus_2_on_local_gives_the_report_of_one_process(project: Path, one_process: dict[str, Any]) -> None:
    before = runs_here(project)
    result = invoke(project, "test-drafter", "--host", "local", "--gpus", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    run_id, report = report_of(project, before)
    assert comparable(report) == comparable(one_process)
    assert "fix: eagle_aux_hidden_state_layer_ids" in result.stdout
    with sqlite3.connect(project / "runs" / "history.sqlite") as db:
        rows = db.execute("select run_id from runs where run_id = ?", (run_id,)).fetchall()
    assert rows, "the torchrun's run is not in the history"
    listed = invoke(project, "runs", "--host", "local").stdout
    row = next(line for line in listed.splitlines() if run_id in line)
    assert "--gpus 2" in row and "succeeded" in row


def test_two_hosts_of_one_rank_each_over_ssh_give_the_same_report(project: Path) -> None:
    for name in ("a", "b"):
        result = invoke(project, "sync", "--host", name)
        assert result.returncode == 0, result.stdout + result.stderr
    before = runs_here(project)
    result = invoke(project, "test-drafter", "--host", "a", "--full")
    assert result.returncode == 0, result.stdout + result.stderr
    run_one, single = report_of(project, before)
    before = runs_here(project)
    result = invoke(project, "test-drafter", "--gpus", "1", "--hosts", "a,b", "--port", str(free_port()))
    assert result.returncode == 0, result.stdout + result.stderr
    run_two, report = report_of(project, before)
    assert comparable(report) == comparable(single)   # both on host a's demo: every key but the time
    listed = invoke(project, "runs", "--host", "b").stdout    # node 1's job: an ordinary run on host b
    assert "--node 1/2" in listed and "succeeded" in listed, listed
    assert "--node 0/2" in invoke(project, "runs", "--host", "a").stdout


def test_the_torchrun_flags_that_cannot_go_together_are_one_line_each(project: Path) -> None:
    for flags, said in ((["--hosts", "a,b"], "give --gpus N"),
                        (["--gpus", "2", "--nodes", "2", "--host", "local"], "--nodes is for a host with `scheduler"),
                        (["--gpus", "1", "--hosts", "a,a"], "names a host twice"),
                        (["--gpus", "0"], "1 or more")):
        result = invoke(project, "test-drafter", *flags)
        assert result.returncode == 1, result.stdout + result.stderr
        assert said in result.stdout + result.stderr, flags
        assert "Traceback" not in result.stderr
