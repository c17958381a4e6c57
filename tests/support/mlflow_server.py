"""A real MLflow tracking server for the tests: ``mlflow server`` (requirements-test.txt) with a SQLite
backend and an artifact folder under a temp folder, on 127.0.0.1 and a free port, in its own process
group so a test can kill it (SIGKILL, as a crash would) and start it again on the same store.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MlflowServer:
    """``mlflow server`` on ``store`` (db.sqlite, artifacts/); ``uri`` is its address."""

    def __init__(self, store: Path, port: int | None = None) -> None:
        self.store = store
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MlflowServer:
        self.store.mkdir(parents=True, exist_ok=True)
        mlflow = Path(sys.executable).parent / "mlflow"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"     # no job-runner process: the tests log runs only
        log = open(self.store / "server.log", "ab")      # noqa: SIM115 - the server's process keeps it
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{self.store / 'db.sqlite'}",
             "--artifacts-destination", str(self.store / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=self.store)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.store / 'server.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.kill()
        raise RuntimeError(f"mlflow server not up in {START_TIMEOUT_S:.0f} s: "
                           f"{(self.store / 'server.log').read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the server's whole process group, as a crash or a pulled plug would end it."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None

    def client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def runs(self, experiment: str = "draftops") -> list[Any]:
        """Every active run of ``experiment``, read back through MLflow's own client."""
        client = self.client()
        found = client.get_experiment_by_name(experiment)
        return [] if found is None else list(client.search_runs([found.experiment_id], max_results=1000))

    def run_named(self, name: str, experiment: str = "draftops") -> Any:
        (run,) = [r for r in self.runs(experiment) if r.info.run_name == name]
        return run
