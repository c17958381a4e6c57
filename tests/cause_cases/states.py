"""Causes seen in the dumped states (remote/drafter/causes/states.py, slotstats.py): the embedding at
another scale than the target's (failure-modes #5), and states that are not the served target's (#7),
seen against the lab target's own embedding or by a capture check of the dumps against its states."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from remote.capture import cli as capture_cli
from remote.capture import matching
from remote.capture.dumps import Picked
from remote.capture.target import Target
from remote.drafter.data.dumps import DumpSet

from .healthy import Healthy, Variant

EMBED = 0  # the lab slot of the embedding output (SGLang id -1), fed to the draft


def _slots(change: str) -> torch.Tensor:
    from tests.support.drafter_lab import lab

    slots = lab().slots().clone()
    if change == "scale":  # Gemma's sqrt(hidden) left out: inputs 50x too small
        slots[:, :, EMBED] *= 0.02
    else:  # a fixed rotation: every norm kept, so only the difference shows it
        h = slots.shape[-1]
        q, _ = torch.linalg.qr(torch.randn(h, h, generator=torch.Generator().manual_seed(3)))
        slots[:, :, EMBED] = slots[:, :, EMBED] @ q
    return slots


def embedding_scale_dumps(base: Healthy, out: Path) -> Variant:
    """The dumps' embedding slot is the target's embedding times 0.02."""
    from tests.support.drafter_lab import lab

    return Variant(base.draft, base.dumps_with(out / "data", lab().ids, _slots("scale")))


def embedding_scale_draft(base: Healthy, out: Path) -> Variant:
    """The draft ships an embed_tokens 8x the target's (trained on inputs of another scale than served)."""
    return Variant(base.draft_with(out / "draft", lambda w: w.update(
        {"embed_tokens.weight": w["embed_tokens.weight"] * 8})))


def target_differs(base: Healthy, out: Path) -> Variant:
    """The dumps' embedding slot is a rotation of the target's: another computation than the target's."""
    from tests.support.drafter_lab import lab

    return Variant(base.draft, base.dumps_with(out / "data", lab().ids, _slots("rotate")))


def target_differs_measured(base: Healthy, out: Path) -> Variant:
    """The rotated dumps with a real capture-check report of them against the lab target's own states
    (remote/capture's matching and differences): its differences name the rotation."""
    from tests.support.drafter_lab import lab

    the_lab = lab()
    data = base.dumps_with(out / "data", the_lab.ids, _slots("rotate"))
    dumps = DumpSet.open(data["speculators"])
    first = dumps.load(0).hidden
    tally = matching.Tally(first.shape[1], the_lab.states.shape[2])
    picked = list(range(8))
    for i in picked:
        tally.add(dumps.load(i).hidden, the_lab.states[i], rows_per_sample=64)
    spec = the_lab.spec
    target = Target(the_lab.target, spec.layers, spec.hidden, spec.vocab, None, {})
    doc = capture_cli.build_report(argparse.Namespace(draft=None), target, Picked(dumps, picked, dumps.slots), tally)
    path = out / "capture-run" / "capture-check.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc, default=float))
    return Variant(base.draft, data, options={"measured": path})
