"""vLLM in hidden-state mode: ``extract_hidden_states`` with every boundary 0..n, one file per request.

Facts: shared/reference/vllm-cpu.md, "The engine's own hidden states". Ids are boundaries (0 = the
embedding output, k = after k decoder layers, n = the last layer's output before the final norm).
The answer names a safetensors file (``token_ids`` [T], ``hidden_states`` [T, n+1, H]) that the
connector writes asynchronously while holding an exclusive flock on ``<file>.lock``.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import EngineError, StorageError
from .instance import Instance, without_owned

#: the connector this package ships for CPU engines (the stock one needs CUDA; see cpu_connector.py)
CPU_CONNECTOR = ("CpuHiddenStatesConnector", "remote.capture.cpu_connector")
STOCK_CONNECTOR = "ExampleHiddenStatesConnector"
#: flags the capture instance sets itself; a profile's extra_args holding them are left out
OWNED = ("--speculative-config", "--kv-transfer-config", "--port", "--host", "--tensor-parallel-size",
         "--max-num-seqs", "--max-model-len")


@dataclass(frozen=True)
class Setup:
    python: str
    target: str
    port: int
    tp: int
    max_model_len: int | None
    extra_args: tuple[str, ...]
    storage: Path
    num_layers: int
    cuda: bool


def command(setup: Setup) -> list[str]:
    """argv of the hidden-state instance: the target as the profile serves it, plus extraction."""
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {
                "eagle_aux_hidden_state_layer_ids": list(range(setup.num_layers + 1))}}}
    connector: dict[str, object] = {"kv_connector": STOCK_CONNECTOR, "kv_role": "kv_producer",
                                    "kv_connector_extra_config": {"shared_storage_path": str(setup.storage)}}
    if not setup.cuda:
        connector.update(kv_connector=CPU_CONNECTOR[0], kv_connector_module_path=CPU_CONNECTOR[1])
    argv = [setup.python, "-m", "vllm.entrypoints.cli.main", "serve", setup.target, "--host", "127.0.0.1",
            "--port", str(setup.port), "--tensor-parallel-size", str(setup.tp), "--max-num-seqs", "4",
            "--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(connector)]
    if setup.max_model_len is not None:
        argv += ["--max-model-len", str(setup.max_model_len)]
    return argv + without_owned(setup.extra_args, OWNED)


def environment(base: dict[str, str], code_root: Path) -> dict[str, str]:
    """The engine's variables: the profile's, offline, and the synced code importable (the connector)."""
    env = dict(base)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code_root), env.get("PYTHONPATH", "")) if p)
    return env


def fetch_states(instance: Instance, setup: Setup, token_ids: list[int], timeout: float,
                 file_wait: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_ids [T], hidden_states [T, n+1, H]) the engine computes for ``token_ids``; the file is removed."""
    body = {"model": setup.target, "prompt": token_ids, "max_tokens": 1, "temperature": 0,
            "kv_transfer_params": {}}
    answer = instance.post("/v1/completions", body, timeout)
    params = answer.get("kv_transfer_params")
    path = params.get("hidden_states_path") if isinstance(params, dict) else None
    if not isinstance(path, str):
        raise EngineError("The vLLM engine answered without kv_transfer_params.hidden_states_path, so it is not "
                          "extracting hidden states", path=str(instance.log),
                          fix="check that this vLLM supports the extract_hidden_states method (vLLM >= 0.32)")
    file = Path(path)
    if file.parent.resolve() != setup.storage.resolve():
        raise EngineError(f"The vLLM engine wrote its hidden states outside the folder it was given ({path})",
                          path=str(setup.storage))
    try:
        return _read_when_complete(file, file_wait, instance)
    finally:
        for leftover in (file, Path(path + ".lock")):
            try:
                leftover.unlink()
            except FileNotFoundError:
                pass


def _read_when_complete(file: Path, within: float, instance: Instance) -> tuple[torch.Tensor, torch.Tensor]:
    """Take a shared flock on ``<file>.lock`` (the writer holds it exclusively until the file is whole),
    polling so the wait is bounded, then read the file."""
    from safetensors.torch import load_file

    deadline = time.monotonic() + within
    fd = _open_lock(file, deadline, within, instance)
    try:
        if fd is not None:
            _shared_lock(fd, file, deadline, within, instance)
        try:
            data = load_file(str(file), device="cpu")
        except Exception as exc:  # noqa: BLE001 - absent, or cut short (a full disk): SafetensorError is no OSError
            raise _incomplete(file, within, instance, f"it could not be read ({type(exc).__name__}: {exc})") from exc
    finally:
        if fd is not None:
            os.close(fd)
    if "hidden_states" not in data or "token_ids" not in data:
        raise _incomplete(file, within, instance, f"it holds {sorted(data)}, not token_ids and hidden_states")
    return data["token_ids"], data["hidden_states"]


def _open_lock(file: Path, deadline: float, within: float, instance: Instance) -> int | None:
    """The lock file's descriptor; None when the file is there without one (locking turned off)."""
    while True:
        try:
            return os.open(str(file) + ".lock", os.O_RDONLY)
        except FileNotFoundError:
            if file.is_file():
                return None
            if time.monotonic() > deadline:
                raise _incomplete(file, within, instance, "its lock file never appeared") from None
            time.sleep(0.05)


def _shared_lock(fd: int, file: Path, deadline: float, within: float, instance: Instance) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
        if time.monotonic() > deadline:
            raise _incomplete(file, within, instance, "the engine still held its write lock")
        time.sleep(0.05)


def _incomplete(file: Path, within: float, instance: Instance, why: str) -> StorageError:
    return StorageError(f"The hidden-state file the vLLM engine named was not complete within {within:g} s: "
                        f"{why}. The engine's writer fails like this when the folder's disk is full; the last "
                        f"lines of its log: {instance.log_tail() or '(empty)'}", path=str(file),
                        fix="free space on the disk holding the run folder (or pass --storage DIR on another "
                            "disk) and run the check again")
