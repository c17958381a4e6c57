"""The watch over a torchrun's later nodes (draftops/drafter/nodewatch.py, issue 35 K): real jobs on a
`local` host, polled through its agent. The first node that ends without succeeding is reported (once,
with its status row); one that succeeds, or still runs, is not."""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, copy_remote_package
from tests.support.tasks import invoke


@pytest.fixture
def host(make_project: Any, tmp_path: Path, no_inventory_env: None) -> Iterator[Any]:
    from draftops.link.host import close_all, open_host

    root = make_project({"n": {"transport": "local", "root": str(tmp_path / "n"), "python": sys.executable}},
                        default="n")
    copy_remote_package(root)
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    assert invoke(root, "sync", "--host", "n").returncode == 0
    try:
        yield open_host("n", root)
    finally:
        close_all()


def test_the_first_failed_node_is_reported_and_the_others_are_not(host: Any) -> None:
    from draftops.drafter import nodewatch
    from draftops.runs import jobs

    running = jobs.start(host, "node", "sleep 60")
    succeeded = jobs.start(host, "node", "true")
    failing = jobs.start(host, "node", "sleep 1; echo 'no torch here' >&2; exit 4")
    nodes = [nodewatch.Node(1, host, running.id), nodewatch.Node(2, host, succeeded.id),
             nodewatch.Node(3, host, failing.id)]
    fell = threading.Event()
    seen: list[nodewatch.Fallen] = []

    def on_fall(fallen: nodewatch.Fallen) -> None:
        seen.append(fallen)
        fell.set()

    started = time.monotonic()
    try:
        with nodewatch.NodeWatch(nodes, on_fall, poll_s=0.2) as watch:
            assert fell.wait(30), "the failed node was not reported"
        assert time.monotonic() - started < 30
        assert [f.node.rank for f in seen] == [3] and watch.fallen is seen[0]
        assert seen[0].final.get("state") == "failed" and seen[0].final.get("exit_code") == 4, seen[0].final
        assert jobs.status(host, running.id).get("state") == "running"     # stopping it is the caller's
    finally:
        jobs.kill(host, running.id, grace_s=1.0)


def test_nodes_that_succeed_or_run_on_are_never_reported(host: Any) -> None:
    from draftops.drafter import nodewatch
    from draftops.runs import jobs

    done = jobs.start(host, "node", "true")
    running = jobs.start(host, "node", "sleep 60")
    seen: list[nodewatch.Fallen] = []
    try:
        with nodewatch.NodeWatch([nodewatch.Node(1, host, done.id), nodewatch.Node(2, host, running.id)],
                                 seen.append, poll_s=0.2) as watch:
            time.sleep(3)
        assert seen == [] and watch.fallen is None
    finally:
        jobs.kill(host, running.id, grace_s=1.0)
