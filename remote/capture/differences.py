"""How a slot that matches no boundary differs from the nearest one: the kinds of difference that
hide from a cosine (an embedding scale bug reads cosine 1.000003) are measured directly.

Each explanation is a fit of the dumped rows D from the served rows S at the nearest boundary; it
*explains* the slot when what is left after the fit is below the slot's match threshold:

* ``scale``: D = c S (c fitted by least squares; the per-token norm ratios say how steady it is);
* ``offset``: D = S + m (m a constant vector: the mean difference);
* ``post-norm``: D = g * S / rms(S) (per-channel g: the final norm applied, speculators #313);
* ``rotation`` / ``linear map``: D = S W (least squares when there are at least 2H rows; an
  orthogonal W is a rotation); with fewer rows, equal token Gram matrices D D^T = S S^T with
  unequal rows say an orthogonal map;
* ``noise``: none of these, and the error is small: its size in mantissa bits says which dtype or
  quantization could make it (bf16 keeps 8 bits, fp8 e4m3 3).
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .matching import SlotMatch, Tally, threshold_at

#: the kinds, simplest first: a linear map also fits a scale, so the simplest kind that fits is named
KINDS = ("scale", "offset", "post-norm", "rotation", "linear map")
#: an error this large is no dtype's rounding: the states are of another computation
NOISE_CEILING = 0.2


def _rel(residual: torch.Tensor, reference: torch.Tensor) -> float:
    return float(residual.norm() / reference.norm().clamp(min=1e-30))


def rows(tally: Tally, slot: int, boundary: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = torch.cat([k[:, slot] for k in tally.kept_dump]).to(torch.float64)
    s = torch.cat([k[:, boundary] for k in tally.kept_served]).to(torch.float64)
    return d, s


def fits(d: torch.Tensor, s: torch.Tensor) -> dict[str, dict[str, Any]]:
    """The residual of each kind of fit, with its fitted figures."""
    out: dict[str, dict[str, Any]] = {}
    c = float((d * s).sum() / (s * s).sum().clamp(min=1e-30))
    token_ratio = d.norm(dim=1) / s.norm(dim=1).clamp(min=1e-30)
    spread = float(token_ratio.std() / token_ratio.mean().clamp(min=1e-30)) if token_ratio.numel() > 1 else 0.0
    if abs(c - 1) > 1e-3:
        out["scale"] = {"residual": _rel(d - c * s, d), "factor": c, "token_ratio_spread": spread}
    m = (d - s).mean(dim=0)
    out["offset"] = {"residual": _rel(d - s - m, d), "offset_norm": float(m.norm()),
                     "offset_relative": float(m.norm() / d.norm(dim=1).mean().clamp(min=1e-30))}
    normed = s / s.pow(2).mean(dim=1, keepdim=True).add(1e-6).sqrt()
    g = (d * normed).sum(dim=0) / (normed * normed).sum(dim=0).clamp(min=1e-30)
    out["post-norm"] = {"residual": _rel(d - normed * g, d)}
    n, h = s.shape
    if n >= 2 * h:
        w = torch.linalg.lstsq(s, d).solution
        eye = torch.eye(h, dtype=w.dtype)
        orth = _rel(w.T @ w - eye, eye)
        out["rotation" if orth < 0.05 else "linear map"] = {"residual": _rel(d - s @ w, d),
                                                            "orthogonality_error": orth, "rows": n}
    else:
        pick = torch.linspace(0, n - 1, min(n, 512)).round().long()
        gd, gs = d[pick] @ d[pick].T, s[pick] @ s[pick].T
        out["rotation"] = {"residual": _rel(gd - gs, gd), "rows": int(pick.numel()), "by": "token Gram matrices"}
    return out


def explain(tally: Tally, m: SlotMatch) -> dict[str, Any]:
    """What differs between slot ``m.slot`` and the boundaries: the fit (of any kind, at any boundary)
    that leaves the least, when it leaves less than that boundary's match threshold; else noise or unlike."""
    near = tally.neighbour_distance()
    candidates: list[tuple[int, float, str, int, dict[str, Any]]] = []
    for b in range(tally.boundaries):
        threshold = threshold_at(float(near[b]))
        for kind, fit in fits(*rows(tally, m.slot, b)).items():
            score = fit["residual"] / max(threshold, 1e-12)
            if score < 1:
                candidates.append((KINDS.index(kind), score, kind, b, fit))
    best = None
    if candidates:       # the simplest kind that fits about as well as the best fit (a linear map fits a scale too)
        least = min(c[1] for c in candidates)
        best = min((c for c in candidates if c[1] <= 2 * least + 1e-6), key=lambda c: c[:2])[1:]
    bits = -math.log2(m.error) if m.error > 0 else math.inf
    entry: dict[str, Any] = {"slot": m.slot, "nearest_boundary": m.boundary, "relative_error": m.error,
                             "cosine": m.cosine, "norm_ratio": m.norm_ratio,
                             "noise_bits": round(bits, 2) if math.isfinite(bits) else None}
    if best is not None:
        _, kind, b, fit = best
        entry.update(kind=kind, boundary=b, fit=fit, explained=True, text=_words(kind, b, fit, m))
    elif m.error < NOISE_CEILING:
        entry.update(kind="noise", boundary=m.boundary, fit=None, explained=True,
                     text=(f"it is near boundary {m.boundary} with relative error {m.error:.3g} (about {bits:.1f} "
                           "mantissa bits agree; bf16 keeps 8, fp8 3): noise beyond this engine's own, as a "
                           "quantized or otherwise different target gives"))
    else:
        entry.update(kind="unlike", boundary=m.boundary, fit=None, explained=False,
                     text=(f"it is like no boundary of this target: the nearest, {m.boundary}, is at relative "
                           f"error {m.error:.3g}, and no scale, offset, norm or rotation of any boundary explains it"))
    return entry


def _words(kind: str, b: int, fit: dict[str, Any], m: SlotMatch) -> str:
    at = f"boundary {b}"
    if kind == "scale":
        return (f"it is the state at {at} scaled by {fit['factor']:.4g} (norm ratios steady within "
                f"{fit['token_ratio_spread']:.1%}; the cosine, {m.cosine:.6f}, cannot show this)")
    if kind == "offset":
        return (f"it is the state at {at} plus a constant vector of norm {fit['offset_norm']:.4g} "
                f"({fit['offset_relative']:.1%} of a token's norm)")
    if kind == "post-norm":
        return (f"it is the state at {at} after an RMS norm (the final norm applied: dumps must hold the "
                "pre-norm state; speculators #313)")
    if kind == "rotation":
        return f"it is a fixed rotation of the state at {at} (an orthogonal map; refit error {fit['residual']:.2g})"
    return f"it is a fixed linear map of the state at {at} (refit error {fit['residual']:.2g})"
