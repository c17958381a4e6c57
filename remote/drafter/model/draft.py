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
from .layers import AttnShape, Weights


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
        if not any(t.requires_grad for t in self.w.values()):  # training must update the originals
            for i in range(arch.num_layers):
                layers.fuse_projections(self.w, f"layers.{i}.")
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
        """Yield the logits [B, N, Vd] of steps 0..steps-1 one at a time (bounded memory).

        ``lengths`` is accepted for callers that have it; attention is causal, so a valid row never
        sees a padding key and the logits do not depend on it."""
        bsz, n = input_ids.shape
        unroll = Unroll(self, aux, input_ids, positions)
        for _ in range(steps):
            yield unroll.step().view(bsz, n, -1)

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int = 3,
                lengths: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Logits of every step, ``[steps] x [B, N, Vd]`` (``[N, Vd]`` for unbatched 2-D/1-D inputs)."""
        if aux.dim() == 2:
            pos = None if positions is None else positions[None]
            return [x[0] for x in self.iter_steps(aux[None], input_ids[None], steps, None, pos)]
        return list(self.iter_steps(aux, input_ids, steps, lengths, positions))

    __call__ = forward


class Unroll:
    """One TTT unroll of a batch, advanced one step per ``step(rows)`` call.

    Step 0 runs every row through the layers (each row's step-0 key/value is seen by the later rows
    of its sample), but the last layer's output projection, MLP and lm_head only for ``rows``.
    A later step runs only ``rows``, which must be a subset of the previous step's: a row's step k
    depends on its own step k-1 and on the step-0 keys, never on another row's later steps, so a
    scorer can drop the rows whose chain already failed.  ``rows`` are ascending flat indices
    b * N + t; None means all rows (or, after step 0, the rows of the previous step).

    Attention: in fp32, and under autograd (the demo's training), speculators' own dense
    formulation (one softmax over the keys of every step, under the causal|diagonal mask), so fp32
    logits stay bit-identical to speculators'; for a subset of rows it runs per sample on the
    selected queries only.  In half precision (bf16 on a GPU), a fused causal kernel over the
    step-0 keys, merged with each row's own keys of the later steps: no step scores the
    (k+1)·N keys a row cannot see.  ``exact`` overrides the choice (not under autograd).
    """

    def __init__(self, draft: Eagle3Draft, aux: torch.Tensor, input_ids: torch.Tensor,
                 positions: torch.Tensor | None = None, exact: bool | None = None) -> None:
        self.draft = draft
        dev = draft.device
        bsz, n = input_ids.shape
        self.shape = (int(bsz), int(n))
        self.ids = input_ids.to(dev)
        if positions is None:
            positions = torch.arange(1, n + 1, device=dev).expand(bsz, n)
        self.positions = positions.to(dev).reshape(-1)
        self._max_position = int(self.positions.max()) if self.positions.numel() else 0
        self.h = draft.combine(aux.to(dev)).reshape(bsz * n, -1)
        self.rows: torch.Tensor | None = None
        self.k = 0
        self.grad = torch.is_grad_enabled()
        self.exact = self.grad or (draft.dtype == torch.float32 if exact is None else exact)
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # step-0 keys/values per layer
        self._diag: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(draft.arch.num_layers)]

    def step(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [len(rows), Vd] of the next TTT step for ``rows`` (all rows when None)."""
        a, w, k = self.draft.arch, self.draft.w, self.k
        rope.check_range(a.rope, self._max_position + k + 1)
        if rows is not None and self.grad:
            raise ValueError("Unroll: row selection needs inference mode (no autograd)")
        last: torch.Tensor | None = None  # step 0: rows kept after the last layer's attention
        if k == 0:
            last, rows = rows, None
        else:
            self._keep(rows)
        current = self.rows
        ids = self.ids if k == 0 else torch.cat([self.ids[:, k:], self.ids.new_zeros(self.shape[0], k)], 1)
        ids, pos = ids.reshape(-1), self.positions + k
        if current is not None:
            ids, pos = ids[current], pos[current]
        cos, sin = rope.cos_sin(pos, self.draft._freq, self.draft._rope_scale, self.draft.dtype)
        h, eps = self.h, a.rms_norm_eps
        embeds = w["embed_tokens.weight"][ids]
        for i in range(a.num_layers):
            p = f"layers.{i}."
            if i == 0:
                hn = layers.rms_norm(h, w[p + "hidden_norm.weight"], eps)
                residual = hn if a.norm_before_residual else h
                x = torch.cat([layers.rms_norm(embeds, w[p + "input_layernorm.weight"], eps), hn], -1)
            else:
                residual, x = h, layers.rms_norm(h, w[p + "input_layernorm.weight"], eps)
            attn = self._attention(i, x, cos, sin, current)
            if last is not None and i == a.num_layers - 1:
                attn, residual = attn[last], residual[last]
            h = residual + layers.linear(attn, w, p + "self_attn.o_proj")
            h = h + layers.mlp(layers.rms_norm(h, w[p + "post_attention_layernorm.weight"], eps), w, p + "mlp.")
        if last is not None:
            self.rows = last
        normed = layers.rms_norm(h, w["norm.weight"], eps)
        self.h = normed if a.norm_output else h
        self.k += 1
        return layers.linear(normed, w, "lm_head")

    def _keep(self, rows: torch.Tensor | None) -> None:
        """Narrow the carried state (hidden, diagonal keys) to ``rows``."""
        if rows is None:
            return
        if self.rows is None:
            idx = rows
        else:
            idx = torch.searchsorted(self.rows, rows).clamp_(max=max(self.rows.numel() - 1, 0))
            if rows.numel() and not bool((self.rows[idx] == rows).all()):
                raise ValueError("Unroll.step: rows must be a subset of the previous step's rows")
        self.h = self.h[idx]
        self._diag = [[(kk[idx], vv[idx]) for kk, vv in d] for d in self._diag]
        self.rows = rows

    def _attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   rows: torch.Tensor | None) -> torch.Tensor:
        """Attention output [R, heads*hd] (before o_proj) of layer ``i`` for the rows ``x``."""
        shape, w, p = self.draft._attn[i], self.draft.w, f"layers.{i}.self_attn."
        bsz, n = self.shape
        scale = shape.head_dim ** -0.5
        q, kk, vv = layers.project_qkv(x, w, p, shape, cos, sin)
        if self.k == 0:
            self._kv.append((kk, vv))
        else:
            self._diag[i].append((kk, vv))
        if self.exact and rows is not None:
            return layers.exact_rows(q, rows, n, *self._kv[i], self._diag[i], shape.window, scale).flatten(1)
        if self.exact:
            return layers.exact_grid(q, self.shape, *self._kv[i], self._diag[i], shape.window, scale).flatten(1)
        grid = q if rows is None else q.new_zeros(bsz * n, *q.shape[1:]).index_copy_(0, rows, q)
        k0, v0 = (t.view(bsz, n, -1, shape.head_dim).transpose(1, 2) for t in self._kv[i])
        out, lse = layers.causal_attention(grid.view(bsz, n, -1, shape.head_dim).transpose(1, 2), k0, v0,
                                           shape.window, scale)
        out, lse = out.transpose(1, 2).reshape(bsz * n, *q.shape[1:]), lse.transpose(1, 2).reshape(bsz * n, -1)
        if rows is not None:
            out, lse = out[rows], lse[rows]
        return layers.merge_diagonal(out, lse, q, self._diag[i], scale).flatten(1)
