"""The embedded demo: a tiny target, its hidden-state dumps, and a draft with the seed's bug.

The target is a standard 6-layer ``LlamaForCausalLM`` (full causal attention, default rope, a
word-level tokenizer saved next to it), so vLLM and SGLang serve the folder as is.  Its weights are
random around a positional skeleton (see ``tinyllama.init_weights``): layer 0 attends to the previous
and the current token, so the next token is a function of the last two, a language a one-layer
draft learns in seconds, while every layer's MLP still transforms the state (which layers the draft
reads matters).  Sequences are sampled from it, and every slot the seed's dump had is captured: the
embedding, three inner layers and the final layer.  A draft is trained on ``[embed, l_a, l_b]`` but
saved with config ids pointing at ``[l_a, l_b, l_c]``, the mismatch of the seed article (trained on
``cat([embed, layer3, layer31])``, served ``cat([layer3, layer31, layer59])``).  A correctly
configured copy (``[-1, l_a, l_b]``) is saved next to it.  Deterministic (seeded).

Layout of ``out``::

    target/       HF Llama folder: config.json, generation_config.json, model.safetensors,
                  tokenizer.json + tokenizer_config.json (use as --verifier, or serve it)
    data/         hs_{i}.safetensors  (token_ids, hidden_states [T, 5, H]) + data_config.json
    data_pt/      data_{i}.pt (legacy: input_ids, hidden_states list, loss_mask) + data_config.json
    draft/        speculators format, ids [l_a, l_b, l_c] (the bug), stored as speculators does,
                  in vLLM's convention: [l_a+1, l_b+1, l_c+1]
    draft_flat/   flat LlamaForCausalLMEagle3 (midlayer.*, no embed_tokens), same bug,
                  plus config_speculators.json (the seed's backup)
    draft_fixed/  speculators format, ids [-1, l_a, l_b], stored as [0, l_a+1, l_b+1]; vLLM's
                  eagle3 serves it on the target as is
    SERVE.json    what a server needs: folders, layer ids in both conventions, layer count
    DEMO.json     written last: marks the folder complete, holds the parameters and training stats
"""
from __future__ import annotations

import fcntl
import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ... import events, jsonread
from ...eagle import convention
from ...eagle.formats import EAGLE_CONFIG, FLAT, IDS_KEY, SPECULATORS
from ..demo_spec import DEMO_VERSION, MARKER, SERVE_INFO, SERVE_SCHEMA, DemoPaths, DemoSpec, is_complete
from ..model import tinyllama
from ..model.draft import DraftArch, Eagle3Draft
from ..model.layers import Weights
from ..model.rope import RopeSpec
from . import prompts as demo_prompts
from . import train, wordtokenizer


