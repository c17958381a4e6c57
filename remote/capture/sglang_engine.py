"""SGLang in hidden-state mode: ``--enable-return-hidden-states`` and ``"return_hidden_states": true``.

Facts: shared/reference/vllm-cpu.md (last paragraph) and SGLang's own test of the feature: the answer's
``meta_info["hidden_states"]`` is a list with one entry per generated token, the first (with
``max_new_tokens`` 1, the only one) the prompt's states [T][H]. They are the states the LM head reads:
the final layer's output *after* the final norm. No stock flag chooses other layers (with EAGLE-3
capture on, the logits processor returns the concatenated aux states instead), so against SGLang the
check can place the final slot only; the aux slots need vLLM's extraction, `test-drafter`, or, for an
embedding slot, draftops' capture patch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .errors import EngineError
from .instance import Instance, without_owned

#: flags the capture instance sets itself; a profile's extra_args holding them are left out
OWNED = ("--model-path", "--model", "--host", "--port", "--tp-size", "--tensor-parallel-size",
         "--enable-return-hidden-states", "--speculative-algorithm", "--speculative-draft-model-path",
         "--context-length")


@dataclass(frozen=True)
class Setup:
    python: str
    target: str
    port: int
    tp: int
    context_length: int | None
    extra_args: tuple[str, ...]


def command(setup: Setup) -> list[str]:
    argv = [setup.python, "-m", "sglang.launch_server", "--model-path", setup.target, "--host", "127.0.0.1",
            "--port", str(setup.port), "--tp-size", str(setup.tp), "--enable-return-hidden-states"]
    if setup.context_length is not None:
        argv += ["--context-length", str(setup.context_length)]
    return argv + without_owned(setup.extra_args, OWNED)


def fetch_final(instance: Instance, token_ids: list[int], hidden: int, timeout: float) -> torch.Tensor:
    """[T, H]: the post-norm final states SGLang returns for the prompt ``token_ids``."""
    body = {"input_ids": token_ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_hidden_states": True}
    answer = instance.post("/generate", body, timeout)
    meta = answer.get("meta_info")
    states: Any = meta.get("hidden_states") if isinstance(meta, dict) else None
    if not isinstance(states, list) or not states:
        raise EngineError("The SGLang engine answered without meta_info.hidden_states, so it is not returning "
                          "hidden states", path=str(instance.log),
                          fix="use an SGLang that supports --enable-return-hidden-states (0.4.4 or later)")
    try:
        first = torch.tensor(states[0], dtype=torch.float32)
    except (TypeError, ValueError) as exc:
        raise EngineError(f"The SGLang engine's hidden_states are not a [T][H] list of numbers ({exc})",
                          path=str(instance.log)) from exc
    if tuple(first.shape) != (len(token_ids), hidden):
        raise EngineError(f"The SGLang engine returned hidden states of shape {list(first.shape)} for a "
                          f"{len(token_ids)}-token prompt, not [{len(token_ids)}, {hidden}]", path=str(instance.log),
                          fix="report this with the engine's version; the capture check cannot use the answer")
    return first
