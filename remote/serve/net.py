"""Port and HTTP probes, run on the host because the servers listen on its loopback address."""
from __future__ import annotations

import errno
import json
import socket
import time
from typing import Any

MAX_BODY = 1 << 20


def port_status(port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """Is something listening on ``port`` (connect), or holding it (bind on all addresses)?"""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return {"port": port, "in_use": True, "detail": f"a process is listening on {host}:{port}"}
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            reason = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            return {"port": port, "in_use": True, "detail": f"cannot bind port {port}: {reason}"}
    return {"port": port, "in_use": False, "detail": "free"}


def wait_free(port: int, seconds: float, host: str = "127.0.0.1") -> dict[str, Any]:
    """Poll until ``port`` is free or ``seconds`` pass (a stopped server may linger briefly)."""
    deadline = time.monotonic() + seconds
    status = port_status(port, host)
    while status["in_use"] and time.monotonic() < deadline:
        time.sleep(0.2)
        status = port_status(port, host)
    return status


def request(port: int, path: str, *, host: str = "127.0.0.1", body: Any = None,
            timeout: float = 10.0) -> dict[str, Any]:
    """GET (or POST ``body`` as JSON) ``http://host:port/path``; HTTP errors are answers, not failures."""
    import urllib.error  # here, not at the top: urllib costs the port and registry commands ~20 ms
    import urllib.request
    url = f"http://{host}:{port}/{path.lstrip('/')}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json"} if data else {})
    started = time.monotonic()
    answer: dict[str, Any] = {"url": url, "status": None, "body": None, "error": None}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer.update(status=resp.status, body=_read(resp, started + timeout))
    except urllib.error.HTTPError as exc:
        answer.update(status=exc.code, body=_read(exc, started + timeout))
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        answer.update(status=None, body=None, error=str(reason) or type(exc).__name__)
    answer["seconds"] = round(time.monotonic() - started, 3)
    return answer


def _read(resp: Any, deadline: float) -> str:
    """The body, at most MAX_BODY bytes and read by ``deadline``: a server that trickles its answer
    (or never ends it) must not hold the caller past its timeout (TimeoutError then)."""
    chunks: list[bytes] = []
    size = 0
    while size < MAX_BODY:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the answer was not complete within the timeout ({size} bytes read)")
        chunk = resp.read1(min(65536, MAX_BODY - size)) if hasattr(resp, "read1") else resp.read(MAX_BODY - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def request_until_ok(port: int, path: str, *, host: str = "127.0.0.1", body: Any = None, timeout: float = 10.0,
                     within: float = 0.0, pause: float = 0.2) -> dict[str, Any]:
    """:func:`request` again every ``pause`` seconds until it answers 200 or ``within`` seconds have
    passed: a start-up wait polls here, next to the server, instead of paying an SSH exec per try."""
    deadline = time.monotonic() + within
    tries = 0
    while True:
        tries += 1
        answer = request(port, path, host=host, body=body, timeout=timeout)
        if answer["status"] == 200 or time.monotonic() + pause >= deadline:
            answer["tries"] = tries
            return answer
        time.sleep(pause)

