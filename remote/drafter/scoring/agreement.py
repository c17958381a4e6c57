"""How closely the engine's own states (a capture check's ``engine-states/``) agree with the dumps', slot
by slot, for the same tokens: the measurement behind ``target-rotated``.

A target served in a rotated basis (QuaRot and other rotation quantizations: the residual stream is
multiplied by an orthogonal Q, vllm-ascend #5974) keeps every state's norm, so a norm check passes,
while each coordinate means something else: the cosine between the engine's and the dump's state of
one token, and the correlation of each hidden dimension across tokens, fall to about 0.  Measured per
dump slot whose layer the engine states hold, on at most ``MAX_ROWS`` rows of the engine-state samples;
when the hidden size is at most ``MAX_FIT`` an orthogonal Procrustes fit (``dump @ R = engine``) says how
much of the engine's states one rotation explains.
"""
from __future__ import annotations

from typing import Any

import torch

from ..data.dumps import DumpSet

MAX_ROWS = 4096
MAX_FIT = 2048


def compare(states: DumpSet, dumps: DumpSet, indices: list[int]) -> dict[str, Any] | None:
    """Per shared layer: norm ratio, mean cosine, mean per-dimension correlation, the Procrustes residual.
    ``indices``: the dump sample of each engine-state file, in file order.  None when no layer is shared."""
    ours, theirs = dumps.slots.layer_ids, states.slots.layer_ids
    if ours is None or theirs is None:
        return None
    pairs = [(s, theirs.index(layer), layer) for s, layer in enumerate(ours) if layer in theirs]
    if not pairs:
        return None
    got: dict[int, list[torch.Tensor]] = {s: [] for s, _, _ in pairs}
    want: dict[int, list[torch.Tensor]] = {s: [] for s, _, _ in pairs}
    rows = 0
    for j, index in enumerate(indices):
        if rows >= MAX_ROWS:
            break
        engine, dumped = states.load(j).hidden, dumps.load(index).hidden
        take = min(engine.shape[0], dumped.shape[0], MAX_ROWS - rows)
        for s, e, _ in pairs:
            got[s].append(engine[:take, e].double())
            want[s].append(dumped[:take, s].double())
        rows += take
    slots = [_slot(s, layer, torch.cat(want[s]), torch.cat(got[s])) for s, _, layer in pairs]
    return {"rows": rows, "samples": len(indices), "slots": [s for s in slots if s is not None]}


def _slot(slot: int, layer: int, dump: torch.Tensor, engine: torch.Tensor) -> dict[str, Any] | None:
    keep = (dump.norm(dim=1) > 0) & (engine.norm(dim=1) > 0)
    keep &= torch.isfinite(dump).all(1) & torch.isfinite(engine).all(1)
    dump, engine = dump[keep], engine[keep]
    if dump.shape[0] < 2:
        return None
    cosine = torch.nn.functional.cosine_similarity(dump, engine, dim=1).mean()
    dc, ec = dump - dump.mean(0), engine - engine.mean(0)
    spread = dc.norm(dim=0) * ec.norm(dim=0)
    corr = ((dc * ec).sum(0) / spread.clamp(min=1e-300))[spread > 0]
    out = {"slot": slot, "layer_id": layer, "rows": int(dump.shape[0]),
           "norm_ratio": _g(engine.norm(dim=1).mean() / dump.norm(dim=1).mean()), "cosine": _g(cosine),
           "dim_correlation": _g(corr.mean()) if corr.numel() else None, "rotation_residual": None}
    if dump.shape[1] <= MAX_FIT and dump.shape[0] >= 4 * dump.shape[1]:   # fewer rows: any rotation fits
        u, _, vh = torch.linalg.svd(dump.T @ engine)
        fitted = dump @ (u @ vh)
        out["rotation_residual"] = _g((fitted - engine).norm() / engine.norm())
    return out


def _g(x: torch.Tensor) -> float:
    """6 significant digits: sums in another order differ in the last bits, the evidence must not."""
    return float(f"{float(x):.6g}")
