"""``runner.json`` and ``host.json``: what the bench job on the host (``remote/bench/runner.py``) wrote
into its run folder, read once by ``draftops.bench.runner.build`` to make the bench result.

Neither carries a ``schema`` (they are a run's own files, read back by the same draftops that planned
it), so their models have none to check; everything else follows ``draftops.documents``: unknown
keys kept, NaN and wrong types refused with the field's path.
"""
from __future__ import annotations

from draftops.documents import Document, Part
from draftops.documents.serve_inspect import ServeInspect


class StepRecord(Part):
    """``steps[]``: one warm-up or measured repeat as the runner saw it end."""

    name: str
    kind: str | None = None
    index: int | None = None
    exit_code: int | None = None           # None: the client could not start
    seconds: float | None = None
    server_alive_after: bool = False
    log_slice: str | None = None


class RunnerDoc(Document):
    """``runner.json``: the run's status, its first failure and the steps it got to."""

    TASK = "invoke bench"

    status: str | None = None              # running | failed | succeeded
    failure: str | None = None
    steps: list[StepRecord] = []
    started: str | None = None
    ended: str | None = None

    @property
    def done(self) -> set[str]:
        """The steps whose client exited 0 with the server still alive after them."""
        return {s.name for s in self.steps if s.exit_code == 0 and s.server_alive_after}


class HostDoc(Document):
    """``host.json``: GPU, driver, CUDA and CPU; the engine and the draft as ``remote.serve inspect``
    read them (``inspect``, None when it failed: ``inspect_error``); the draft's config digest."""

    TASK = "invoke bench"

    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    cpu: str | None = None
    inspect: ServeInspect | None = None
    inspect_error: str | None = None
    draft_digest: str | None = None
    draft_digest_error: str | None = None
    error: str | None = None                # gathering the facts failed (a bug there)
