"""The EAGLE-3 draft forward with the test-time-training (TTT) unroll, batched.

Equals speculators 0.9.0 ``Eagle3DraftModel.forward`` (docs/drafter.md): fc over the concatenated aux
features, a first layer that attends over ``cat([input_layernorm(embed), hidden_norm(h)])``,
optional further Llama layers, ``lm_head(norm(h))`` over the draft vocab, and K teacher-forced steps
that feed back the last hidden state with positions advanced by one per step.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from . import layers, rope
from .layers import AttnShape, KVCache, Weights


@dataclass(frozen=True)
class DraftArch:
    """Everything the forward needs to know besides the weights (see checkpoint.infer_arch)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_layers: int
    num_aux: int
    aux_hidden_size: int
    draft_vocab_size: int
    vocab_size: int
    rms_norm_eps: float
    rope: rope.RopeSpec
    norm_before_residual: bool
    norm_output: bool
    norm_before_fc: bool
    fc_norm: bool
    qk_norm: bool
    sliding_windows: tuple[int | None, ...]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rope"] = self.rope.to_dict()
        d["sliding_windows"] = list(self.sliding_windows)
        return d


class Eagle3Draft:
    """A loaded draft: ``forward(aux, input_ids, steps)`` returns the logits of every TTT step.

    ``aux``        [B, N, A·H_t]  row t holds the target's features of position t-1
    ``input_ids``  [B, N]         row t holds token x_t (target vocab; 0 on padding)
    ``lengths``    [B]            valid rows per sample (default: all N)
    ``positions``  [B, N]         rope position of each row at step 0 (default 1..N, speculators)
    Step k predicts x_{t+k+1} from teacher-forced x_{t+k}; logits are over the draft vocab.
    """

    def __init__(self, arch: DraftArch, weights: Weights, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.arch = arch
        self.device = torch.device(device)
        self.dtype = dtype
        self.w: Weights = {
            name: t.to(self.device) if name in ("d2t", "t2d") else t.to(self.device, dtype)
            for name, t in weights.items()
        }
        self._freq, self._rope_scale = rope.inv_freq(arch.rope, arch.head_dim)
        self._attn = [AttnShape(arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.rms_norm_eps,
                                arch.qk_norm, arch.sliding_windows[i]) for i in range(arch.num_layers)]

    # -- vocabulary -------------------------------------------------------------------------
    @property
    def d2t(self) -> torch.Tensor:
        """Offsets so that target_id = draft_id + d2t[draft_id] (zeros for a full-vocab draft)."""
        if "d2t" in self.w:
            return self.w["d2t"]
        return torch.zeros(self.arch.draft_vocab_size, dtype=torch.long, device=self.device)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def target_to_draft(self) -> torch.Tensor:
        """[V] long: draft index of each target id, -1 where the id is not in the draft vocab."""
        table = torch.full((self.arch.vocab_size,), -1, dtype=torch.long, device=self.device)
        idx = torch.arange(self.arch.draft_vocab_size, device=self.device)
        table[self.draft_to_target(idx)] = idx
        return table

    # -- forward ------------------------------------------------------------------------------
    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """fc over the aux features (after input_norm or per-slot fc_norm when present)."""
        a, eps = self.arch, self.arch.rms_norm_eps
        x = aux.to(self.dtype)
        if a.norm_before_fc:
            x = layers.rms_norm(x, self.w["input_norm.weight"], eps)
        if a.fc_norm:
            chunks = x.chunk(a.num_aux, dim=-1)
            x = torch.cat([layers.rms_norm(c, self.w[f"fc_norm.{i}.weight"], eps)
                           for i, c in enumerate(chunks)], dim=-1)
        return layers.linear(x, self.w, "fc")

    def iter_steps(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int,
                   lengths: torch.Tensor | None = None,
                   positions: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
        """Yield the logits [B, N, Vd] of steps 0..steps-1 one at a time (bounded memory)."""
        a, eps, w = self.arch, self.arch.rms_norm_eps, self.w
        bsz, n = input_ids.shape
        input_ids = input_ids.to(self.device)
        if lengths is None:
            lengths = torch.full((bsz,), n, dtype=torch.long)
        lengths = lengths.to(self.device)
        key_valid = torch.arange(n, device=self.device)[None, :] < lengths[:, None]
        if positions is None:
            positions = torch.arange(1, n + 1, device=self.device).expand(bsz, n)
        positions = positions.to(self.device)
        rope.check_range(a.rope, int(positions.max()) + steps)
        caches = [KVCache() for _ in range(a.num_layers)]
        h = self.combine(aux.to(self.device))
        for k in range(steps):
            ids = input_ids if k == 0 else torch.cat(
                [input_ids[:, k:], input_ids.new_zeros(bsz, k)], dim=1)
            cs = rope.cos_sin(positions + k, self._freq, self._rope_scale, self.dtype)
            embeds = w["embed_tokens.weight"][ids]
            hn = layers.rms_norm(h, w["layers.0.hidden_norm.weight"], eps)
            residual = hn if a.norm_before_residual else h
            x = torch.cat([layers.rms_norm(embeds, w["layers.0.input_layernorm.weight"], eps), hn], -1)
            h = residual + layers.attention(x, w, "layers.0.self_attn.", self._attn[0], cs,
                                            caches[0], key_valid)
            h = h + layers.mlp(layers.rms_norm(h, w["layers.0.post_attention_layernorm.weight"], eps),
                               w, "layers.0.mlp.")
            for i in range(1, a.num_layers):
                p = f"layers.{i}."
                x = layers.rms_norm(h, w[p + "input_layernorm.weight"], eps)
                h = h + layers.attention(x, w, p + "self_attn.", self._attn[i], cs, caches[i], key_valid)
                h = h + layers.mlp(layers.rms_norm(h, w[p + "post_attention_layernorm.weight"], eps),
                                   w, p + "mlp.")
            normed = layers.rms_norm(h, w["norm.weight"], eps)
            yield layers.linear(normed, w, "lm_head")
            if a.norm_output:
                h = normed

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int = 3,
                lengths: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Logits of every step, ``[steps] x [B, N, Vd]`` (``[N, Vd]`` for unbatched 2-D/1-D inputs)."""
        if aux.dim() == 2:
            pos = None if positions is None else positions[None]
            return [x[0] for x in self.iter_steps(aux[None], input_ids[None], steps, None, pos)]
        return list(self.iter_steps(aux, input_ids, steps, lengths, positions))

    __call__ = forward
