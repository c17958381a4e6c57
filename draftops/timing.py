"""Stage timestamps for benchmarks/sync.py, on stderr and only with ``DRAFTOPS_TIMING=1``.

Each line is ``@@draftops-timing at NAME EPOCH`` (a moment) or ``@@draftops-timing took NAME SECONDS``
(a stage's length); the benchmark sums them per stage. Normal output never changes. Stdlib only: it is
imported by ``draftops/__init__.py`` and must cost nothing.
"""
from __future__ import annotations

import os
import sys
import time

ENV = "DRAFTOPS_TIMING"
PREFIX = "@@draftops-timing "
ENABLED = os.environ.get(ENV) == "1"


def at(name: str, when: float | None = None) -> None:
    """Record the moment ``name`` happened (now unless ``when`` is given)."""
    if ENABLED:
        sys.stderr.write(f"{PREFIX}at {name} {time.time() if when is None else when:.6f}\n")


def took(name: str, seconds: float) -> None:
    """Record that stage ``name`` took ``seconds`` (several records of one stage add up)."""
    if ENABLED:
        sys.stderr.write(f"{PREFIX}took {name} {max(0.0, seconds):.6f}\n")


def ran(command: str, seconds: float) -> None:
    """Record one command run on the host and its whole round trip, labelled by what it runs (the
    host agent's command, ``-m MODULE`` and its first argument, else the first word);
    benchmarks/loop_overhead.py --trace counts them per stage. Regular expressions, not shlex: the
    agent's first call carries its whole source (60 kB), which shlex takes 50 ms to split."""
    if ENABLED:
        import re
        agents = list(re.finditer(r"agent-[0-9a-f]{12}(?:\.[\w-]+)?\.pyc?'?", command))
        agent = agents[-1] if agents else None
        module = re.search(r"(?:^|\s)-m\s+(\S+)\s*(\S*)", command)
        if agent is not None:       # agent.py ROOT COMMAND ..., or -c BOOT ROOT agent.py COMMAND ...
            words = [w.strip("'\"") for w in command[agent.end():agent.end() + 1000].split()]
            label = "agent:" + next((w for w in words if "/" not in w), "")
        elif module is not None:
            label = f"{module.group(1)}:{module.group(2).strip(chr(39))}"
        else:
            label = next((w for w in command[:200].split() if "=" not in w and w not in ("exec", "cd", "&&", "env")),
                         "?")
        sys.stderr.write(f"{PREFIX}exec {label.replace(' ', '_')[:50] or '?'} {max(0.0, seconds):.6f}\n")


def host_stages(stderr: bytes, sent_at: float, answered_at: float) -> None:
    """Turn the agent's moments (see wire._stamp) into stage lengths for one exec on the host.

    The host's clock is compared with ours, which holds in the benchmark (sshd on 127.0.0.1)."""
    if not ENABLED:
        return
    moments: dict[str, float] = {}
    for line in stderr.decode("utf-8", "replace").splitlines():
        if line.startswith(PREFIX + "at "):
            _, name, value = line[len(PREFIX):].split()
            moments.setdefault(name, float(value))
    if "agent-start" not in moments:
        took("exec (no host stamps)", answered_at - sent_at)
        return
    ready = moments.get("agent-ready", moments["agent-start"])
    read = moments.get("payload-read", ready)
    done = moments.get("agent-done", answered_at)
    took("host shell start-up", moments["agent-start"] - sent_at)
    took("agent", ready - moments["agent-start"])
    took("transfer", read - ready)
    took("apply", done - read)
    took("reply", answered_at - done)


def read(stderr: str) -> tuple[dict[str, float], dict[str, list[float]], dict[str, list[float]]]:
    """A process's timing lines, for the benchmarks: its moments (the first of each name), its stage
    lengths and its host commands (every record of each name, in order)."""
    moments: dict[str, float] = {}
    stages: dict[str, list[float]] = {}
    execs: dict[str, list[float]] = {}
    for line in stderr.splitlines():
        if not line.startswith(PREFIX):
            continue
        kind, rest = line[len(PREFIX):].split(" ", 1)
        name, value = rest.rsplit(" ", 1)
        if kind == "at":
            moments.setdefault(name, float(value))
        else:
            (execs if kind == "exec" else stages).setdefault(name, []).append(float(value))
    return moments, stages, execs
