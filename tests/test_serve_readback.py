"""The read-back after `invoke serve` is the check against silent overrides: a server whose
/get_server_info answers garbage or never answers ends "ready" with a warning that says so, bounded."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from remote.serve import net
from tests.support.serving import draft_config, ok, profile, project, write_model  # noqa: F401
from tests.support.tasks import invoke


class Trickle(BaseHTTPRequestHandler):
    """Sends its headers, then one byte of the body every 0.3 s for a minute."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "200")
        self.end_headers()
        for _ in range(200):
            try:
                self.wfile.write(b"x")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.3)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def trickling() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_an_answer_that_never_ends_is_cut_at_the_timeout(trickling: int) -> None:
    """Each byte comes within the socket timeout, so only a deadline on the whole body ends the call."""
    answer = net.request(trickling, "/get_server_info", timeout=1.0)
    assert answer["status"] is None and "not complete within the timeout" in answer["error"]


@pytest.mark.ssh
@pytest.mark.parametrize("fault", ["garbage", "wrong-types"])
def test_a_server_info_that_cannot_be_read_back_is_warned_about(project, tmp_path, fault):  # noqa: F811
    serve = profile(tmp_path, double={"DRAFTOPS_SGLANG_DOUBLE_SERVER_INFO": fault})
    root = project("loc", default=serve)
    draft = write_model(tmp_path / "draft", draft_config([1, 15, 28]))
    out = " ".join(ok(invoke(root, "serve", "--draft", draft, "--steps", "3", "--topk", "1",
                             "--draft-tokens", "4")).split())
    assert "ready: SGLang" in out
    assert "could not read back what the SGLang server runs with" in out
    if fault == "garbage":
        assert "GET /get_server_info answered with something that is not JSON" in out
        assert "draft model, num steps, eagle topk, num draft tokens" in out
    else:       # wrong types are shown as they came and differ from what was asked
        assert "num draft tokens" in out and "the server runs with other values than asked for" in out
    assert "\x1b" not in out
    ok(invoke(root, "serve.stop", "--all"))
