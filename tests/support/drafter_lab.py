"""A second test world for the drafter, independent of the demo: its own tiny target language,
dumps, and drafts *trained* on chosen layers (with the evaluator's forward, or with speculators'
own model and loss in tests/test_drafter_speculators_trained.py).

The target is not a transformer but a stack of residual MLP layers; the first two also read the
previous position's state, so the next token depends on the last three tokens (the current token
alone predicts about half of it: a draft must use the hidden states it is fed).  Every layer
transforms the state, so which layers a draft reads matters.  Slots dumped, in SGLang ids (output of layer
id, -1 = embedding): ``[-1, 1, 2, 3, 4]`` = h0, h2, h3, h4 and the final pre-norm state h5.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import inspect
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from remote.drafter import EvalOptions, evaluate
from remote.drafter.demo import train
from remote.drafter.demo.build import save_draft, write_dumps
from remote.drafter.model.draft import DraftArch
from remote.drafter.model.layers import Weights, rms_norm
from remote.drafter.model.rope import RopeSpec
from tests.support.cache_dir import cache_root

SLOT_IDS = [-1, 1, 2, 3, 4]  # SGLang ids of the dumped slots; 4 = n-1 is the final layer
TRAINED = [-1, 1, 2]  # slots 0, 1, 2
NEIGHBOUR = [-1, 1, 3]  # layer 3 in place of layer 2: about 2 points worse at step 0
WELL_TRAINED = 300  # iterations: step-0 accuracy about 0.75, against a hidden-state-blind 0.5
BARELY = 3  # iterations: near chance
CACHE = cache_root() / "drafter-lab"


@dataclass(frozen=True)
class LabSpec:
    seed: int = 11
    vocab: int = 96
    draft_vocab: int = 80
    hidden: int = 32
    layers: int = 5
    ffn: int = 96
    # residual updates outweigh the embedding (context matters); layer 3 changes its input little, so
    # its output (SGLang id 3) is a close neighbour of layer 2's (id 2)
    scales: tuple[float, ...] = (2.5, 2.5, 2.5, 1.5, 2.5)
    mixing: int = 2  # layers that also read the previous position (the rest are position-wise)
    samples: int = 192
    seq_len: int = 28
    prompt_len: int = 3
    temperature: float = 1.0


@dataclass(frozen=True)
class Lab:
    root: Path
    spec: LabSpec
    ids: torch.Tensor  # [S, T]
    states: torch.Tensor  # [S, T, layers+1, H]: h0 (embedding) .. h_L (final, pre-norm)
    logits: torch.Tensor  # [S, T, V]

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def slots(self) -> torch.Tensor:
        """[S, T, 5, H]: the dumped slots (SGLang id i = state after i+1 layers)."""
        return self.states[:, :, [i + 1 for i in SLOT_IDS]]


def target_weights(spec: LabSpec) -> Weights:
    gen = torch.Generator().manual_seed(spec.seed)
    h, f = spec.hidden, spec.ffn
    w: Weights = {"model.embed_tokens.weight": torch.randn(spec.vocab, h, generator=gen),
                  "model.norm.weight": torch.ones(h),
                  "lm_head.weight": torch.randn(spec.vocab, h, generator=gen) * 1.5}
    for layer in range(spec.layers):
        w[f"up.{layer}"] = torch.randn(f, 2 * h, generator=gen) * (2 * h) ** -0.5
        w[f"down.{layer}"] = torch.randn(h, f, generator=gen) * f ** -0.5 * spec.scales[layer]
    return w


def target_forward(spec: LabSpec, w: Weights, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """States [B, T, L+1, H] and logits [B, T, V] of the lab target."""
    h = w["model.embed_tokens.weight"][ids]
    states = [h]
    ones = torch.ones(spec.hidden)
    for layer in range(spec.layers):
        x = rms_norm(h, ones, 1e-6)
        prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1) if layer < spec.mixing else 0 * x
        h = h + F.silu(torch.cat([x, prev], -1) @ w[f"up.{layer}"].T) @ w[f"down.{layer}"].T
        states.append(h)
    logits = rms_norm(h, w["model.norm.weight"], 1e-6) @ w["lm_head.weight"].T
    return torch.stack(states, dim=2), logits


@functools.lru_cache(maxsize=4)
def lab(spec: LabSpec = LabSpec()) -> Lab:
    """Sample the language, write target/ (HF layout) and data/ (safetensors dumps); once per process."""
    root = Path(tempfile.mkdtemp(prefix="draftops-lab-"))
    atexit.register(shutil.rmtree, root, True)
    w = target_weights(spec)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    ids = torch.randint(0, spec.vocab, (spec.samples, spec.prompt_len), generator=gen)
    with torch.no_grad():
        for _ in range(spec.seq_len - spec.prompt_len):
            _, logits = target_forward(spec, w, ids)
            probs = torch.softmax(logits[:, -1] / spec.temperature, -1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], 1)
        states, logits = target_forward(spec, w, ids)
    out = Lab(root, spec, ids, states, logits)
    out.target.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in w.items() if k.startswith(("model.", "lm_head"))},
              str(out.target / "model.safetensors"))
    (out.target / "config.json").write_text(json.dumps({"num_hidden_layers": spec.layers,
                                                        "hidden_size": spec.hidden, "vocab_size": spec.vocab}))
    data_cfg = {"layer_ids": SLOT_IDS, "layer_id_convention": "sglang", "final_slot": 4,
                "num_hidden_layers": spec.layers}
    with contextlib.redirect_stdout(io.StringIO()):
        write_dumps(out.data, ids, out.slots(), None, data_cfg, "safetensors")
    return out


def draft_vocab(the_lab: Lab) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept target ids ascending, target id -> draft id or -100): the most frequent tokens."""
    return train.select_vocab(the_lab.ids, the_lab.spec.vocab, the_lab.spec.draft_vocab)


