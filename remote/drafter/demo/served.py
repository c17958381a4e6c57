"""Dumps of the text a server writes when it serves the demo target at a temperature.

Why: a greedy-draft server accepts a drafted token exactly when it equals the token the server
writes, so what it measures at temperature T is the draft replayed over *the text it writes at T*:
the demo target's own samples at T, continued from the bench's prompts, ``output_len`` tokens or up
to EOS (a prompt-file bench stops at EOS).  The demo's training dumps are not that text: they were
sampled at 0.35, are 40 tokens long, and the draft was trained on them.  The evaluator's
``--temperature T`` on these dumps predicts the bench at T (docs/drafter.md § Temperature).

Written in speculators' legacy ``.pt`` format (``input_ids``, ``hidden_states`` per demo slot,
``loss_mask``), because the mask marks what a server drafts: the generated tokens only, never the
prompt's.  Deterministic for a seed.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from ..demo_spec import DemoSpec
from ..model import tinyllama
from ..model.layers import Weights
from . import wordtokenizer

EOS = wordtokenizer.SPECIALS.index("</s>")
MAX_TOKENS = 4096          # prompt + output per sequence (the demo target's positions)
MAX_SEQUENCES = 65536


def encode_prompts(texts: Sequence[str], vocab_size: int) -> list[list[int]]:
    """The bench's prompt texts (``w05 w17 ...``) as the demo tokenizer's ids (no BOS: it adds none)."""
    return [wordtokenizer.encode(t, vocab_size) for t in texts]


def sample_served(target: Path, prompts: Sequence[Sequence[int]], temperature: float, output_len: int,
                  continuations: int = 8, seed: int = 0) -> list[tuple[torch.Tensor, int]]:
    """``continuations`` sequences per prompt, each the prompt plus what the target samples at
    ``temperature`` (``output_len`` tokens, cut after the first EOS), as a server writes them; with
    the prompt's length."""
    _check(prompts, temperature, output_len, continuations)
    cfg, weights = tinyllama.load(target)
    gen = torch.Generator().manual_seed(seed)
    out: list[tuple[torch.Tensor, int]] = []
    for length in sorted({len(p) for p in prompts}):          # one batch per prompt length
        group = [list(p) for p in prompts if len(p) == length]
        batch = torch.tensor(group, dtype=torch.long).repeat_interleave(continuations, 0)
        with torch.no_grad():
            ids = tinyllama.sample(cfg, weights, batch, length + output_len, temperature, gen) \
                if temperature > 0 else _greedy(cfg, weights, batch, output_len)
        out += [(_cut_at_eos(row, length), length) for row in ids]
    return out


def write_served_dumps(target: Path, folder: Path, sequences: Sequence[tuple[torch.Tensor, int]],
                       spec: DemoSpec = DemoSpec()) -> Path:
    """Each sequence with the demo's five slots (embedding, l_a, l_b, l_c, final) and a loss mask
    over its generated tokens, plus the demo's data_config.json; ``folder`` is replaced."""
    cfg, weights = tinyllama.load(target)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    index = [i + 1 for i in spec.slot_ids]             # SGLang id i = the state after i + 1 layers
    for n, (ids, plen) in enumerate(sequences):
        with torch.no_grad():
            states, _ = tinyllama.forward(cfg, weights, ids[None])
        slots = states[0][:, index]
        torch.save({"input_ids": ids.clone(), "loss_mask": (torch.arange(ids.numel()) >= plen).long(),
                    "hidden_states": [slots[:, s].clone() for s in range(slots.shape[1])]},
                   folder / f"data_{n}.pt")
    data_cfg = {"layer_ids": spec.slot_ids, "layer_id_convention": "sglang", "final_slot": len(spec.slot_ids) - 1,
                "num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
                "note": "served text: the demo target's samples continued from the bench prompts"}
    (folder / "data_config.json").write_text(json.dumps(data_cfg, indent=2) + "\n")
    return folder


def served_dumps(demo: Path, folder: Path, texts: Sequence[str], temperature: float, output_len: int,
                 continuations: int = 8, seed: int = 0, spec: DemoSpec = DemoSpec()) -> Path:
    """The dumps of what a server of ``demo``'s target writes from the prompt ``texts`` at ``temperature``."""
    prompts = encode_prompts(texts, spec.vocab_size)
    threads = torch.get_num_threads()
    torch.set_flush_denormal(True)     # the tiny target's weights otherwise hit slow denormal arithmetic
    torch.set_num_threads(spec.threads)
    try:
        sequences = sample_served(demo / "target", prompts, temperature, output_len, continuations, seed)
        return write_served_dumps(demo / "target", folder, sequences, spec)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def _cut_at_eos(row: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The sequence up to and with the first generated EOS (a server stops there)."""
    eos = (row[prompt_len:] == EOS).nonzero()
    return row[: prompt_len + int(eos[0]) + 1].clone() if eos.numel() else row.clone()


def _greedy(cfg: tinyllama.TinyConfig, weights: Weights, batch: torch.Tensor,
            output_len: int) -> torch.Tensor:
    return torch.tensor([p.tolist() + tinyllama.greedy(cfg, weights, p.tolist(), output_len) for p in batch])


def _check(prompts: Sequence[Sequence[int]], temperature: float, output_len: int, continuations: int) -> None:
    """Bounded work: refuse what no bench sends (ValueError names the value and the limit)."""
    if not prompts or any(not p for p in prompts):
        raise ValueError("served dumps need at least one prompt, and no empty one")
    if not (0 <= temperature <= 100) or temperature != temperature:
        raise ValueError(f"temperature {temperature!r} must be a number from 0 to 100")
    longest = max(len(p) for p in prompts) + output_len
    if output_len < 1 or longest > MAX_TOKENS:
        raise ValueError(f"output_len {output_len!r} must be at least 1 and keep prompt + output within "
                         f"{MAX_TOKENS} tokens (longest: {longest})")
    if continuations < 1 or len(prompts) * continuations > MAX_SEQUENCES:
        raise ValueError(f"{len(prompts)} prompts x {continuations} continuations: at most {MAX_SEQUENCES} "
                         "sequences, at least one per prompt")
