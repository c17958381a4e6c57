"""Every run of the local history is an MLflow run when MLFLOW_TRACKING_URI is set, against a real
``mlflow server`` (tests/support/mlflow_server.py) read back through MLflow's own client: the mapping of a
row (tags, params, per-position metrics, its files), a server killed between two runs of one process,
a server that accepts and never answers, ``runs.export`` twice, the extra missing, and no import of
mlflow at all with the variable unset. The README's main job and the doctor: tests/test_mlflow_tasks.py.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from draftops import history, mlflowrun, records, tracking
from draftops.errors import TrackingError
from draftops.history import RunRecord
from tests.conftest import REPO
from tests.support.bench_runs import drafter_report, read_report
from tests.support.listeners import listen
from tests.support.mlflow_server import MlflowServer


def plain(lines: list[str]) -> list[str]:
    """The lines with each printed program (``.venv/bin/invoke``, ``python -m invoke``: cmdline.program,
    whatever started the process) written as plain ``invoke``, to compare the rest word for word."""
    lines = [re.sub(r"`[^`]*?\binvoke (?=runs\.export)", "`invoke ", line) for line in lines]
    return [re.sub(r"`\S+ -m pip install", "`pip install", line) for line in lines]

RUN = "20261206-051500-test-drafter-ab12"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    running = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield running
    running.kill()


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new process's view: nothing said yet, MLflow's client settings restored after the test."""
    monkeypatch.setattr(tracking, "_process", tracking._Process())
    for name in (tracking.ENV_TIMEOUT, tracking.ENV_EXPERIMENT):
        monkeypatch.delenv(name, raising=False)
    # what tracking._client would set by default, set here so that the test's end takes them away again
    for name, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0"), ("MLFLOW_HTTP_REQUEST_TIMEOUT", "10"),
                        ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")):
        monkeypatch.setenv(name, value)


def drafter_record(run_id: str = RUN, time: str = "2026-12-06T05:15:00Z") -> RunRecord:
    report = drafter_report(status="MISMATCH", served=1.5, best=3.6, configured=[1, 4, 7], fix=[-1, 0, 2],
                            fix_vllm=[0, 1, 3], ckpt="/data/drafts/it's \"demo\"",
                            cond=([0.4, 0.1, 0.05], [0.9, 0.8, 0.7]))
    return records.test_drafter_record(run_id, "local", {"state": "succeeded", "exit_code": 0, "ended": time},
                                       read_report(report), {"steps": 3, "limit": 8}, git_rev="abc123def456-dirty",
                                       config_digest="sha256:aaaa")


def keep(root: Path, rec: RunRecord, said: list[str]) -> tracking.Logged | None:
    return records.keep(root, f"run {rec.run_id}", lambda rev: rec, said.append)


def test_a_row_becomes_tags_params_and_a_metric_per_position() -> None:
    """No server: the mapping both the live logging and runs.export send."""
    rec = drafter_record()
    rec = RunRecord(**{**rec.__dict__, "metrics": {**rec.metrics, "nan": float("nan"), "deep": {"a": {"b": 2}},
                                                   "odd key\x1b[31m!": 1}})
    run = mlflowrun.payload(rec)
    assert run.name == RUN and run.status == "FINISHED"
    assert run.tags["kind"] == "test-drafter" and run.tags["verdict"] == "MISMATCH"
    assert run.tags["draft"] == "/data/drafts/it's \"demo\"" and run.tags["mlflow.source.git.commit"] == "abc123def456"
    assert run.tags[mlflowrun.RUN_ID_TAG] == RUN and run.tags["result.fix_layer_ids"] == "-1, 0, 2"
    assert run.params["steps"] == "3" and run.params["limit"] == "8"
    metrics = {(k, step): v for k, v, step in run.metrics}
    assert metrics[("predicted_served", 0)] == 1.5 and metrics[("predicted_best", 0)] == 3.6
    assert [metrics[("predicted_cond_served", s)] for s in (1, 2, 3)] == [0.4, 0.1, 0.05]
    assert metrics[("deep.a.b", 0)] == 2 and metrics[("odd key__31m_", 0)] == 1
    assert not any(k == "nan" for k, _, _ in run.metrics)
    failed = mlflowrun.payload(RunRecord(run_id="x", kind="bench", host="h", verdict="failed"))
    assert failed.status == "FAILED"


