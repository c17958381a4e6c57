"""`invoke bench.compare`: two benchmark runs side by side with test-drafter's prediction, and what
follows from them. (`invoke bench` itself, the runner, lands with `invoke serve`; its client
command lines are already planned in draftops/bench/plan.py.)"""
from __future__ import annotations

from pathlib import Path

from invoke import Context, task
from invoke.exceptions import Exit

from draftops import history, jobs, records
from draftops.cli.common import friendly, project_root
from draftops.console import console
from draftops.errors import BenchError, HistoryError

TOLERANCE = 0.10        # draftops.bench.compare.TOLERANCE; the bench modules load when the task runs


def run_folder(root: Path, ref: str) -> Path:
    """A run id (its folder under runs/) or a path to a run folder or bench-result.json."""
    given = Path(ref).expanduser()
    if given.exists():
        return given
    if "/" in ref or ref.startswith(".") or not ref.strip():
        raise BenchError(f"{ref!r} is neither a run id nor an existing run folder; `invoke runs --local --kind "
                         "bench` lists the benchmark runs.")
    return root / "runs" / ref


@task(help={"run_a": "run A: a bench run id or folder (default: the latest baseline of run B's host, "
                     "engine and target)",
            "run_b": "run B: a bench run id or folder (default: the latest speculative run)",
            "host": "pick the default pair among this host's runs only",
            "tolerance": "how far measured may be from predicted accept length, as a fraction (default 0.10)"})
@friendly
def compare(c: Context, run_a: str | None = None, run_b: str | None = None, host: str | None = None,
            tolerance: float = TOLERANCE) -> None:
    """Compare two bench runs (default: the latest baseline and the latest speculative run of the same
    host, engine and target) against test-drafter's predicted accept length; writes
    runs/<id>/compare.{md,json,png}."""
    from draftops.bench import compare as comparing
    from draftops.bench import outputs, render, result
    if bool(run_a) != bool(run_b):
        raise Exit("error: give both --run-a and --run-b (two bench run ids), or neither for the default pair.",
                   code=1)
    if not 0 < tolerance < 1:
        raise Exit(f"error: --tolerance {tolerance} must be a fraction between 0 and 1, e.g. 0.10.", code=1)
    root = project_root(c)
    hist = history.for_project(root)
    if not run_a or not run_b:
        run_a, run_b = comparing.default_pair(hist, host)
    runs = [result.load(run_folder(root, ref)) for ref in (run_a, run_b)]
    if runs[0].run_id == runs[1].run_id:
        raise BenchError(f"--run-a and --run-b are the same run ({runs[0].run_id}); give two different runs.")
    predictions = {r.run_id: comparing.find_prediction(hist, r) for r in runs}
    cmp = comparing.compare(runs[0], runs[1], predictions, tolerance)
    run_id = jobs.new_run_id("bench-compare")
    paths = outputs.write(cmp, root / "runs" / run_id)
    render.show(cmp, console)
    console.print(f"[dim]written: {paths['markdown']}, {paths['json'].name}, {paths['chart'].name}[/]")
    try:
        hist.record(records.compare_record(cmp, run_id, git_rev=history.project_revision(root)))
    except HistoryError as exc:
        console.print(f"[yellow]warning: this comparison was not recorded in the local history: {exc}[/]")
