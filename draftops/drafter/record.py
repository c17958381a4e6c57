"""A finished evaluation read once and kept: its report as its model, and its history row with the
digest of the draft config it evaluated (the one reader of that digest, for every flow)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from draftops import history, records
from draftops.link.host import Host
from draftops.runs.hostfiles import config_digest_of
from draftops.runs.tools import ToolResult

if TYPE_CHECKING:
    from draftops.documents.drafter_report import DrafterReport


def keep(host: Host, done: ToolResult, given: dict[str, Any], warn: Callable[[str], None]) -> DrafterReport | None:
    """The run's report as its model, read once here (None when it left none), and the run recorded
    with it. A report that fails the model is recorded as a run without one, then refused in one
    paragraph naming the file (or, when the run failed, by the run's own reason)."""
    from draftops.documents import drafter_report  # pydantic: imported when a run has ended
    from draftops.errors import DocumentError, ToolFailed

    report, refused = None, None
    try:
        report = done.document(drafter_report.DrafterReport)
    except (DocumentError, ToolFailed) as exc:
        refused = exc
    record(host, done, given, report, warn)
    if refused is not None:
        raise refused
    return report


def record(host: Host, done: ToolResult, given: dict[str, Any], report: DrafterReport | None,
           warn: Callable[[str], None]) -> None:
    """Record a finished test-drafter run and its report in the local history (never failing the run)."""
    def build(git_rev: str | None) -> history.RunRecord:
        digest = draft_digest(host, report)      # inside: a host that cannot be read is a warning, as a full disk
        return records.test_drafter_record(done.run_id, done.host, done.final, report, given, git_rev=git_rev,
                                           config_digest=digest)

    records.keep(host.project_root, f"run {done.run_id}", build, warn)


def draft_digest(host: Host, report: DrafterReport | None) -> str | None:
    """The digest of the draft config the report evaluated: the report's, else read on the host."""
    checkpoint = report.checkpoint if report else None
    if checkpoint and checkpoint.config_digest:
        return checkpoint.config_digest
    path = checkpoint.config_path if checkpoint else None
    return config_digest_of(host, path) if path else None
