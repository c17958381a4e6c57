"""What one night measured on one host, read back from the runs its steps recorded.

The steps are ordinary draftops tasks; each records its run in ``runs/history.sqlite`` (test-drafter,
bench, compare). The night's metrics are those rows, flattened into one mapping with stable names
(``speculative.tok_s``, ``speedup``, ``accept_length.measured``, ``drafter.step0_acc`` ...), and
stored as one ``nightly`` row per host so later nights find their baseline with one query.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftops import history
from draftops.history import History, RunRecord
from remote import jsonread

if TYPE_CHECKING:
    from draftops.documents.drafter_report import DrafterReport
    from draftops.documents.env_check import EnvCheck

NIGHTLY_KIND = "nightly"
_ENV_JSON = re.compile(r"JSON: (\S*env\.json)")
_CAPTURE_JSON = re.compile(r"report: (\S*capture-check\.json)")
MARK = {"bad": "✗", "warn": "!", "good": "✓", "info": "·"}       # as bench.compare shows them


@dataclass(frozen=True)
class Finding:
    """One conclusion a step of the night drew (test-drafter's, capture-check's, bench's or
    bench.compare's findings), read from the file its run wrote."""

    run_id: str
    severity: str                  # bad | warn | good | info
    code: str
    text: str

    @property
    def bad(self) -> bool:
        return self.severity == "bad"

    @property
    def mark(self) -> str:
        return MARK.get(self.severity, "?")


def baseline_nights(hist: History, host: str, setup: str, limit: int) -> list[RunRecord]:
    """The last ``limit`` nightly rows of ``host`` with this setup, oldest first."""
    rows = [r for r in hist.query(kind=NIGHTLY_KIND, host=host) if r.settings.get("setup") == setup]
    return list(reversed(rows[:limit]))


def night_runs(hist: History, host: str, since: str, exclude: Iterable[str] = ()) -> list[RunRecord]:
    """Runs ``host`` recorded since ``since`` (oldest first), nightly rows and ``exclude`` left out."""
    skip = set(exclude)
    return [r for r in reversed(hist.query(host=host, since=since))
            if r.kind != NIGHTLY_KIND and r.run_id not in skip]


def step0_accuracy(report: DrafterReport) -> float | None:
    """Step-0 full accuracy of the served layout (verifier targets when given, else data tokens)."""
    served = report.metrics.served
    for counts in (served.verifier, served.data) if served else ():
        if counts and counts.full_acc and counts.full_acc[0] is not None:
            return counts.full_acc[0]
    return None


def _report_step0(path: Path) -> float | None:
    """:func:`step0_accuracy` of the report at ``path``; None when it is missing or fails its model."""
    from draftops.documents import load
    from draftops.documents.drafter_report import DrafterReport
    from draftops.errors import DocumentError

    try:
        return step0_accuracy(load(DrafterReport, path))
    except DocumentError:
        return None


def metrics_of(runs: Iterable[RunRecord], project_root: Path) -> dict[str, Any]:
    """The night's flat metrics (a later run of the same kind and mode replaces an earlier one; failed
    runs are left out)."""
    out: dict[str, Any] = {}
    for run in runs:
        if run.verdict == "failed":          # a failed run's partial figures are no measurement (SGLang CI)
            continue
        m = run.metrics
        if run.kind == "test-drafter":
            out["accept_length.predicted"] = m.get("predicted_served")
            out["drafter.step0_acc"] = _report_step0(project_root / "runs" / run.run_id / "report.json")
        elif run.kind == "bench":
            mode = str(run.settings.get("mode") or "bench")
            out[f"{mode}.tok_s"] = m.get("output_throughput")
            out[f"{mode}.ttft_ms"] = m.get("ttft_median_ms")
            out[f"{mode}.tpot_ms"] = m.get("tpot_median_ms")
            if mode != "baseline":
                out["accept_length.measured"] = m.get("accept_length")
        elif run.kind == "compare":
            out["speedup"] = m.get("speedup")
    return {k: v for k, v in history.json_safe(out).items() if v is not None}


def findings_of(runs: Iterable[RunRecord], project_root: Path, step_log: str = "") -> list[Finding]:
    """What the night's steps concluded, from the file each run wrote (the history row holds only
    codes): test-drafter's report.json (its verdict and named causes), bench's bench-result.json (its
    warnings), bench.compare's compare.json, and the capture-check(s) a step's log names
    (``step_log``; capture-check records no history row). A run whose file cannot be read is a ✗
    finding itself: a night whose conclusions are unknown is not healthy."""
    found: list[Finding] = []
    for run in runs:
        folder = project_root / "runs" / run.run_id
        if run.kind == "compare":
            found += _compare_findings(run, folder / "compare.json")
        elif run.kind == "test-drafter" and run.verdict != "failed":
            found += _drafter_findings(run, folder / "report.json")
        elif run.kind == "bench" and run.verdict != "failed":
            found += _bench_findings(run, folder / "bench-result.json")
    for path in capture_checks_in(step_log, project_root):
        found += _capture_findings(path)
    return found


def _unreadable(run_id: str, what: str, path: Path, why: object, task: str) -> Finding:
    return Finding(run_id, "bad", f"{what}-unreadable",
                   f"the run {run_id} left no readable {path} ({why}), so its findings are unknown; "
                   f"run `invoke {task}` again.")


def _drafter_findings(run: RunRecord, path: Path) -> list[Finding]:
    """test-drafter's verdict (MISMATCH is ✗: the server would feed the draft other features than it
    was trained on) and its named causes, bad ones first, as its report orders them."""
    from draftops.documents import load
    from draftops.documents.drafter_report import DrafterReport
    from draftops.errors import DocumentError

    try:
        report = load(DrafterReport, path)
    except DocumentError as exc:
        return [_unreadable(run.run_id, "report", path, exc, "test-drafter")]
    verdict = report.verdict
    found = []
    if verdict.status == "MISMATCH":
        found.append(Finding(run.run_id, "bad", "MISMATCH", verdict.message or verdict.diagnosis or
                             "the draft is fed other hidden states than it was trained on"))
    elif verdict.status not in (None, "MATCH"):
        found.append(Finding(run.run_id, "warn", str(verdict.status), verdict.message or verdict.diagnosis))
    found += [Finding(run.run_id, f.severity if f.severity in MARK else "warn", f.id, f.text)
              for f in report.findings]
    return found


def _bench_findings(run: RunRecord, path: Path) -> list[Finding]:
    """bench's warnings (a cross-check that disagrees, a repeat left out): each a ! finding."""
    try:
        doc = jsonread.load(path)           # a regular file only, bounded
        warnings = doc.get("warnings", []) if isinstance(doc, dict) else None
        if not isinstance(warnings, list):
            raise ValueError("its `warnings` is not a list")
    except (OSError, ValueError) as exc:
        return [_unreadable(run.run_id, "bench-result", path, exc, "bench.collect " + run.run_id)]
    return [Finding(run.run_id, "warn", "bench-warning", str(w)) for w in warnings]


def capture_checks_in(log_text: str, project_root: Path) -> list[Path]:
    """The capture-check.json files a step's log names (the task prints `report: <path>`)."""
    paths = [Path(p) for p in _CAPTURE_JSON.findall(log_text)]
    return [p if p.is_absolute() else project_root / p for p in dict.fromkeys(paths)]


#: capture-check's status -> severity (FINAL_ONLY is SGLang's normal answer, not a fault)
_CAPTURE_SEVERITY = {"MATCHED": "good", "FINAL_ONLY": "info", "PARTIAL": "warn", "NOT_THIS_TARGET": "bad"}


def _capture_findings(path: Path) -> list[Finding]:
    """capture-check's status (dumps not of this target are ✗) and its draft feed (MISMATCH is ✗)."""
    from draftops.documents import load
    from draftops.documents.capture_check import CaptureCheck
    from draftops.errors import DocumentError

    run_id = path.parent.name
    try:
        doc = load(CaptureCheck, path)
    except DocumentError as exc:
        return [_unreadable(run_id, "capture-check", path, exc, "capture-check")]
    found = [Finding(run_id, _CAPTURE_SEVERITY.get(doc.status, "warn"), doc.status, doc.headline)]
    if doc.draft is not None and doc.draft.status == "MISMATCH":
        found.append(Finding(run_id, "bad", "draft-MISMATCH", doc.headline))
    return found


def _compare_findings(run: RunRecord, path: Path) -> list[Finding]:
    """bench.compare's findings, as its compare.json (read into its model) lists them."""
    from draftops.documents import load
    from draftops.documents.bench_compare import BenchCompare
    from draftops.errors import DocumentError

    try:
        doc = load(BenchCompare, path)
    except DocumentError as exc:
        return [Finding(run.run_id, "bad", "compare-unreadable",
                        f"the comparison {run.run_id} (history verdict {run.verdict}) left no readable {path} "
                        f"({exc}), so its findings are unknown; run `invoke bench.compare` again.")]
    return [Finding(run.run_id, f.severity, f.code, f.text) for f in doc.findings]


def describe(runs: Iterable[RunRecord], env_json: Path | None) -> dict[str, str]:
    """Header facts for the report: GPU, driver, engine version, draft (what the runs say)."""
    facts: dict[str, str] = {}
    for run in runs:
        if run.engine:
            facts["engine"] = f"{run.engine} {run.engine_version or ''}".strip()
        if run.draft:
            facts["draft"] = run.draft + (f" ({run.draft_digest[:19]})" if run.draft_digest else "")
    env = _env_check(env_json) if env_json is not None else None
    if env is not None:
        facts.update(_env_facts(env))
    return facts


def _env_check(path: Path) -> EnvCheck | None:
    """The env.json an env.check step wrote; None when it is missing or fails its model (the header
    then says only what the runs say)."""
    from draftops.documents import load
    from draftops.documents.env_check import EnvCheck
    from draftops.errors import DocumentError

    try:
        return load(EnvCheck, path)
    except DocumentError:
        return None


def _env_facts(env: EnvCheck) -> dict[str, str]:
    """GPU and driver (nvidia-smi's rows), torch's version: the header facts env.json gives."""
    facts: dict[str, str] = {}
    if env.nvidia_smi:
        facts["gpu"] = ", ".join(sorted({str(g.name) for g in env.nvidia_smi}))
        facts["driver"] = ", ".join(sorted({str(g.driver_version) for g in env.nvidia_smi}))
    else:
        facts["gpu"] = "none (nvidia-smi not found)"
    if env.torch.version:
        facts["torch"] = env.torch.version
    return facts


def env_json_in(log_text: str, project_root: Path) -> Path | None:
    """The env.json an env.check step wrote (its task prints `JSON: <path>`)."""
    found = _ENV_JSON.findall(log_text)
    if not found:
        return None
    path = Path(found[-1])
    return path if path.is_absolute() else project_root / path
