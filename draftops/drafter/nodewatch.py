"""Watch the later nodes of a torchrun spread over hosts while node 0's log is followed.

Why: node 0 only learns that another node is gone when its own rendezvous or collective times out
(300 s by default), and every other node waits as long. The laptop sees every node's job, so it
polls their status (one bounded agent call per node every ``POLL_S``) and reports the first that
ended without succeeding; the caller then stops the rest (docs/drafter.md § torchrun)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from draftops.errors import DraftopsError
from draftops.link.host import Host
from draftops.runs import jobs

POLL_S = 2.0
#: a node in one of these states may still meet the others
RUNNING = (None, "starting", "running", "queued", "pending")


@dataclass(frozen=True)
class Node:
    rank: int
    host: Host
    run_id: str


@dataclass(frozen=True)
class Fallen:
    """The node that ended first without succeeding, and its final status row."""

    node: Node
    final: dict[str, Any]


class NodeWatch:
    """A daemon thread polling ``nodes`` until :meth:`close`; the first that failed is :attr:`fallen`
    and is handed to ``on_fall`` (from the thread: it ends node 0, so that its follow returns)."""

    def __init__(self, nodes: Sequence[Node], on_fall: Callable[[Fallen], None], poll_s: float = POLL_S) -> None:
        self.fallen: Fallen | None = None
        self._nodes = list(nodes)
        self._on_fall = on_fall
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nodewatch", daemon=True)

    def __enter__(self) -> NodeWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, wait_s: float = 30.0) -> None:
        """Stop polling; wait (bounded) for a poll or an ``on_fall`` under way, so none runs later."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def _run(self) -> None:
        waiting = list(self._nodes)
        while waiting and not self._stop.wait(self._poll_s):
            for node in list(waiting):
                state, row = _state(node)
                if state in RUNNING:
                    continue
                waiting.remove(node)
                if state != "succeeded" and not self._stop.is_set():
                    self.fallen = Fallen(node, row)
                    self._on_fall(self.fallen)
                    return


def _state(node: Node) -> tuple[str | None, dict[str, Any]]:
    """The node's job state; a poll the link failed counts as still running (the next one asks again,
    and node 0's own timeouts still bound the run)."""
    try:
        row = jobs.status(node.host, node.run_id)
    except (DraftopsError, OSError):
        return None, {}
    return row.get("state"), row