def ensure_demo(out: str | Path, force: bool = False, spec: DemoSpec = DemoSpec()) -> DemoPaths:
    """Generate the demo into ``out`` unless a complete one is already there.

    Two jobs asking at once (two test-drafter runs on one host) take turns on a lock file next to
    the folder; the second finds the first one's demo complete and reuses it."""
    out = Path(out)
    if not force and is_complete(out, spec):
        return DemoPaths(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if force or not is_complete(out, spec):
            build_demo(out, spec)
    return DemoPaths(out)


def build_demo(out: Path, spec: DemoSpec = DemoSpec()) -> DemoPaths:
    """Build everything (about 15 s of one CPU core; see benchmarks/demo_generation.py)."""
    paths = DemoPaths(out)
    (out / MARKER).unlink(missing_ok=True)
    (out / SERVE_INFO).unlink(missing_ok=True)
    for part in paths.parts:
        shutil.rmtree(part, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_flush_denormal(True)  # tiny weights otherwise hit slow denormal arithmetic
    torch.set_num_threads(spec.threads)
    try:
        stats = _build(paths, spec)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    (out / SERVE_INFO).write_text(json.dumps(serve_info(spec), indent=2) + "\n")
    (out / MARKER).write_text(json.dumps({"version": DEMO_VERSION, "spec": asdict(spec),
                                          **stats}, indent=2) + "\n")
    # the benchmark's prompts too, while torch is loaded (`invoke bench --dataset demo` then reads them)
    demo_prompts.write(out, out / demo_prompts.IN_DEMO, spec.prompt_len)
    events.result(str(out / MARKER), kind="demo")
    return paths


def serve_info(spec: DemoSpec = DemoSpec()) -> dict[str, Any]:
    """SERVE.json: what a server of the demo needs (folders relative to the demo folder, since
    the folder is copied between hosts; layer ids in both conventions)."""
    return {
        "schema": SERVE_SCHEMA, "version": DEMO_VERSION,
        "target": "target", "tokenizer": "target", "draft": "draft_fixed", "draft_buggy": "draft",
        "draft_flat_buggy": "draft_flat", "draft_format": "speculators", "method": "eagle3",
        "num_hidden_layers": spec.num_layers, "vocab_size": spec.vocab_size,
        "max_position_embeddings": tinyllama.TinyConfig().max_position_embeddings,
        "draft_layer_ids_sglang": spec.trained_ids, "draft_layer_ids_vllm": [i + 1 for i in spec.trained_ids],
        "buggy_layer_ids_sglang": spec.buggy_ids, "buggy_layer_ids_vllm": [i + 1 for i in spec.buggy_ids],
        "num_speculative_tokens": spec.train_steps, "dtype": "float32",
        "special_token_ids": {"unk": 0, "bos": 1, "eos": 2},
    }


def read_serve_info(root: str | Path) -> dict[str, Any]:
    """SERVE.json of a complete demo, with the folders made absolute (``*_path`` keys)."""
    root = Path(root)
    info = jsonread.loads((root / SERVE_INFO).read_text())
    for key in ("target", "tokenizer", "draft", "draft_buggy", "draft_flat_buggy"):
        info[f"{key}_path"] = str((root / info[key]).resolve())
    return info


def _build(paths: DemoPaths, spec: DemoSpec) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(spec.seed)
    cfg = tinyllama.TinyConfig(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                               num_hidden_layers=spec.num_layers)
    clock = _PhaseClock()
    events.progress(0, 4, "demo: sampling the target")
    target, ids, states, logits, draws = _draw_target(cfg, spec, gen)
    clock.lap("sample")
    slots = states[:, :, [i + 1 for i in spec.slot_ids]]  # SGLang id i = state after i+1 layers
    mask = torch.arange(spec.seq_len)[None, :].expand(spec.samples, -1) >= spec.prompt_len
    tinyllama.save(cfg, target, paths.target)
    wordtokenizer.save(paths.target, cfg.vocab_size, cfg.max_position_embeddings)
    events.progress(1, 4, "demo: writing dumps")
    data_cfg = {"layer_ids": spec.slot_ids, "layer_id_convention": "sglang", "final_slot": 4,
                "num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
                "note": "slot k holds the output of decoder layer layer_ids[k] (-1: embedding)"}
    write_dumps(paths.data, ids, slots, None, data_cfg, "safetensors")
    write_dumps(paths.data_pt, ids, slots, mask, data_cfg, "pt")
    clock.lap("write")
    events.progress(2, 4, "demo: training the draft")
    weights, arch, val_acc, loss = _train_draft(spec, target, ids, slots, logits, gen)
    clock.lap("train")
    events.progress(3, 4, "demo: saving drafts")
    save_draft(paths.draft, weights, arch, spec.buggy_ids, SPECULATORS)
    save_draft(paths.draft_flat, weights, arch, spec.buggy_ids, FLAT)
    shutil.copy(paths.draft / "config.json", paths.draft_flat / "config_speculators.json")
    save_draft(paths.draft_fixed, weights, arch, spec.trained_ids, SPECULATORS)
    clock.lap("write")
    events.progress(4, 4, "demo: done")
    return {"trained_layer_ids": spec.trained_ids, "configured_layer_ids": spec.buggy_ids,
            "slot_layer_ids": spec.slot_ids, "val_full_acc_0": val_acc, "final_train_loss": loss,
            "target_draws": draws, "current_token_share": current_token_share(
                ids, logits.argmax(-1), spec.vocab_size), "seconds": clock.seconds}


class _PhaseClock:
    """Wall and CPU seconds per build phase, kept in DEMO.json (benchmarks/demo_generation.py)."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def lap(self, phase: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        entry = self.seconds.setdefault(phase, {"wall": 0.0, "cpu": 0.0})
        entry["wall"] = round(entry["wall"] + wall - self._wall, 3)
        entry["cpu"] = round(entry["cpu"] + cpu - self._cpu, 3)
        self._wall, self._cpu = wall, cpu


def _draw_target(cfg: tinyllama.TinyConfig, spec: DemoSpec, gen: torch.Generator
                 ) -> tuple[Weights, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Draw target weights, sample the dump's sequences, and redraw while the sampled language is
    too predictable from the current token alone: at low temperature some random targets fall into
    short cycles where x_t alone gives x_{t+1}, and then even a mis-wired draft scores well."""
    draws = 0
    while True:
        draws += 1
        target = tinyllama.init_weights(cfg, gen, proj_std=spec.target_proj_std, head_std=1.0)
        prompts = torch.randint(0, spec.vocab_size, (spec.samples, spec.prompt_len), generator=gen)
        with torch.no_grad():
            ids = tinyllama.sample(cfg, target, prompts, spec.seq_len, spec.temperature, gen)
            states, logits = tinyllama.forward(cfg, target, ids)
        share = current_token_share(ids, logits.argmax(-1), spec.vocab_size)
        if share <= spec.max_current_token_share or draws >= spec.max_target_draws:
            return target, ids, states, logits, draws


def current_token_share(ids: torch.Tensor, argmax: torch.Tensor, vocab: int) -> float:
    """Accuracy of the best predictor of argmax[t] that sees only ids[t] (a majority vote per id)."""
    table = torch.zeros(vocab, vocab, dtype=torch.long)
    table.index_put_((ids.flatten(), argmax.flatten()), torch.ones(ids.numel(), dtype=torch.long),
                     accumulate=True)
    return float(table.max(dim=1).values.sum()) / ids.numel()


def _train_draft(spec: DemoSpec, target: Weights, ids: torch.Tensor, slots: torch.Tensor,
                 logits: torch.Tensor, gen: torch.Generator
                 ) -> tuple[Weights, DraftArch, float, float]:
    """Train on the first 90% of samples with aux ``[embed, l_a, l_b]`` (slots 0, 1, 2)."""
    counts = torch.bincount(ids.flatten(), minlength=spec.vocab_size)
    keep = torch.sort(torch.argsort(counts, descending=True, stable=True)[: spec.draft_vocab_size]).values
    d2t = keep - torch.arange(spec.draft_vocab_size)
    to_draft = torch.full((spec.vocab_size,), -100, dtype=torch.long)
    to_draft[keep] = torch.arange(spec.draft_vocab_size)
    h = spec.hidden_size
    arch = DraftArch(hidden_size=h, num_heads=2, num_kv_heads=1, head_dim=32,
                     intermediate_size=spec.draft_intermediate, num_layers=1, num_aux=3, aux_hidden_size=h,
                     draft_vocab_size=spec.draft_vocab_size, vocab_size=spec.vocab_size, rms_norm_eps=1e-5,
                     rope=RopeSpec(), norm_before_residual=False, norm_output=False, norm_before_fc=False,
                     fc_norm=False, qk_norm=False, sliding_windows=(None,))
    aux = slots[:, :-1, :3].flatten(2)
    n_train = int(spec.samples * (1 - spec.val_fraction))
    w = train.init_draft(arch, target["model.embed_tokens.weight"], target["lm_head.weight"][keep], d2t, gen,
                         aux_std=aux[:n_train].flatten(0, 1).std(0) if spec.precondition else None)
    labels = to_draft[logits[:, 1:].argmax(-1)]  # every row: the safetensors dump has no loss mask
    losses = train.fit(arch, w, aux[:n_train], ids[:n_train, 1:], labels[:n_train], spec.train_steps,
                       spec.train_iters, spec.train_batch, spec.lr, gen)
    with torch.inference_mode():
        pred = Eagle3Draft(arch, w).forward(aux[n_train:], ids[n_train:, 1:], 1)[0].argmax(-1)
    val = labels[n_train:] >= 0
    val_acc = float(((pred == labels[n_train:]) & val).sum() / val.sum())
    w["t2d"] = to_draft >= 0
    return w, arch, val_acc, float(sum(losses[-20:]) / 20)


def write_dumps(folder: Path, ids: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor | None,
                data_cfg: dict[str, Any], fmt: str) -> None:
    """One file per sample in the speculators safetensors format or the legacy .pt format."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(ids.shape[0]):
        if fmt == "safetensors":
            save_file({"token_ids": ids[i].contiguous(), "hidden_states": slots[i].contiguous()},
                      str(folder / f"hs_{i}.safetensors"))
        else:
            torch.save({"input_ids": ids[i].clone(),
                        "loss_mask": mask[i].long() if mask is not None else None,
                        "hidden_states": [slots[i, :, s].clone() for s in range(slots.shape[2])]},
                       folder / f"data_{i}.pt")
    (folder / "data_config.json").write_text(json.dumps(data_cfg, indent=2) + "\n")


def save_draft(folder: Path, w: Weights, arch: DraftArch, layer_ids: list[int], fmt: str) -> None:
    """Write config.json + model.safetensors in the speculators or the flat format."""
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == FLAT:
        tensors = {n.replace("layers.0.", "midlayer.", 1): t for n, t in w.items()
                   if n != "embed_tokens.weight"}
        config = flat_config(arch, layer_ids)
    else:
        tensors = dict(w)
        config = speculators_config(arch, layer_ids)
    save_file({n: t.detach().contiguous() for n, t in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _llama_block(arch: DraftArch) -> dict[str, Any]:
    return {"model_type": "llama", "hidden_size": arch.hidden_size,
            "intermediate_size": arch.intermediate_size, "num_hidden_layers": arch.num_layers,
            "num_attention_heads": arch.num_heads, "num_key_value_heads": arch.num_kv_heads,
            "head_dim": arch.head_dim, "hidden_act": "silu", "rms_norm_eps": arch.rms_norm_eps,
            "max_position_embeddings": 2048, "vocab_size": arch.vocab_size, "tie_word_embeddings": False,
            "attention_bias": False, "mlp_bias": False}


def speculators_config(arch: DraftArch, layer_ids: list[int]) -> dict[str, Any]:
    """As speculators 0.9.0 writes it (reference §1a). ``layer_ids`` are SGLang ids; the file holds
    them in speculators' own (vLLM) convention, id + 1, where 0 is the embedding."""
    tlc = {**_llama_block(arch), "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope.theta}}
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0", "draft_vocab_size": arch.draft_vocab_size,
        IDS_KEY: convention.sglang_to_file(SPECULATORS, layer_ids), "embed_requires_grad": False,
        "fc_norm": arch.fc_norm,
        "norm_before_fc": arch.norm_before_fc, "norm_before_residual": arch.norm_before_residual,
        "norm_output": arch.norm_output, "target_hidden_size": None,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                  "speculative_tokens": 3, "verifier_accept_k": 1}],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": None}},
        "transformer_layer_config": tlc,
    }


def flat_config(arch: DraftArch, layer_ids: list[int]) -> dict[str, Any]:
    """The SGLang/vLLM-native ``LlamaForCausalLMEagle3`` format (reference §1b)."""
    return {"architectures": ["LlamaForCausalLMEagle3"], **_llama_block(arch),
            "rope_theta": arch.rope.theta, "rope_scaling": None, "draft_vocab_size": arch.draft_vocab_size,
            "torch_dtype": "float32",
            EAGLE_CONFIG: {IDS_KEY: layer_ids, "use_aux_hidden_state": True}}
