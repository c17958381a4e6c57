"""The runner's side of :mod:`remote.bench.client_session`: one client process for the whole bench.

The runner starts it before the warm-up, hands it each step's client arguments and waits for its
reply, as it waited for a client process: every wait is bounded and watches the server, and a
session that dies, hangs or is killed (``invoke kill``: it is in the job's process group) ends the
step with a reason. ``DRAFTOPS_BENCH_CLIENT=process`` (or a plan's ``client_mode: process``) keeps the
old way, one client process per step.
"""
from __future__ import annotations

import json
import queue
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

SESSION_MODULE = "remote.bench.client_session"
MODE_VAR = "DRAFTOPS_BENCH_CLIENT"
#: importing the engine's client: 26-33 s on a 2-core host; a hung import must not hold the job
READY_TIMEOUT_S = 600.0
#: after the last step: the session ends when its stdin closes
CLOSE_TIMEOUT_S = 10.0


def client_args(argv: list[str]) -> list[str] | None:
    """The client's own arguments of a plan step (``vllm bench serve ...`` or ``python -m MODULE ...``),
    or None for a command the session does not run."""
    if len(argv) >= 3 and (argv[1:3] == ["bench", "serve"] or argv[1] == "-m"):
        return list(argv[3:])
    return None


class ClientSession:
    """A running :mod:`remote.bench.client_session` (``start`` says whether it got its library entry)."""

    def __init__(self, python: str, engine: str, module: str | None, log: Path, env: dict[str, str]):
        self.python, self.engine, self.module, self.log_path, self.env = python, engine, module, log, env
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.entry: str | None = None
        self.ready_s: float | None = None

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)                        # end of stream: the process is ending

    def _next(self, timeout: float, alive: Callable[[], bool], started: float) -> tuple[dict[str, Any] | None, str]:
        """The next reply, or (None, why): the session ended, the server died, or ``timeout`` passed."""
        while True:
            try:
                line = self.lines.get(timeout=2.0)
            except queue.Empty:
                if not alive():
                    try:                            # the client notices the dead server and answers on its own
                        line = self.lines.get(timeout=5.0)
                    except queue.Empty:
                        self.kill()
                        return None, "server died"
                elif time.monotonic() - started > timeout:
                    self.kill()
                    return None, "timed out"
                else:
                    continue
            if line is None:
                return None, f"client process ended (exit {self._ended()}); see {self.log_path.name}"
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None                          # not ours (a library that wrote to the channel): skip
            if isinstance(doc, dict):
                return doc, ""
            if time.monotonic() - started > timeout:  # a channel full of foreign lines still ends in time
                self.kill()
                return None, "timed out"

    def _ended(self) -> int | str | None:
        """The exit code of a session that closed its channel; one that lives on is killed (not usable)."""
        try:
            return self.proc.wait(timeout=CLOSE_TIMEOUT_S) if self.proc else None
        except subprocess.TimeoutExpired:
            self.kill()
            return "killed"

    def start(self, alive: Callable[[], bool]) -> str | None:
        """Start and wait for the entry; None when ready, else why not (then the runner uses the CLI)."""
        argv = [self.python, "-m", SESSION_MODULE, self.engine, *([self.module] if self.module else [])]
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(("$ " + shlex.join(argv) + "\n").encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                             text=True, env=self.env)
            except OSError as exc:
                return f"could not start {self.python}: {exc}"
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), name="client-session", daemon=True).start()
        doc, why = self._next(READY_TIMEOUT_S, alive, started)
        if doc is None:
            return why
        if not doc.get("ready"):
            self.close()
            return str(doc.get("why") or "no library entry")
        self.entry, self.ready_s = str(doc.get("entry")), time.monotonic() - started
        return None

    def run(self, command: str, args: list[str], log: Path, timeout: float, alive: Callable[[], bool]
            ) -> tuple[int | None, float, str, float | None]:
        """One step: (exit code, seconds, why it failed or "", the library call's own seconds)."""
        started = time.monotonic()
        with open(log, "ab") as fh:
            fh.write(f"$ {command}  (in the bench's client process: {self.entry})\n".encode())
        if self.proc is None or self.proc.stdin is None or self.proc.poll() is not None:
            return None, 0.0, "the client process is not running", None
        try:
            self.proc.stdin.write(json.dumps({"argv": args, "log": str(log)}) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            return None, 0.0, f"the client process stopped taking steps ({exc})", None
        doc, why = self._next(timeout, alive, started)
        seconds = time.monotonic() - started
        if doc is None:
            return (self.proc.poll() if self.proc else None), seconds, why, None
        code = doc.get("exit")
        error = doc.get("error")
        return (code if isinstance(code, int) else 1), seconds, (str(error) if error else ""), doc.get("seconds")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=CLOSE_TIMEOUT_S)

    def close(self) -> None:
        """End of the bench: close its stdin, give it a moment to exit, then kill it."""
        if self.proc is None:
            return
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
