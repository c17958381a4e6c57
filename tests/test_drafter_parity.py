"""fp32 parity of the draft forward with speculators 0.9.0's own ``Eagle3DraftModel``
(imported through benchmarks/speculators_peer.py, shared with the benchmark's peer; in CI a missing
speculators is a failure, not a skip: this is the check that the evaluator computes what training
computed)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from remote.drafter import load_checkpoint
from remote.drafter.data.batching import collate
from remote.drafter.data.dumps import DumpSet
from tests.support.drafter_support import PAD_BOUND, demo, load_speculators

# Same bound as padded vs unpadded batches (docs/drafter.md): the reference runs each sample alone,
# ours runs them padded into one batch, so only the fp32 summation order differs.
BOUND = PAD_BOUND


@pytest.fixture(scope="module")
def speculators():
    return load_speculators()


def _reference(speculators, ckpt: Path, weights: dict[str, torch.Tensor]):
    model_cls, config_cls = speculators
    cfg = config_cls.from_pretrained(str(ckpt))
    cfg.transformer_layer_config._attn_implementation = "eager"
    model = model_cls(cfg).eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"verifier_lm_head.weight", "verifier_norm.weight"}
    return model


def _speculators_logits(model, aux: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    captured: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: captured.append(out.detach()))
    try:
        with torch.no_grad():
            model(hidden_states=aux[None], input_ids=ids[None],
                  document_ids=torch.zeros(1, ids.shape[0], dtype=torch.long), ttt_steps=steps)
    finally:
        hook.remove()
    return [c[0] for c in captured]


def _compare(speculators, ckpt: Path, aux_rows: list[torch.Tensor], ids_rows: list[torch.Tensor],
             steps: int) -> float:
    """Max |diff| / (1 + max |logit|) over every step, comparing per sample with ours run on the
    padded batch."""
    from safetensors.torch import load_file

    weights = load_file(str(ckpt / "model.safetensors"))
    reference = _reference(speculators, ckpt, weights)
    ours, _ = load_checkpoint(ckpt)
    n = max(r.shape[0] for r in ids_rows)
    aux = torch.stack([torch.nn.functional.pad(a, (0, 0, 0, n - a.shape[0])) for a in aux_rows])
    ids = torch.stack([torch.nn.functional.pad(i, (0, n - i.shape[0])) for i in ids_rows])
    lengths = torch.tensor([r.shape[0] for r in ids_rows])
    with torch.inference_mode():
        mine = ours.forward(aux, ids, steps, lengths)
    worst = 0.0
    for b, (a, i) in enumerate(zip(aux_rows, ids_rows, strict=True)):
        ref = _speculators_logits(reference, a, i, steps)
        assert len(ref) == steps
        for k in range(steps):
            diff = float((ref[k] - mine[k][b, : i.shape[0]]).abs().max())
            worst = max(worst, diff / (1 + float(ref[k].abs().max())))
    return worst


def test_demo_draft_matches_speculators_on_demo_data(speculators) -> None:
    data = DumpSet.open(demo().data)
    batch = collate([data.load(i) for i in range(3)])
    aux = [batch.aux([0, 1, 2])[b] for b in range(3)]
    ids = [batch.input_ids[b] for b in range(3)]
    worst = _compare(speculators, demo().draft, aux, ids, steps=4)
    print(f"max |logit diff| = {worst:.3g} x (1 + max |logit|)")
    assert worst <= BOUND


@pytest.mark.parametrize("variant", [
    {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True},
    {"fc_norm": True, "layers": 2, "window": 6, "rope": {"rope_type": "llama3", "rope_theta": 500000.0,
                                                        "factor": 8.0, "low_freq_factor": 1.0,
                                                        "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 16}},
])
def test_random_drafts_match_speculators(speculators, tmp_path: Path, variant: dict) -> None:
    """Flag combinations, GQA, 2 layers, a sliding window shorter than the sample, llama3 rope,
    head_dim != hidden/heads, unequal sample lengths in one padded batch."""
    h, vocab, draft_vocab = 48, 80, 60
    tlc = {"model_type": "llama", "hidden_size": h, "intermediate_size": 96,
           "num_hidden_layers": variant.get("layers", 1), "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-5, "vocab_size": vocab,
           "max_position_embeddings": 256,
           "rope_parameters": variant.get("rope", {"rope_type": "default", "rope_theta": 10000.0})}
    if "window" in variant:
        tlc.update({"layer_types": ["sliding_attention", "full_attention"][: tlc["num_hidden_layers"]],
                    "sliding_window": variant["window"]})
    config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
              "draft_vocab_size": draft_vocab, "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
              "norm_before_residual": variant.get("norm_before_residual", False),
              "norm_before_fc": variant.get("norm_before_fc", False), "fc_norm": variant.get("fc_norm", False),
              "norm_output": variant.get("norm_output", False), "transformer_layer_config": tlc,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": None}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model_cls, config_cls = speculators
    cfg = config_cls.from_pretrained(str(tmp_path))
    cfg.transformer_layer_config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(3)
    weights = {}
    for name, t in model_cls(cfg).state_dict().items():
        if name.startswith("verifier_") or not t.dtype.is_floating_point:
            continue
        scale = 0.1 if t.dim() == 1 else t.shape[-1] ** -0.5
        weights[name] = (torch.randn(t.shape, generator=gen) * scale + (1.0 if t.dim() == 1 else 0.0))
    keep = torch.sort(torch.randperm(vocab, generator=gen)[:draft_vocab]).values
    weights["d2t"] = keep - torch.arange(draft_vocab)
    weights["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, keep, True)
    save_file(weights, str(tmp_path / "model.safetensors"))
    lengths = (13, 9, 11)
    aux = [torch.randn(n, 3 * h, generator=gen) * 3 for n in lengths]
    ids = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
    worst = _compare(speculators, tmp_path, aux, ids, steps=3)
    print(f"max |logit diff| = {worst:.3g} x (1 + max |logit|)")
    assert worst <= BOUND