def test_a_run_folder_gives_its_documents_and_charts_only(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / RUN
    folder.mkdir(parents=True)
    for name in ("report.json", "report.md", "report.html", "chart.png", "log", ".hidden.json"):
        (folder / name).write_text("x")
    os.mkfifo(folder / "fifo.json")
    (folder / "link.json").symlink_to("/etc/passwd")
    (folder / "huge.json").write_bytes(b"")
    os.truncate(folder / "huge.json", mlflowrun.ARTIFACT_MAX_BYTES + 1)
    assert [p.name for p in mlflowrun.artifacts(folder)] == ["chart.png", "report.html", "report.json", "report.md"]
    assert mlflowrun.run_folder(tmp_path, "../../etc") is None and mlflowrun.run_folder(tmp_path, RUN) == folder


@pytest.mark.slow
def test_a_recorded_run_reads_back_through_mlflows_client(server, fresh, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(tracking.ENV_URI, server.uri)
    monkeypatch.setenv(tracking.ENV_TIMEOUT, "60")      # this test's client import may be its first
    folder = tmp_path / "runs" / RUN
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps({"schema": "draftops.drafter-report/1"}))
    (folder / "report.md").write_text("# report\n")
    said: list[str] = []
    logged = keep(tmp_path, drafter_record(), said)
    assert said == [] and logged is not None
    assert history.for_project(tmp_path).get(RUN) is not None
    run = server.run_named(RUN)
    assert run.info.run_id == logged.mlflow_id and run.info.status == "FINISHED"
    assert logged.url == f"{server.uri}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    assert run.data.tags["verdict"] == "MISMATCH" and run.data.tags["host"] == "local"
    assert run.data.params["limit"] == "8"
    client = server.client()
    history_of = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "predicted_cond_best")]
    assert sorted(history_of) == [(1, 0.9), (2, 0.8), (3, 0.7)]
    assert {f.path for f in client.list_artifacts(run.info.run_id)} == {"report.json", "report.md"}
    again = keep(tmp_path, drafter_record(), said)         # recorded again (completed in place): one run still
    assert again is not None and [r.info.run_id for r in server.runs() if r.info.run_name == RUN] == [again.mlflow_id]


@pytest.mark.slow
def test_a_server_killed_mid_doctor_costs_one_line_and_export_sends_the_rest_once(fresh, tmp_path, monkeypatch):
    """Three runs of one process (a doctor's steps): the server dies after the first. The other two are
    recorded locally with one line between them that names runs.export; once the server is back,
    export sends exactly those two, and a second export sends nothing."""
    own = MlflowServer(tmp_path / "store").start()
    try:
        monkeypatch.setenv(tracking.ENV_URI, own.uri)
        monkeypatch.setenv(tracking.ENV_TIMEOUT, "60")
        said: list[str] = []
        first, second, third = (drafter_record(f"2026120{i}-0000-run", f"2026-12-0{i}T00:00:00Z") for i in (1, 2, 3))
        assert keep(tmp_path, first, said) is not None
        own.kill()
        started = time.monotonic()
        assert keep(tmp_path, second, said) is None and keep(tmp_path, third, said) is None
        assert time.monotonic() - started < 10
        assert len(said) == 1, said
        assert f"run {second.run_id} was not logged to MLflow at {own.uri}: connection refused" in said[0]
        assert "invoke runs.export --since 2026-12-02T00:00:00Z" in said[0]
        assert [r.run_id for r in history.for_project(tmp_path).query()] == [third.run_id, second.run_id, first.run_id]
        own.start()
        sent: list[str] = []
        done = tracking.export(tmp_path, history.parse_since("2026-12-02"), None, sent.append)
        assert done.sent == [second.run_id, third.run_id] and done.already == []
        again = tracking.export(tmp_path, None, None, sent.append)
        assert again.sent == [] and sorted(again.already) == sorted([first.run_id, second.run_id, third.run_id])
        assert sorted(r.info.run_name for r in own.runs()) == [first.run_id, second.run_id, third.run_id]
    finally:
        own.kill()


