"""A listening socket on 127.0.0.1 whose connections a test handles itself (a proxy, a silent server)."""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def listen(on_connection: Callable[[socket.socket], object]) -> socket.socket:
    """A listener on a free port of 127.0.0.1; each connection it accepts goes to ``on_connection`` on
    the listener's own thread, until the listener is closed."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            on_connection(conn)
    threading.Thread(target=accept, daemon=True).start()
    return listener
