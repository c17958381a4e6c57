"""The readiness probe's host side (`python -m remote.serve http ... --until-ok S`): it keeps asking
next to the server, so a start-up wait costs one SSH exec per window instead of one per try. A real
HTTP server on 127.0.0.1 that answers 503 until it is "ready"."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from remote.serve import net
from tests.conftest import REPO
from tests.support.sshd import free_port


class Starting(ThreadingHTTPServer):
    """Answers /health with 503 until ``ready_at`` (monotonic), then 200; counts the requests."""

    ready_at = 0.0
    hits = 0


class Handler(BaseHTTPRequestHandler):
    server: Starting

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.hits += 1
        code = 200 if time.monotonic() >= self.server.ready_at else 503
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok" if code == 200 else b"loading")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def starting() -> Iterator[Starting]:
    server = Starting(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_asks_again_until_the_server_is_ready(starting: Starting):
    starting.ready_at = time.monotonic() + 1.0
    answer = net.request_until_ok(starting.server_address[1], "/health", within=5.0)
    assert answer["status"] == 200 and answer["body"] == "ok"
    assert answer["tries"] == starting.hits >= 3
    assert time.monotonic() >= starting.ready_at


def test_gives_the_last_answer_when_the_window_ends(starting: Starting):
    starting.ready_at = time.monotonic() + 60
    began = time.monotonic()
    answer = net.request_until_ok(starting.server_address[1], "/health", within=1.0)
    assert answer["status"] == 503 and answer["body"] == "loading" and answer["tries"] >= 3
    assert 0.8 <= time.monotonic() - began < 3.0


def test_without_a_window_it_asks_once(starting: Starting):
    starting.ready_at = time.monotonic() + 60
    assert net.request_until_ok(starting.server_address[1], "/health")["tries"] == 1 == starting.hits


def test_nothing_listening_is_no_status_after_the_window():
    began = time.monotonic()
    answer = net.request_until_ok(free_port(), "/health", within=0.6)
    assert answer["status"] is None and answer["error"] and answer["tries"] >= 2
    assert time.monotonic() - began >= 0.4


def test_the_host_tool_takes_the_window_from_its_command_line(starting: Starting):
    starting.ready_at = time.monotonic() + 1.0
    done = subprocess.run([sys.executable, "-m", "remote.serve", "http", str(starting.server_address[1]), "/health",
                           "--until-ok", "10"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["status"] == 200 and answer["tries"] >= 2


@pytest.mark.parametrize("window", ["nan", "-1", "1e9"])
def test_a_window_that_is_not_a_sane_number_of_seconds_is_refused(window: str):
    done = subprocess.run([sys.executable, "-m", "remote.serve", "http", str(free_port()), "/health", "--until-ok",
                           window], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--until-ok must be 0..3600 seconds" in done.stderr
