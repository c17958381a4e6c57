"""``python -m remote.serve COMMAND ...``: one JSON object on stdout; exit codes from remote/exitcodes.py
(0 ok, 2 bad usage, 4 a bug, with an ``error`` event)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .. import exitcodes

MAX_UNTIL_OK_S = 3600.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m remote.serve")
    sub = parser.add_subparsers(dest="command", required=True)
    ins = sub.add_parser("inspect", help="read the target's and draft's configs as the engine will")
    ins.add_argument("--engine", choices=("sglang", "vllm"), required=True)
    ins.add_argument("--target", type=Path, required=True)
    ins.add_argument("--draft", type=Path)
    ins.add_argument("--sglang-status", action="store_true", help="ask the capture patcher's status")
    port = sub.add_parser("port", help="is the port in use?")
    port.add_argument("port", type=int)
    port.add_argument("--host", default="127.0.0.1")
    port.add_argument("--wait-free", type=float, default=0.0, help="wait up to S seconds for it to free")
    http = sub.add_parser("http", help="one HTTP request to a local server")
    http.add_argument("port", type=int)
    http.add_argument("path")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--json", dest="body", help="POST this JSON body")
    http.add_argument("--timeout", type=float, default=10.0)
    http.add_argument("--until-ok", type=float, default=0.0, metavar="SECONDS",
                      help="ask again every 0.2 s until it answers 200, for up to this long")
    reap = sub.add_parser("reap", help="stop what is left of a run's process group")
    reap.add_argument("pgid", type=int)
    reap.add_argument("run_id")
    reap.add_argument("--grace", type=float, default=10.0)
    servers = sub.add_parser("servers", help="the server registry under STATE/servers")
    servers.add_argument("--state", type=Path, required=True)
    servers.add_argument("action", choices=("list", "put", "remove"))
    servers.add_argument("port", type=int, nargs="?")
    servers.add_argument("--run", help="remove only if the entry belongs to this run")
    servers.add_argument("--token", help="update or remove only the entry claimed with this token")
    servers.add_argument("--exclusive", action="store_true", help="put: claim the port only if it is free")
    servers.add_argument("--port-status", type=int, metavar="PORT",
                         help="list: also say whether PORT is in use (as `port`), in the same exec")
    servers.add_argument("--host", default="127.0.0.1", help="the address --port-status probes")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "http" and not 0 <= args.until_ok <= MAX_UNTIL_OK_S:   # also refuses nan
        parser.error(f"--until-ok must be 0..{MAX_UNTIL_OK_S:g} seconds, not {args.until_ok}")
    # each command imports only what it uses: a readiness poll or a registry read is a new process
    if args.command == "inspect":
        from .configs import inspect
        out = inspect(args.engine, args.target, args.draft, args.sglang_status)
    elif args.command == "port":
        from . import net
        out = (net.wait_free(args.port, args.wait_free, args.host) if args.wait_free
               else net.port_status(args.port, args.host))
    elif args.command == "http":
        from . import net
        body = json.loads(args.body) if args.body else None
        out = net.request_until_ok(args.port, args.path, host=args.host, body=body, timeout=args.timeout,
                                   within=args.until_ok)
    elif args.command == "reap":
        from . import procs
        out = procs.reap(args.pgid, args.run_id, args.grace)
    else:
        out = _servers(parser, args)
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    return exitcodes.OK


def _servers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    from . import registry
    if args.action != "list" and args.port is None:
        parser.error(f"servers {args.action} needs a PORT")
    if args.action == "list":
        listed: dict[str, Any] = {"servers": registry.entries(args.state), "now": time.time()}
        if args.port_status is not None:
            from . import net
            listed["port"] = net.port_status(args.port_status, args.host)
        return listed
    if args.action == "put":
        return registry.put(args.state, args.port, json.loads(sys.stdin.read()), token=args.token,
                            exclusive=args.exclusive)
    return registry.remove(args.state, args.port, args.run, args.token)


if __name__ == "__main__":
    exitcodes.run("serve", main)