def draft_arch(spec: LabSpec) -> DraftArch:
    return DraftArch(hidden_size=spec.hidden, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=128,
                     num_layers=1, num_aux=3, aux_hidden_size=spec.hidden, draft_vocab_size=spec.draft_vocab,
                     vocab_size=spec.vocab, rms_norm_eps=1e-6, rope=RopeSpec(), norm_before_residual=False,
                     norm_output=False, norm_before_fc=False, fc_norm=False, qk_norm=False,
                     sliding_windows=(None,))


@functools.lru_cache(maxsize=8)
def trained_weights(iters: int, slots: tuple[int, ...] = (0, 1, 2), seed: int = 5) -> Weights:
    """A draft trained with the evaluator's forward on ``slots`` of the lab dumps (all samples).

    Training is deterministic, so the result is cached on disk under a key made of the arguments
    and the source of everything that shapes it (this file, train/model/layers/rope)."""
    key = cache_key(iters, slots, seed)
    cached = CACHE / f"{key}.safetensors"
    if cached.is_file():
        return load_file(str(cached))
    the_lab = lab()
    spec = the_lab.spec
    keep, to_draft = draft_vocab(the_lab)
    arch = draft_arch(spec)
    gen = torch.Generator().manual_seed(seed)
    target = target_weights(spec)
    w = train.init_draft(arch, target["model.embed_tokens.weight"], target["lm_head.weight"][keep],
                         keep - torch.arange(spec.draft_vocab), gen)
    aux = the_lab.slots()[:, :-1, list(slots)].flatten(2)
    labels = to_draft[the_lab.logits[:, 1:].argmax(-1)]
    if iters:
        train.fit(arch, w, aux, the_lab.ids[:, 1:], labels, 3, iters, 32, 5e-3, gen)
    w["t2d"] = to_draft >= 0
    w = {k: v.detach().contiguous() for k, v in w.items()}
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    save_file(w, str(tmp))
    os.replace(tmp, cached)
    return w


def cache_key(*args: Any) -> str:
    """Digest of ``args``, the lab's parameters and the source of everything that shapes its weights:
    the functions here that make the language and train, and the drafter modules they call."""
    digest = hashlib.sha256(repr((args, LabSpec())).encode())
    for function in (target_weights, target_forward, lab, draft_vocab, draft_arch, trained_weights):
        digest.update(inspect.getsource(function).encode())
    drafter = Path(__file__).resolve().parents[2] / "remote" / "drafter"
    for module in ("demo/train", "model/draft", "model/layers", "model/rope", "data/batching"):
        digest.update((drafter / f"{module}.py").read_bytes())
    return digest.hexdigest()[:20]


def save(folder: Path, w: Weights, layer_ids: list[int], fmt: str = "speculators") -> Path:
    """A checkpoint of ``w`` whose config names ``layer_ids`` (SGLang ids; stored as vLLM ids, id + 1,
    in the speculators format)."""
    save_draft(folder, w, draft_arch(lab().spec), layer_ids, fmt)
    return folder


def run(out: Path, ckpt: Path, **kw: Any) -> dict[str, Any]:
    """evaluate() on the lab dumps with the lab target as verifier, events swallowed."""
    kw.setdefault("data", lab().data)
    kw.setdefault("verifier", lab().target)
    with contextlib.redirect_stdout(io.StringIO()):
        return evaluate(EvalOptions(ckpt=ckpt, out=out, **kw))