@pytest.mark.slow
def test_export_nests_a_doctors_steps_and_is_idempotent(server, fresh, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(tracking.ENV_URI, server.uri)
    monkeypatch.setenv(tracking.ENV_EXPERIMENT, "export-twice")
    monkeypatch.setenv(tracking.ENV_TIMEOUT, "60")
    hist = history.for_project(tmp_path)
    steps = [drafter_record(f"2026-step-{i}", f"2026-12-06T01:0{i}:00Z") for i in (1, 2)]
    for rec in steps:
        hist.record(rec)
    hist.record(RunRecord(run_id="2026-doctor", kind="doctor", host="local", time="2026-12-06T01:00:00Z",
                          metrics={"runs": [r.run_id for r in steps]}, verdict="fixed"))
    first = tracking.export(tmp_path, None, None, lambda line: None)
    assert first.sent == ["2026-step-1", "2026-step-2", "2026-doctor"]       # the parent after its steps
    assert tracking.export(tmp_path, None, None, lambda line: None).sent == []
    found = {r.info.run_name: r for r in server.runs("export-twice")}
    assert len(server.runs("export-twice")) == 3
    parent = found["2026-doctor"].info.run_id
    assert {found[r.run_id].data.tags.get("mlflow.parentRunId") for r in steps} == {parent}


class SilentServer:
    """A server that accepts connections and never answers (a hung proxy, a stopped process)."""

    def __init__(self) -> None:
        self.held: list[socket.socket] = []
        self.sock = listen(self.held.append)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_server_that_never_answers_delays_the_run_by_the_bound_only(fresh, tmp_path, monkeypatch) -> None:
    import mlflow.tracking  # noqa: F401 - imported before the clock starts: the bound is the server's here

    silent = SilentServer()
    try:
        monkeypatch.setenv(tracking.ENV_URI, silent.uri)
        monkeypatch.setenv(tracking.ENV_TIMEOUT, "2")
        said: list[str] = []
        started = time.monotonic()
        assert keep(tmp_path, drafter_record(), said) is None
        assert keep(tmp_path, drafter_record("second"), said) is None      # not tried again: down
        assert time.monotonic() - started < 4
        assert plain(said) == [f"run {RUN} was not logged to MLflow at {silent.uri}: the server did not answer "
                               "within 2 s. "
                        "It is in the local history; send it later with "
                        "`invoke runs.export --since 2026-12-06T05:15:00Z`."]
        assert history.for_project(tmp_path).get(RUN) is not None
        with pytest.raises(TrackingError, match="did not answer"):
            tracking.export(tmp_path, None, None, lambda line: None)
    finally:
        silent.close()


PROBE = r"""
import sys
from pathlib import Path
block = sys.argv[2] == "block"

class NoMlflow:
    def find_spec(self, name, path=None, target=None):
        if block and name.split(".")[0] == "mlflow":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoMlflow())
import importlib.util
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if block and name == "mlflow" else real(name, *a)
from draftops import records
from draftops.history import RunRecord

for i in range(3):
    rec = RunRecord(run_id=f"run-{i}", kind="bench", host="local", time="2026-12-06T05:00:00Z", metrics={"x": 1})
    records.keep(Path(sys.argv[1]), f"run {i}", lambda rev: rec, lambda line: print("LINE", line))
print("LOADED", "mlflow" in sys.modules)
"""


def probe(root: Path, mode: str, **env: str) -> list[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    done = subprocess.run([sys.executable, "-c", PROBE, str(root), mode], cwd=REPO, env={**full, **env},
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.splitlines()


def test_without_the_extra_a_set_uri_gets_one_line_naming_it(tmp_path) -> None:
    out = probe(tmp_path, "block", MLFLOW_TRACKING_URI="http://127.0.0.1:9")
    assert plain(out) == ["LINE MLFLOW_TRACKING_URI is set, but this install has no MLflow client, so run run-0 is in "
                          "the "
                   "local history only: install the extra (`pip install -e '.[mlflow]'` in the project) and send it "
                   "with `invoke runs.export --since 2026-12-06T05:00:00Z`.", "LOADED False"]
    assert len(history.for_project(tmp_path).query()) == 3


def test_with_the_variable_unset_mlflow_is_never_imported(tmp_path) -> None:
    assert probe(tmp_path, "installed") == ["LOADED False"]
    assert len(history.for_project(tmp_path).query()) == 3


def test_the_nightly_report_names_each_hosts_mlflow_run(tmp_path) -> None:
    from draftops.nightly import report
    from tests.support.nights import build_night

    night = build_night(tmp_path)
    assert "MLflow" not in report.write(night)["markdown"].read_text()      # not logged: no line
    url = "http://127.0.0.1:5000/#/experiments/1/runs/0123abcd"
    night.hosts[0].logged = tracking.Logged("nightly-2026-12-01-box", "0123abcd", "1", url)
    written = report.write(night)
    assert f"- **MLflow**: {url}" in written["markdown"].read_text().splitlines()
    assert f"<tr><th>MLflow</th><td>{url}</td></tr>" in written["html"].read_text()


def test_a_capture_check_is_a_history_row_and_so_an_mlflow_run(tmp_path) -> None:
    """capture-check ran outside the history; now its row carries the engine, the matched slots and each
    slot's relative error, which become the MLflow run's tags and per-slot metric."""
    from draftops.documents import parse
    from draftops.documents.capture_check import CaptureCheck

    slots = [{"slot": i, "boundary": b, "relative_error": e, "matched": m, "vllm_id": v}
             for i, (b, e, m, v) in enumerate([(3, 0.01, True, 2), (9, 0.4, False, None)])]
    doc = parse(CaptureCheck, {"schema": CaptureCheck.SCHEMA, "status": "PARTIAL", "headline": "h", "lines": [],
                               "engine": {"name": "vllm", "version": "0.32.0", "python": "/p"},
                               "target": {"path": "/m/target", "num_hidden_layers": 4, "hidden_size": 8,
                                          "config_sha256": "a", "weights_listing_sha256": "b"},
                               "data": {"path": "/m/data", "samples": 3, "tokens": 30, "slots": 2},
                               "match_rule": "r", "slots": slots, "seconds": {"engine_start": 61.5}},
                "capture-check.json")
    rec = records.capture_check_record("cc-1", "local", {"state": "succeeded", "exit_code": 0,
                                                         "ended": "2026-12-06T05:00:00Z"},
                                       doc, {"draft": "/m/draft", "samples": 3, "port": None}, git_rev=None)
    history.for_project(tmp_path).record(rec)
    assert history.for_project(tmp_path).get("cc-1").verdict == "PARTIAL"
    run = mlflowrun.payload(rec)
    assert run.tags["kind"] == "capture-check" and run.tags["engine_version"] == "0.32.0"
    assert run.tags["result.slot_layer_ids"] == "2, None" and run.params == {"draft": "/m/draft", "samples": "3"}
    metrics = {(k, step): v for k, v, step in run.metrics}
    assert metrics[("relative_error", 1)] == 0.01 and metrics[("relative_error", 2)] == 0.4
    assert metrics[("matched", 0)] == 1 and metrics[("seconds.engine_start", 0)] == 61.5
    failed = records.capture_check_record("cc-2", "local", {"state": "failed", "exit_code": 3}, None,
                                          {"target": "/m/t"}, git_rev=None)
    assert failed.verdict == "failed" and mlflowrun.payload(failed).status == "FAILED"


def test_a_server_that_refuses_is_one_line_naming_its_answer(fresh, tmp_path, monkeypatch) -> None:
    """A proxy in front of the server answering 403 (no token, wrong path): the run is recorded, its
    line quotes the answer, and the process does not ask again."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refuse(BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            self.send_response(403)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"forbidden by the proxy")

        do_GET = do_POST = _refuse

        def log_message(self, *args: object) -> None:
            pass

    refusing = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=refusing.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv(tracking.ENV_URI, f"http://127.0.0.1:{refusing.server_address[1]}")
        monkeypatch.setenv(tracking.ENV_TIMEOUT, "60")
        said: list[str] = []
        assert keep(tmp_path, drafter_record(), said) is None and keep(tmp_path, drafter_record("b"), said) is None
        assert len(said) == 1 and "403" in said[0] and "forbidden by the proxy" in said[0], said
        assert plain(said)[0].endswith("send it later with `invoke runs.export --since 2026-12-06T05:15:00Z`.")
        assert {r.run_id for r in history.for_project(tmp_path).query()} == {RUN, "b"}
    finally:
        refusing.shutdown()


def test_a_password_in_the_uri_is_never_printed_or_linked(fresh, tmp_path, monkeypatch) -> None:
    assert tracking.shown("https://me:s3cret@mlflow.example:8443/x") == "https://mlflow.example:8443/x"
    assert tracking.shown("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))                 # bound, not listening: refused
    port = closed.getsockname()[1]
    monkeypatch.setenv(tracking.ENV_URI, f"http://me:s3cret@127.0.0.1:{port}")
    monkeypatch.setenv(tracking.ENV_TIMEOUT, "60")
    said: list[str] = []
    try:
        assert keep(tmp_path, drafter_record(), said) is None
    finally:
        closed.close()
    assert len(said) == 1 and "s3cret" not in said[0], said
    assert said[0].startswith(f"run {RUN} was not logged to MLflow at http://127.0.0.1:{port}: ")


def test_export_without_a_server_is_one_paragraph_and_exit_1(tmp_path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    history.for_project(root).record(drafter_record())
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update({"PYTHONPATH": str(REPO), "COLUMNS": "300"})

    def export(**more: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "invoke", "runs.export"], cwd=root, env={**env, **more},
                              capture_output=True, text=True, timeout=120)
    unset = export()
    assert unset.returncode == 1 and "MLFLOW_TRACKING_URI is not set" in unset.stderr, unset.stderr
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    try:
        port = closed.getsockname()[1]
        down = export(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}",
                      DRAFTOPS_MLFLOW_TIMEOUT="60")
    finally:
        closed.close()
    assert down.returncode == 1 and "Traceback" not in down.stderr, down.stdout + down.stderr
    assert " ".join(down.stderr.split()) == (f"error: the MLflow tracking server at http://127.0.0.1:{port} "
                                              "(MLFLOW_TRACKING_URI) did not list its runs: connection refused. Start "
                                              "it, or point MLFLOW_TRACKING_URI at one that runs, and export again; "
                                              "nothing was sent.")
