"""`.ci/run` says where the CI's time goes (issue 37, item 7): its pytest prints the 25 slowest tests
whatever pyproject's addopts say, and the run ends with its total time."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = (REPO / ".ci" / "run").read_text()


def pytest_line() -> list[str]:
    (line,) = [ln for ln in SCRIPT.splitlines() if "-m pytest" in ln and not ln.lstrip().startswith("#")]
    return shlex.split(line.split("||")[0])


def test_the_ci_pytest_prints_its_25_slowest_tests_without_the_projects_addopts(tmp_path: Path):
    args = pytest_line()
    (tmp_path / "test_one.py").write_text("def test_a():\n    pass\n")
    run = subprocess.run([sys.executable, *args[1:], "-c", "/dev/null", "-p", "no:cacheprovider",
                          "-p", "no:xdist", str(tmp_path / "test_one.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "slowest 25 durations" in run.stdout


def test_the_ci_run_ends_with_its_total_time():
    last = SCRIPT.rstrip().splitlines()[-3:]
    assert last[0].startswith("total=$((SECONDS - started))") and last[1].startswith('echo "CI total:')
    assert last[2] == 'exit "$rc"'
