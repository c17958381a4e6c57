"""The engine tests' two xdist groups (tests/conftest.py): the speed-judging ones one at a time in
``engine``, those that judge no speed in ``engine-check`` on a second worker, whose vLLM servers bind
their compute to the other core. The CI's wall time is the engine group's (its critical path)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ENGINE_CHECK, ENGINE_CHECK_GROUP, OMP_BIND, REPO

#: engine tests that compare speeds (a ratio with its interval, a faster/slower decision, a tuned
#: best): none of them may ever run beside a second vLLM server of the suite
SPEED_JUDGING = ("test_comparison_engine.py", "test_bench_seed_engine.py", "test_tune_engine.py",
                 "test_tune_overdraft_engine.py", "test_doctor_engine.py", "test_nightly_smoke_engine.py")

RECORDER = '''
import json, os
def pytest_collection_finish(session):
    groups = {}
    for item in session.items:
        marks = [m.args[0] for m in item.iter_markers("xdist_group")]
        groups[item.nodeid] = marks
    with open(os.environ["GROUPS_OUT"], "w") as f:
        json.dump(groups, f)
'''


def collected_groups(tmp_path: Path) -> dict[str, list[str]]:
    """Every engine test's xdist groups, from a real collection of the suite (no test runs)."""
    (tmp_path / "group_recorder.py").write_text(RECORDER)
    out = tmp_path / "groups.json"
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "GROUPS_OUT": str(out), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:xdist", "-p", "group_recorder",
                           "-p", "no:cacheprovider", "-o", "addopts=", "-m", "engine", "tests"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    groups: dict[str, list[str]] = json.loads(out.read_text())
    return groups


def test_speed_judging_engine_tests_share_one_group_and_the_others_the_check_group(tmp_path: Path) -> None:
    groups = collected_groups(tmp_path)
    names = {nodeid.rsplit("/", 1)[-1] for nodeid in groups} | {n.split("::")[0].rsplit("/", 1)[-1] for n in groups}
    assert set(SPEED_JUDGING) <= names and ENGINE_CHECK <= names, sorted(names)     # no name left stale
    for nodeid, marks in groups.items():
        named = {nodeid.rsplit("/", 1)[-1], nodeid.split("::")[0].rsplit("/", 1)[-1]}
        assert marks == [ENGINE_CHECK_GROUP if named & ENGINE_CHECK else "engine"], (nodeid, marks)
    speed = [n for n, marks in groups.items() if marks == ["engine"]]
    assert {n.split("::")[0].rsplit("/", 1)[-1] for n in speed} >= set(SPEED_JUDGING)
    # of the speed-judging files only the seed story on `local` goes aside: it asserts no more than
    # "not slower" of a draft about x2 faster, and its servers start here (on `box` they start over SSH)
    aside = {n.rsplit("/", 1)[-1] for n, marks in groups.items() if marks == [ENGINE_CHECK_GROUP]}
    assert [n for n in aside if n.split("::")[0] in SPEED_JUDGING] == [
        "test_bench_seed_engine.py::test_seed_story_measured_against_predicted[local]"]


CORE_PROBE = """
import os
from pathlib import Path
import pytest
pytestmark = pytest.mark.engine
def test_sees_the_core():
    Path(os.environ["BIND_OUT"]).write_text(os.environ.get("{bind}", "unset"))
"""


def bind_seen(tmp_path: Path, name: str, workers: str) -> str:
    """The OMP binding a test named like ``name`` (an engine test file) sees under the suite's conftest."""
    where = tmp_path / workers / name.removesuffix(".py")
    where.mkdir(parents=True)
    (where / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (where / name).write_text(CORE_PROBE.format(bind=OMP_BIND))
    env = {**os.environ, "PYTHONPATH": str(REPO), "BIND_OUT": str(where / "bind")}
    env.pop(OMP_BIND, None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", workers, "--dist", "loadgroup",
                           "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(where), name],
                          cwd=where, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return (where / "bind").read_text()


def test_only_the_check_group_under_xdist_binds_its_servers_to_the_last_core(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    beside = str(cpus[-1]) if len(cpus) > 1 else "unset"
    assert bind_seen(tmp_path, "test_vllm_engine.py", "2") == beside
    assert bind_seen(tmp_path, "test_vllm_engine.py", "0") == "unset"           # alone: vLLM's own default
    assert bind_seen(tmp_path, "test_comparison_engine.py", "2") == "unset"     # the speed group: core 0


RECORD = """
import os
import pytest
pytestmark = pytest.mark.{mark}
@pytest.mark.parametrize("n", range({count}))
def test_one(n):
    with open(os.environ["ORDER_OUT"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + " " + __name__ + "\\n")
"""


def test_each_group_runs_on_one_worker_and_the_speed_judging_one_is_handed_out_first(tmp_path: Path) -> None:
    """A group on one worker: pytest 9 reads no ``item._nodeid``, where pytest-xdist 3.8 puts the group (so
    every test was its own group and the engine tests ran side by side). And xdist hands out the groups
    with the most tests first: the Slurm and check groups outnumber the speed-judging one, which would
    then wait behind one of them though it is the critical path."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    for name, mark, count in (("test_comparison_engine.py", "engine", 1), ("test_vllm_engine.py", "engine", 6),
                              ("test_slurm_probe.py", "slurm", 5)):
        (tmp_path / name).write_text(RECORD.format(mark=mark, count=count))
    order = tmp_path / "order"
    _two_workers(tmp_path, ORDER_OUT=str(order))
    runs = [line.split() for line in order.read_text().splitlines()]
    workers = {module: {w for w, m in runs if m == module} for _, module in runs}
    assert all(len(w) == 1 for w in workers.values()), runs      # each group on one worker, in turn
    (worker,) = workers["test_comparison_engine"]
    assert [m for w, m in runs if w == worker][0] == "test_comparison_engine", runs


TIMED = """
import os, time
import pytest
pytestmark = pytest.mark.engine
@pytest.mark.parametrize("n", range({count}))
def test_one(n):
    start = time.monotonic()
    time.sleep({seconds})
    with open(os.environ["SPANS_OUT"], "a") as f:
        f.write(f"{{__name__}} {{start}} {{time.monotonic()}}\\n")
"""


def test_a_small_margin_speed_judgment_never_runs_beside_a_check_test(tmp_path: Path) -> None:
    """The comparison (quiet, tests/support/engine_quiet.py) and three check-group tests, on two workers:
    both groups start together, yet no check test's span overlaps the comparison's."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_comparison_engine.py").write_text(TIMED.format(count=1, seconds=3))
    (tmp_path / "test_vllm_engine.py").write_text(TIMED.format(count=3, seconds=1))
    spans = tmp_path / "spans"
    _two_workers(tmp_path, SPANS_OUT=str(spans))
    rows = [line.split() for line in spans.read_text().splitlines()]
    ((q0, q1),) = [(float(a), float(b)) for name, a, b in rows if name == "test_comparison_engine"]
    checks = [(float(a), float(b)) for name, a, b in rows if name == "test_vllm_engine"]
    assert len(checks) == 3 and all(b <= q0 or a >= q1 for a, b in checks), (q0, q1, checks)


def _two_workers(folder: Path, **env: str) -> None:
    """pytest on ``folder`` with two xdist workers and the project's groups, as the suite runs."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", "-o", "addopts=", "--rootdir", str(folder), "."],
                          cwd=folder, env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
