"""Option values a task cannot honour are refused in one line before the host is touched: a grace
period that is not a finite number of seconds (`serve.stop`, `kill`), a negative line count, and any
number option given text (Invoke's own cast would print a traceback)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.tasks import invoke

STOPS = {"serve.stop": (["serve.stop"], "the server gets"),
         "kill": (["kill", "20260101-000000-x-aaaa"], "the run gets")}


@pytest.fixture
def project(make_project, tmp_path: Path, no_inventory_env) -> Path:
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot")}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    return root


@pytest.mark.parametrize("task", list(STOPS))
@pytest.mark.parametrize("grace", ["nan", "inf", "-5", "1e9", "soon"])
def test_grace_must_be_a_sane_number_of_seconds(project: Path, task: str, grace: str) -> None:
    args, what = STOPS[task]
    done = invoke(project, *args, "--grace", grace)
    text = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1 and "Traceback" not in text, text
    assert f"--grace {grace!r} is not" in text and what in text, text
    assert not (project.parent / "locroot").exists()          # refused before the host was touched


def test_kill_with_a_good_grace_reaches_the_host(project: Path) -> None:
    done = invoke(project, "kill", "20260101-000000-x-aaaa", "--grace", "0.5")
    assert done.returncode == 1 and "--grace" not in done.stderr       # an unknown run, named by the host
    assert "20260101-000000-x-aaaa" in done.stdout + done.stderr and (project.parent / "locroot").exists()


def test_logs_lines_must_not_be_negative(project: Path) -> None:
    done = invoke(project, "serve.logs", "--lines", "-3")
    assert done.returncode == 1 and "--lines must be 0 or more, not -3" in done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("args, needle", [
    (["runs", "--last", "abc"], "--last 'abc' is not a whole number."),
    (["logs", "x", "--lines", "1.5"], "--lines '1.5' is not a whole number."),
    (["serve.logs", "--lines", "many"], "--lines 'many' is not a whole number."),
    (["serve.stop", "--port", "80a"], "--port '80a' is not a whole number."),
    (["serve", "--draft", "demo", "--steps", "three"], "--steps 'three' is not a whole number."),
    (["bench", "--repeats", "x"], "--repeats 'x' is not a whole number."),
    (["bench.compare", "--tolerance", "ten percent"], "--tolerance 'ten percent' is not a number."),
    (["test-drafter", "--limit", "all"], "--limit 'all' is not a whole number."),
    (["test-drafter", "--expected-acc", "high"], "--expected-acc 'high' is not a number."),
    (["sync", "kill", "x", "--grace", "nan"], "--grace 'nan' is not a number of seconds from 0 to 3600 (default 10): "
                                              "how long the run gets between SIGTERM and SIGKILL."),
])
def test_an_option_of_the_wrong_type_is_a_one_line_error_not_a_traceback(project: Path, args: list[str],
                                                                         needle: str) -> None:
    done = invoke(project, *args)
    assert done.returncode == 1 and done.stderr.strip() == f"error: {needle}", done.stdout + done.stderr
    assert not (project.parent / "locroot").exists()


def test_every_number_option_of_every_task_is_declared_once_beside_its_task() -> None:
    """A number option left to Invoke arrives as text (default None) or crashes on `x` (an int
    default): each one must be in its task's ``options`` table, the one place options are read."""
    import inspect

    from draftops.cli.options import Task
    from tests.support.task_collection import collection

    ns = collection()
    tasks = {**ns.tasks, **{f"{name}.{t}": task for name, sub in ns.collections.items()
                            for t, task in sub.tasks.items()}}
    numbers = {}
    for name, task in tasks.items():
        assert isinstance(task, Task), name
        params = inspect.signature(task.body).parameters
        numbers[name] = {n for n, p in params.items() if {"int", "float"} & set(str(p.annotation).split())}
        assert numbers[name] == set(task.options), name
    assert numbers["kill"] == {"grace"} and numbers["bench.run"] >= {"prompts", "port"}     # the test sees them


def test_no_task_reads_an_option_its_own_way() -> None:
    """The other ways options were checked (a patched ``Argument.set_value``, per-task casts, range
    checks in task bodies raising Exit) stay gone."""
    text = "\n".join(p.read_text() for p in (REPO / "draftops" / "cli").glob("*.py")) + (REPO / "tasks.py").read_text()
    for gone in ("set_value", "whole_number", "grace_seconds", "def _whole", "def _count", "must be 0 or more"):
        assert gone not in text, gone
