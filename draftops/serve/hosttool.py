"""Run ``remote/serve`` on the host: config reading, port and HTTP probes, the server registry.

Servers listen on the host's loopback address and every path is a host path, so all of this runs
there, one SSH exec per call, from the synced code folder (the caller syncs first).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from draftops.errors import ServeError
from draftops.link.host import Host
from draftops.runs.tools import call_tool

if TYPE_CHECKING:
    from draftops.documents.serve_inspect import ServeInspect


def run(host: Host, args: list[str], *, python: str | None = None, env: Mapping[str, str] | None = None,
        input: bytes | None = None, timeout: float | None = None, install: str = "") -> dict[str, Any]:
    """``python -m remote.serve ARGS`` on ``host`` (``draftops.runs.tools.call_tool``); returns its JSON
    answer. ``install`` says how to get the python when it is missing."""
    missing = (f"{install or 'Install it'}, or point `python:` in the serve profile (or `engine_python:` in "
               "the host entry) at the interpreter that runs the engine.")
    answer: dict[str, Any] = call_tool(host, "remote.serve", args, python=python, env=env, input=input,
                                       timeout=timeout, error=ServeError, missing=missing)
    return answer


def inspect(host: Host, python: str, env: Mapping[str, str], engine: str, target: str,
            draft: str | None) -> ServeInspect:
    """Facts about target and draft as ``engine`` (run by ``python``) will read them: the answer read
    once into its model (``draftops.serve-inspect/1``), so the checks use attributes."""
    from draftops.documents import parse  # pydantic: imported once there is a document to read
    from draftops.documents.serve_inspect import ServeInspect

    args = ["inspect", "--engine", engine, "--target", target, "--sglang-status"]
    if draft:
        args += ["--draft", draft]
    install = (f"Install vLLM there with `invoke env.setup --engine vllm --host {host.name}`" if engine == "vllm"
               else "Install SGLang into the host's ml-env (`sglang` in env.requirements, `invoke env.setup`)")
    # the capture patcher keeps its records in <root>/state (as `invoke patch-sglang` does)
    answer = run(host, args, python=python, env={**env, "DRAFTOPS_STATE_DIR": host.state_dir}, timeout=120,
                 install=install)
    return parse(ServeInspect, answer, f"the answer of `remote.serve inspect` on host {host.name!r}")


def port(host: Host, number: int, listen: str = "127.0.0.1", wait_free: float = 0.0) -> dict[str, Any]:
    args = ["port", str(number), "--host", probe_address(listen)]
    if wait_free:
        args += ["--wait-free", str(wait_free)]
    return run(host, args, timeout=wait_free + 30)


def http(host: Host, number: int, path: str, body: Any = None, listen: str = "127.0.0.1",
         timeout: float = 10.0, until_ok: float = 0.0) -> tuple[int | None, str]:
    """(status, body) of one request to the server on ``host``; status None when nothing answered.
    ``until_ok``: the host asks again until it answers 200, for up to that many seconds."""
    args = ["http", str(number), path, "--host", probe_address(listen), "--timeout", str(timeout)]
    if body is not None:
        args += ["--json", json.dumps(body)]
    if until_ok > 0:
        args += ["--until-ok", f"{until_ok:g}"]
    answer = run(host, args, timeout=timeout + until_ok + 30)
    return answer.get("status"), answer.get("body") or answer.get("error") or ""


def servers(host: Host) -> tuple[list[dict[str, Any]], float]:
    """The registry entries, and the host's clock (uptimes are measured there)."""
    answer = run(host, ["servers", "--state", host.state_dir, "list"])
    return answer["servers"], float(answer["now"])


def servers_and_port(host: Host, number: int, listen: str = "127.0.0.1") -> tuple[list[dict[str, Any]], float,
                                                                                   dict[str, Any]]:
    """:func:`servers` and :func:`port` of ``number`` in one exec (what making room for a server asks)."""
    answer = run(host, ["servers", "--state", host.state_dir, "list", "--port-status", str(number),
                        "--host", probe_address(listen)])
    return answer["servers"], float(answer["now"]), answer["port"]


def register(host: Host, number: int, entry: dict[str, Any], *, token: str | None = None,
             exclusive: bool = False) -> bool:
    """Write the registry entry for port ``number``; False when the claim or update was refused."""
    args = ["servers", "--state", host.state_dir, "put", str(number)]
    args += (["--token", token] if token else []) + (["--exclusive"] if exclusive else [])
    return bool(run(host, args, input=json.dumps(entry).encode()).get("written"))


def unregister(host: Host, number: int, run_id: str | None = None, token: str | None = None) -> None:
    args = ["servers", "--state", host.state_dir, "remove", str(number)]
    run(host, args + (["--run", run_id] if run_id else []) + (["--token", token] if token else []))


def probe_address(listen: str) -> str:
    """Where to reach a server bound to ``listen`` from the host itself."""
    return "127.0.0.1" if listen in ("0.0.0.0", "::", "", "localhost") else listen


def reap(host: Host, pgid: int, run_id: str, grace: float = 10.0) -> dict[str, Any]:
    """TERM, then KILL, whatever processes of run ``run_id`` remain in group ``pgid``."""
    return run(host, ["reap", str(pgid), run_id, "--grace", str(grace)], timeout=grace + 30)
