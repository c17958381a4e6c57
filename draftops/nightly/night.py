"""One nightly run end to end: run the playbook on its hosts, judge each host against its earlier
nights, record the night in the history, write the report. The report is written whatever failed."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from draftops import history, tracking
from draftops.errors import HistoryError, PlaybookError
from draftops.nightly import detect, results
from draftops.nightly.playbook import Playbook
from draftops.nightly.runner import HostOutcome, Stop, run_hosts


@dataclass
class HostNightReport:
    outcome: HostOutcome
    verdicts: list[detect.MetricVerdict]
    trend: list[history.RunRecord] = field(default_factory=list)    # this setup's nights, oldest first
    logged: tracking.Logged | None = None                            # its MLflow run, when logged

    @property
    def regressed(self) -> bool:
        return any(v.verdict == detect.REGRESSION for v in self.verdicts)


@dataclass
class Night:
    night_id: str
    folder: Path
    playbook: Playbook
    playbook_path: Path
    started: str
    revision: str | None
    hosts: list[HostNightReport]
    notes: list[str] = field(default_factory=list)     # what went wrong outside the steps
    stopped: str = ""                                  # the signal that stopped the night, if one did

    @property
    def failed(self) -> bool:
        return any(h.outcome.failed for h in self.hosts)

    @property
    def regressed(self) -> bool:
        return any(h.regressed for h in self.hosts)

    @property
    def flagged(self) -> bool:
        return any(h.outcome.flagged for h in self.hosts)


def night_folder(runs: Path, now: datetime | None = None, hosts: Iterable[str] = (),
                 hist: history.History | None = None) -> tuple[str, Path]:
    """``runs/nightly-<date>``; another night on the same date gets ``-HHMMSS`` (then ``-2``, ``-3`` ...),
    so a night never overwrites another, also when two start in the same second, or when an earlier
    night's folder was moved away but its history rows (``<id>-<host>``) are still there."""
    now = now or datetime.now(timezone.utc)
    runs.mkdir(parents=True, exist_ok=True)
    names = [f"nightly-{now:%Y-%m-%d}", f"nightly-{now:%Y-%m-%d-%H%M%S}"]
    names += [f"{names[1]}-{n}" for n in range(2, 1000)]
    for name in names:
        if hist is not None and any(hist.get(row_id(name, h)) for h in hosts):
            continue
        try:
            (runs / name).mkdir()
        except FileExistsError:
            continue
        return name, runs / name
    raise PlaybookError(f"{runs} already holds a thousand nightly folders for {now:%Y-%m-%d %H:%M:%S}; "
                        "move old ones away.")


def pick_hosts(book: Playbook, only: str | None, source: str, inventory: list[str]) -> list[str]:
    """The hosts to run: all of the playbook's, or those --hosts names. Its steps are written for any
    host (``{host}`` and ``{root}`` are filled per host), so --hosts may point it at hosts of hosts.yaml
    outside its `hosts:` list (a smoke playbook on `gpu`) without a copy; each must be in hosts.yaml."""
    if only is None:
        missing = [h for h in book.hosts if h not in inventory]
        if missing:
            raise PlaybookError(f"{source}: `hosts:` names {', '.join(missing)}, not in the inventory (known hosts: "
                                f"{', '.join(inventory)}); add them to hosts.yaml, change the playbook, or run it "
                                "on hosts of hosts.yaml with --hosts a,b.")
        return list(book.hosts)
    names = [h.strip() for h in only.split(",")]
    if not all(names):
        raise PlaybookError(f"--hosts {only!r} holds an empty host name (a comma too many, or nothing at all); "
                            f"write the names separated by single commas, e.g. --hosts {','.join(book.hosts)}.")
    wanted = list(dict.fromkeys(names))           # a name given twice is one host
    unknown = [h for h in wanted if h not in inventory]
    if unknown or not wanted:
        raise PlaybookError(f"--hosts {only!r}: {', '.join(unknown) or 'no host'} not in the inventory (known hosts: "
                            f"{', '.join(inventory)}); the playbook {source} runs on any host of hosts.yaml.")
    return wanted


def judge_host(hist: history.History, book: Playbook, outcome: HostOutcome) -> list[detect.MetricVerdict]:
    earlier = results.baseline_nights(hist, outcome.host, book.setup, book.baseline_window + 1)
    return detect.judge_all([*(r.metrics for r in earlier), outcome.metrics], threshold=book.threshold,
                            lower_better=book.lower_better, window=book.baseline_window, min_nights=book.min_nights)


def host_verdict(outcome: HostOutcome, verdicts: list[detect.MetricVerdict], stopped: str = "") -> str:
    if stopped:
        return "stopped"
    if outcome.error or outcome.infra_failed:
        return "infrastructure"
    if outcome.failed:
        return "failed"
    if outcome.flagged:
        return "findings"
    if any(v.verdict == detect.REGRESSION for v in verdicts):
        return "regression"
    return "ok"


def row_id(night: str, host: str) -> str:
    return f"{night}-{host}"


def record(hist: history.History, night: str, book: Playbook, path: Path, outcome: HostOutcome,
           verdicts: list[detect.MetricVerdict], revision: str | None, stopped: str = "") -> history.RunRecord:
    rec = history.RunRecord(
        run_id=row_id(night, outcome.host), kind=results.NIGHTLY_KIND, host=outcome.host, time=outcome.started
        or history.now_iso(), git_rev=revision, draft=outcome.facts.get("draft"),
        settings={"setup": book.setup, "playbook": str(path), "runs": outcome.run_ids,
                  "steps": {s.name: s.status for s in outcome.steps},
                  "findings": [f"{f.severity}:{f.code}" for f in outcome.findings]},
        metrics=outcome.metrics, verdict=host_verdict(outcome, verdicts, stopped))
    hist.insert(rec)                              # never replaces an earlier night's row
    return rec


def run_night(book: Playbook, path: Path, project_root: Path, hosts: dict[str, str], stop: Stop | None = None,
              say: Callable[[str], None] | None = None) -> Night:
    """Run, judge, record; the caller writes the report. A night told to ``stop`` ends its running
    steps, runs the clean-up steps, and is still judged and recorded (as stopped)."""
    hist = history.for_project(project_root)
    try:
        night_id, folder = night_folder(project_root / "runs", hosts=hosts, hist=hist)
    except HistoryError:                      # an unreadable history: the night runs, and says so when it records
        night_id, folder = night_folder(project_root / "runs")
    started = history.now_iso()
    stop = stop if stop is not None else Stop()
    outcomes = run_hosts(book, hosts, project_root, folder, stop, say)
    revision = history.project_revision(project_root)
    night = Night(night_id, folder, book, path, started, revision, [], stopped=stop.why)
    for outcome in outcomes:
        try:
            verdicts = judge_host(hist, book, outcome)
            rec = record(hist, night_id, book, path, outcome, verdicts, revision, night.stopped)
            logged = tracking.log(project_root, rec, say or night.notes.append)   # its steps' runs nest under it
            trend = results.baseline_nights(hist, outcome.host, book.setup, 60)
        except HistoryError as exc:          # the report is still written, saying why it is partial
            outcome.error = outcome.error or f"not recorded in the history: {exc}"
            night.notes.append(f"{outcome.host}: {exc}")
            verdicts, trend, logged = [], [], None
        night.hosts.append(HostNightReport(outcome, verdicts, trend, logged))
    return night
