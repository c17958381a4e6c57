"""Whether a connection went through a jump host (its sshd's log says so)."""
from __future__ import annotations


def _forwarded_to(server, port: int) -> int:
    """How many direct-tcpip channels ``server`` (a DEBUG1 sshd) opened to 127.0.0.1:``port``."""
    return sum(1 for line in server.log.read_text().splitlines()
               if "server_request_direct_tcpip" in line and line.endswith(f"target 127.0.0.1 port {port}"))
