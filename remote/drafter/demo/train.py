"""Train a tiny EAGLE-3 draft for the demo, with the evaluator's own forward (so what is trained is
exactly what is scored).  Targets are the target model's argmax restricted to the draft vocab
(speculators' verifier targets, as hard labels), summed over the teacher-forced TTT steps."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..model.draft import DraftArch, Eagle3Draft
from ..model.layers import Weights


def select_vocab(ids: torch.Tensor, vocab: int, draft_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft vocabulary as speculators picks it: the ``draft_vocab`` most frequent token ids,
    ascending (so d2t = keep - arange).  Returns (keep, target id -> draft id or -100)."""
    counts = torch.bincount(ids.flatten(), minlength=vocab)
    keep = torch.sort(torch.argsort(counts, descending=True, stable=True)[:draft_vocab]).values
    to_draft = torch.full((vocab,), -100, dtype=torch.long)
    to_draft[keep] = torch.arange(draft_vocab)
    return keep, to_draft


def init_draft(arch: DraftArch, embed: torch.Tensor, lm_head_rows: torch.Tensor, d2t: torch.Tensor,
               gen: torch.Generator, aux_std: torch.Tensor | None = None) -> Weights:
    """Fresh draft weights: embedding copied (frozen), lm_head from the target's draft-vocab rows.

    ``aux_std`` [A·H] (the spread of each aux feature over the training data) preconditions ``fc``:
    each input column is divided by its feature's spread and constant features get zero weight, so
    the embedding slot, a hundred times smaller than the layer slots, is heard from the first step
    instead of after hundreds of steps of Adam growing its weights."""
    h, hd, a = arch.hidden_size, arch.head_dim, arch.num_aux

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * shape[-1] ** -0.5

    w: Weights = {
        "embed_tokens.weight": embed.clone(), "lm_head.weight": lm_head_rows.clone(),
        "d2t": d2t.clone(), "fc.weight": rand(h, a * arch.aux_hidden_size), "norm.weight": torch.ones(h),
    }
    if aux_std is not None:
        live = aux_std > 1e-4 * aux_std.max()
        w["fc.weight"] = w["fc.weight"] * torch.where(live, 1 / aux_std.clamp_min(1e-12), 0.0)
    p = "layers.0."
    w.update({
        p + "self_attn.q_proj.weight": rand(arch.num_heads * hd, 2 * h),
        p + "self_attn.k_proj.weight": rand(arch.num_kv_heads * hd, 2 * h),
        p + "self_attn.v_proj.weight": rand(arch.num_kv_heads * hd, 2 * h),
        p + "self_attn.o_proj.weight": rand(h, arch.num_heads * hd) * 0.5,
        p + "mlp.gate_proj.weight": rand(arch.intermediate_size, h),
        p + "mlp.up_proj.weight": rand(arch.intermediate_size, h),
        p + "mlp.down_proj.weight": rand(h, arch.intermediate_size) * 0.5,
        p + "input_layernorm.weight": torch.ones(h), p + "hidden_norm.weight": torch.ones(h),
        p + "post_attention_layernorm.weight": torch.ones(h),
    })
    return w


def fit(arch: DraftArch, w: Weights, aux: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor,
        steps: int, iters: int, batch: int, lr: float, gen: torch.Generator,
        frozen: Sequence[str] = ("embed_tokens.weight", "d2t")) -> list[float]:
    """Adam on all but ``frozen``; ``labels`` [S, N] are draft-vocab ids per row (-100 = ignore).
    Step k of row t is trained on label t+k.  Returns the loss curve."""
    params = {n: t.requires_grad_(True) for n, t in w.items() if n not in frozen}
    opt = torch.optim.Adam(params.values(), lr=lr)
    # warm-up of 10% (at least 2 steps: OneCycleLR divides by the warm-up length minus one)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(iters, 3),
                                                pct_start=max(0.1, 2 / max(iters, 3)))
    draft = Eagle3Draft(arch, w)  # same device and dtype: it holds the very tensors being trained
    losses = []
    for _ in range(iters):
        idx = torch.randint(0, aux.shape[0], (batch,), generator=gen)
        loss = torch.zeros(())
        for k, logits in enumerate(draft.iter_steps(aux[idx], input_ids[idx], steps)):
            target = torch.cat([labels[idx, k:], labels.new_full((batch, k), -100)], dim=1)
            loss = loss + F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    for t in params.values():
        t.requires_grad_(False)
    return losses
