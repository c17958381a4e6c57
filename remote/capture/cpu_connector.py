"""vLLM's ``ExampleHiddenStatesConnector`` made to work on a CPU engine.

Loaded *inside the vLLM process* by ``"kv_connector_module_path": "remote.capture.cpu_connector"``
(the engine's own venv, with the synced code on its ``PYTHONPATH``); nothing else imports it. The
stock connector copies each request's states with ``pin_memory=True`` and CUDA streams and events,
which kills a CPU engine on its first request (vllm-cpu.md, "The engine's own hidden states"). This
subclass overrides only that copy: the slot mapping and ``extract_from_kv_cache`` are the stock
ones, the copy is a plain clone, and the write goes through the stock ``_write_tensors`` (which
holds the file's ``.lock`` until the file is complete) with a completion object that is done.
"""
from __future__ import annotations

import fcntl
import os
from functools import partial
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (  # type: ignore
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Done:
    """What the stock writer and ``get_finished`` expect of a CUDA event, for a copy already made."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """The stock connector with a synchronous CPU copy."""

    def _submit_async_write(self, pending: Any) -> None:
        if not self._is_tp_rank_zero:
            return
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device),
                                       pending.token_ids.shape[0])
        tensors = {"hidden_states": states.to("cpu").clone(), "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
