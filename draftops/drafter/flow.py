"""`invoke test-drafter` and the doctor's check, one flow: the flags on the host → the capture-check
that measured these dumps → the evaluator (one process or torchrun) → its report, read once, and its
history row. The caller shows the result; nothing here draws."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from draftops.drafter import measured, record, run
from draftops.drafter.asked import Asked
from draftops.link.host import Host
from draftops.runs.tools import JobView, ToolResult
from draftops.serve.host_engine import host_engine

if TYPE_CHECKING:
    from draftops.documents.drafter_report import DrafterReport


@dataclass(frozen=True)
class Evaluated:
    """A finished evaluation: the job's result, its report (None when it left none), its arguments."""

    done: ToolResult
    report: DrafterReport | None
    given: dict[str, Any]


def test_drafter(hosts: Sequence[Host], asked: Asked, view: JobView, warn: Callable[[str], None], *,
                 find_capture: bool = True) -> Evaluated:
    """Evaluate the draft on the first of ``hosts`` (all of them under torchrun) and record the run.
    ``find_capture``: take the newest capture-check of these dumps (one host only; the doctor names its
    own capture step's run in ``asked.measured`` instead). A report that fails its model is recorded as
    a run without one, then refused; a failed run is the caller's to ``check``."""
    host = hosts[0]
    asked = asked.on_host(host)
    served = host_engine(host)     # the engine, its installed version, a launch algorithm the profile sets
    capture = measured.capture(host, asked.data, asked.verifier, served.engine, run_id=asked.measured,
                               find=find_capture and len(hosts) == 1)
    asked = dataclasses.replace(asked, measured=capture.run_id if capture else None)
    options = asked.options(served, host.runs_dir, kept_states=bool(capture and capture.kept_states))
    given = asked.given()
    done = run.evaluate(hosts, options, given, view, gpus=asked.gpus, nodes=asked.nodes, port=asked.port)
    report = record.keep(host, done, given, warn)
    return Evaluated(done, report, given)
