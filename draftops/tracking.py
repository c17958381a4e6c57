"""Every run of the local history also an MLflow run, when ``MLFLOW_TRACKING_URI`` is set (MLflow's
own convention; ``MLFLOW_EXPERIMENT_NAME`` picks the experiment, default ``draftops``).

Why it is built this way:
* MLflow is an extra (``pip install -e '.[mlflow]'``): the base install has no client, and this is
  the one module that imports it, inside ``_client`` only. With the variable unset nothing here
  imports it (it takes seconds); set without the extra, one line names the extra.
* A tracking server never fails or delays a run: each run's logging runs on a worker thread that
  the caller waits for at most ``DRAFTOPS_MLFLOW_TIMEOUT`` seconds (default 10, the client's import
  included), with MLflow's own retries off and its request timeout at that bound. Down, slow or
  refusing: one line says the run was not logged and which ``runs.export`` sends it later, and the
  rest of that process does not try again (a doctor's eight steps say it once).
* Idempotent: a run is found again by its ``draftops.run_id`` tag. Logged live, a run recorded
  again (completed in place in the history) replaces its MLflow run; ``runs.export`` skips a run
  already there and finished, and replaces one left RUNNING by an interrupted logging.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import math
import os
import re
import shlex
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from draftops import cmdline, history, mlflowrun
from draftops.errors import TrackingError
from draftops.history import RunRecord

ENV_URI = "MLFLOW_TRACKING_URI"
ENV_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
ENV_TIMEOUT = "DRAFTOPS_MLFLOW_TIMEOUT"
DEFAULT_EXPERIMENT = "draftops"
DEFAULT_TIMEOUT_S = 10.0
INSTALL = "pip install -e '.[mlflow]'"
_PAGE = 1000
_USERINFO = re.compile(r"//[^/\s@]+@")
_MAX_PAGES = 100

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    uri: str
    experiment: str
    timeout_s: float


@dataclass(frozen=True)
class Logged:
    """Where a run landed: its MLflow run id and the page that shows it."""

    run_id: str
    mlflow_id: str
    experiment_id: str
    url: str
    sent: bool = True          # False: runs.export found it there already


class _Process:
    """What this process has said and found: one line per process, not one per run."""

    def __init__(self) -> None:
        self.down: str | None = None
        self.said_extra = False


_process = _Process()


def target() -> Target | None:
    """The tracking server asked for by the environment, None when ``MLFLOW_TRACKING_URI`` is unset."""
    uri = os.environ.get(ENV_URI, "").strip()
    if not uri:
        return None
    try:
        timeout = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT_S))
    except ValueError:
        timeout = DEFAULT_TIMEOUT_S
    timeout = timeout if math.isfinite(timeout) and 0 < timeout <= 600 else DEFAULT_TIMEOUT_S
    return Target(uri, os.environ.get(ENV_EXPERIMENT, "").strip() or DEFAULT_EXPERIMENT, timeout)


def shown(uri: str) -> str:
    """``uri`` as printed and linked: without a user name or password it may carry (a report is sent on)."""
    try:
        parts = urllib.parse.urlsplit(uri)
        if parts.username is None and parts.password is None:
            return uri
        host = parts.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "the tracking server in $" + ENV_URI


def client_installed() -> bool:
    """Whether the MLflow client can be imported (found, not imported: that takes seconds)."""
    try:
        return importlib.util.find_spec("mlflow") is not None
    except (ImportError, ValueError):
        return False


def install_hint() -> str:
    """The extra's install command for this very interpreter (pasted with the venv not activated, a bare
    ``pip`` would install into another python)."""
    return " ".join((shlex.quote(sys.executable), "-m", INSTALL))


def export_hint(rec: RunRecord) -> str:
    """The command that sends ``rec`` (and what followed it) later; pasteable as printed."""
    return cmdline.command("runs.export", "--since", f"{history.to_iso(history.parse_time(rec.time))[:19]}Z")


def log(root: Path, rec: RunRecord, warn: Callable[[str], None]) -> Logged | None:
    """Log ``rec`` (just recorded in the history) with its run folder's files; None when not logged.
    Never raises and never waits longer than the bound: a failure is one ``warn`` line per process."""
    where = target()
    if where is None or _process.down is not None:
        return None
    if not client_installed():
        if not _process.said_extra:
            _process.said_extra = True
            warn(f"{ENV_URI} is set, but this install has no MLflow client, so run {rec.run_id} is in the local "
                 f"history only: install the extra (`{install_hint()}` in the project) and send it with "
                 f"`{export_hint(rec)}`.")
        return None
    try:
        return bounded(lambda: _send(where, rec, mlflowrun.run_folder(root, rec.run_id), replace=True),
                       where.timeout_s)
    except TrackingError as exc:
        _process.down = str(exc)
        warn(f"run {rec.run_id} was not logged to MLflow at {shown(where.uri)}: {exc}. It is in the local "
             f"history; send it later with `{export_hint(rec)}`.")
        return None


def attach(logged: Logged | None, files: Iterable[Path], warn: Callable[[str], None]) -> None:
    """Add files written after the run was logged (a doctor's or a night's report) to its run."""
    where = target()
    if logged is None or where is None or _process.down is not None:
        return
    paths = [p for p in files if p in mlflowrun.artifacts(p.parent)]

    def send() -> None:
        client = _client(where)
        for path in paths:
            client.log_artifact(logged.mlflow_id, str(path))
    try:
        bounded(send, where.timeout_s)
    except TrackingError as exc:
        _process.down = str(exc)
        warn(f"the report of run {logged.run_id} was not added to its MLflow run: {exc}.")


@dataclass
class Exported:
    sent: list[str]
    already: list[str]


def export(root: Path, since: str | None, host: str | None, say: Callable[[str], None]) -> Exported:
    """``runs.export``: every history row since ``since`` (oldest first, a doctor or night after the
    runs nested under it) that the server does not hold yet; TrackingError at the first that fails."""
    where = target()
    if where is None:
        raise TrackingError(f"{ENV_URI} is not set: say which tracking server to send the history to, e.g. "
                            f"`{ENV_URI}=http://127.0.0.1:5000 invoke runs.export`.")
    if not client_installed():
        raise TrackingError(f"this install has no MLflow client: install the extra (`{install_hint()}` in the project) "
                            "and export again.")
    rows = history.for_project(root).query(since=since, host=host)
    rows.sort(key=lambda r: (bool(mlflowrun.children(r)), r.time, r.run_id))
    try:
        there = bounded(lambda: _existing(where), where.timeout_s * 3)
    except TrackingError as exc:
        raise TrackingError(f"the MLflow tracking server at {shown(where.uri)} ({ENV_URI}) did not list its runs: "
                            f"{exc}. Start it, or point {ENV_URI} at one that runs, and export again; nothing "
                            "was sent.") from None
    done = Exported([], [])
    for rec in rows:
        if there.get(rec.run_id) not in (None, "RUNNING"):
            done.already.append(rec.run_id)
            continue
        try:
            bounded(functools.partial(_send, where, rec, mlflowrun.run_folder(root, rec.run_id), replace=True),
                    where.timeout_s * 3)
        except TrackingError as exc:
            raise TrackingError(f"run {rec.run_id} could not be sent to MLflow at {shown(where.uri)}: {exc}. "
                                f"{len(done.sent)} run(s) were sent before it; run the same command again to "
                                "send the rest (runs already there are skipped).") from None
        done.sent.append(rec.run_id)
        say(f"sent {rec.run_id} ({rec.kind})")
    return done


def bounded(call: Callable[[], T], seconds: float) -> T:
    """``call()`` on a worker thread, waited for at most ``seconds``; TrackingError (one short clause)
    when it is slower or fails. A worker still waiting is left to end on its own request timeout."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:   # noqa: BLE001 - every failure of the client is one clause
            box["error"] = exc
    worker = threading.Thread(target=work, name="mlflow-log", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TrackingError(f"the server did not answer within {seconds:g} s")
    if "error" in box:
        raise TrackingError(_why(box["error"]))
    return box["value"]


def _why(exc: BaseException) -> str:
    """The failure in a clause: the client's messages run to a page of retry and pool details."""
    text = _USERINFO.sub("//", " ".join(str(exc).split()))        # no password of the URI in a line
    for marker, said in (("Connection refused", "connection refused"),
                         ("Read timed out", "the server did not answer in time"),
                         ("Name or service not known", "unknown host name"),
                         ("Max retries exceeded", "the server could not be reached")):
        if marker in text:
            return said
    return (text[:300] + "…" if len(text) > 300 else text) or type(exc).__name__


def _client(where: Target) -> Any:
    """MLflow's client for ``where``: the one import of mlflow in draftops. Its retries are off and its
    request timeout is the bound (a user's own settings of these win), its stdout notes silenced."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, math.ceil(where.timeout_s))))
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.ERROR)     # after the import, which sets its own level
    return MlflowClient(tracking_uri=where.uri)


def _experiment(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage != "active":
            raise TrackingError(f"experiment {name!r} is deleted on the server; restore it "
                                f"(`mlflow experiments restore`) or set {ENV_EXPERIMENT} to another name")
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except Exception:                   # noqa: BLE001 - another process created it meanwhile
        again = client.get_experiment_by_name(name)
        if again is None:
            raise
        return str(again.experiment_id)


def _find(client: Any, experiment_id: str, run_id: str) -> Any:
    from mlflow.entities import ViewType

    quoted = run_id.replace("\\", "\\\\").replace("'", "\\'")
    found = client.search_runs([experiment_id], f"tags.`{mlflowrun.RUN_ID_TAG}` = '{quoted}'",
                               run_view_type=ViewType.ACTIVE_ONLY, max_results=10)
    return found


def _existing(where: Target) -> dict[str, str]:
    """{draftops run id: MLflow status} of every draftops run in the experiment (paged, bounded)."""
    from mlflow.entities import ViewType

    client = _client(where)
    experiment_id = _experiment(client, where.experiment)
    status: dict[str, str] = {}
    token = None
    for _ in range(_MAX_PAGES):
        page = client.search_runs([experiment_id], f"tags.`{mlflowrun.RUN_ID_TAG}` != ''",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=_PAGE, page_token=token)
        for run in page:
            name = run.data.tags.get(mlflowrun.RUN_ID_TAG)
            if name and status.get(name) in (None, "RUNNING"):
                status[name] = run.info.status
        token = page.token
        if not token:
            break
    return status


def _send(where: Target, rec: RunRecord, folder: Path | None, *, replace: bool) -> Logged:
    """Create the run (replacing an earlier one of that id when ``replace``), log its tags, params,
    metrics and files, nest its children under it and end it FINISHED (FAILED for a failed run)."""
    from mlflow.entities import Metric, Param

    client = _client(where)
    experiment_id = _experiment(client, where.experiment)
    for earlier in _find(client, experiment_id, rec.run_id):
        if not replace and earlier.info.status != "RUNNING":
            return Logged(rec.run_id, earlier.info.run_id, experiment_id, _url(where, experiment_id,
                                                                             earlier.info.run_id), sent=False)
        client.delete_run(earlier.info.run_id)
    run = mlflowrun.payload(rec, folder)
    created = client.create_run(experiment_id, start_time=run.start_ms, tags=run.tags, run_name=run.name)
    mlflow_id = created.info.run_id
    metrics = [Metric(k, v, run.start_ms, step) for k, v, step in run.metrics]
    params = [Param(k, v) for k, v in run.params.items()]
    for at in range(0, max(len(metrics), len(params), 1), 100):
        client.log_batch(mlflow_id, metrics=metrics[at:at + 100], params=params[at:at + 100])
    for path in run.files:
        client.log_artifact(mlflow_id, str(path))
    for child in run.children:
        for found in _find(client, experiment_id, child):
            client.set_tag(found.info.run_id, "mlflow.parentRunId", mlflow_id)
    client.set_terminated(mlflow_id, run.status)
    return Logged(rec.run_id, mlflow_id, experiment_id, _url(where, experiment_id, mlflow_id))


def _url(where: Target, experiment_id: str, mlflow_id: str) -> str:
    """The run's page in the MLflow UI (an http(s) server); otherwise the store and the run id."""
    uri = shown(where.uri)
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{mlflow_id}"
    return f"{uri} run {mlflow_id}"

