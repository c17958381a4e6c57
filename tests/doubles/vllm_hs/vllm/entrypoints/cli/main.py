"""A stand-in for ``python -m vllm.entrypoints.cli.main serve`` in hidden-state mode, for the
capture check's fault tests (tests/doubles/README.md): it computes the demo target's states with
draftops' own reference forward and writes them as vLLM 0.32's ExampleHiddenStatesConnector does
(``<storage>/<req>.safetensors`` with ``token_ids`` [T] and ``hidden_states`` [T, len(ids), H], an
exclusive flock on ``<file>.lock`` until the file is whole, the path in the answer's
``kv_transfer_params.hidden_states_path``). ``FAKE_VLLM_FAULT`` picks a fault:
``die-at-start``, ``die-on-request``, ``hang-on-request``, ``never-complete`` (the lock is never
released), ``truncate`` (half a file, then the lock released: a full disk), ``slow-start``.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from safetensors.torch import save_file

from remote.drafter.model import tinyllama

FAULT = os.environ.get("FAKE_VLLM_FAULT", "")
STATE: dict[str, Any] = {"held": []}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("command")
    p.add_argument("target")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--speculative-config", required=True)
    p.add_argument("--kv-transfer-config", required=True)
    args, _ = p.parse_known_args(argv)
    return args


def write(path: str, fd: int, tokens: torch.Tensor, states: torch.Tensor) -> None:
    time.sleep(0.05)
    if FAULT == "never-complete":
        STATE["held"].append(fd)
        return
    save_file({"token_ids": tokens, "hidden_states": states}, path)
    if FAULT == "truncate":
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) // 2)
    os.close(fd)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a: object) -> None:
        pass

    def _send(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200 if self.path == "/health" else 404, {})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if FAULT == "die-on-request":
            os._exit(3)
        if FAULT == "hang-on-request":
            time.sleep(3600)
        tokens = torch.tensor(body["prompt"], dtype=torch.long)
        states, _ = tinyllama.forward(STATE["cfg"], STATE["weights"], tokens[None])
        path = os.path.join(STATE["storage"], f"{uuid.uuid4().hex}.safetensors")
        fd = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._send(200, {"choices": [{"text": "x"}], "kv_transfer_params": {"hidden_states_path": path}})
        threading.Thread(target=write, args=(path, fd, tokens, states[0][:, STATE["ids"]].contiguous()),
                         daemon=True).start()


def main() -> None:
    args = parse(sys.argv[1:])
    if FAULT == "die-at-start":
        print("RuntimeError: fake engine failed to load the model", flush=True)
        sys.exit(1)
    if FAULT == "slow-start":
        time.sleep(3600)
    spec = json.loads(args.speculative_config)
    STATE["ids"] = spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
    STATE["storage"] = json.loads(args.kv_transfer_config)["kv_connector_extra_config"]["shared_storage_path"]
    STATE["cfg"], STATE["weights"] = tinyllama.load(args.target)
    print(f"fake vLLM hidden-state engine on port {args.port}", flush=True)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
