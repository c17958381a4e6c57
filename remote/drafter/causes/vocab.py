"""Vocabulary-map causes (failure-modes.md #6), judged by remote/drafter/load/vocabmap.py and, against the
map SpecForge built the dumps with, trainermap.py."""
from __future__ import annotations

from ..data import trainermap
from ..load import vocabmap
from .facts import Facts
from .finding import Finding


def check(facts: Facts) -> list[Finding]:
    found = (vocabmap.findings(facts.ctx.info.vocab_map, facts.res.coverage)
             + trainermap.finding(facts.extra.get(trainermap.TRAINER_MAP)))
    return [Finding.of(f) for f in found]
