"""The measurements the evaluation makes for the cause checks, declared once: the key each has in
``Results.extra`` / ``Facts.extra`` and, where the report shows it, its name in report.json's
``data`` section.

A new measurement is one line here and its producer's ``extra[NEW.key] = ...``; the check reads
``facts.measured(NEW)``, and ``report.py`` writes every measurement with a ``report`` name through
``in_report`` without an edit of its own. Stdlib only: the producers in every sub-package import it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Measure:
    """One measurement: ``key`` in ``Results.extra``; ``report`` its ``data.<name>`` in report.json
    (None: only the cause checks read it)."""

    key: str
    report: str | None = None


#: each dump slot's statistics against the target's own states (scoring/slotstats.py)
SLOT_STATISTICS = Measure("slot_statistics", report="slot_statistics")
#: SpecForge's vocabulary map next to the dumps against the draft's d2t (data/trainermap.py)
VOCAB_MAPPING = Measure("vocab_mapping", report="vocab_mapping")
#: the dumps' token sequences against the target's chat template (data/chattemplate.py)
CHAT_TEMPLATE = Measure("chat-template", report="chat_format")
#: the summary of a capture-check report that cannot be used (data/measured.py; causes/states.py)
CAPTURE_CHECK = Measure("capture_check")
#: the draft scored as an engine that ignores a config key runs it (causes/config_keys.py)
CONFIG_KEY_IGNORED = Measure("config-key-ignored")

#: every measurement, in the order report.json's data section lists those it shows
MEASURES: tuple[Measure, ...] = (SLOT_STATISTICS, VOCAB_MAPPING, CHAT_TEMPLATE, CAPTURE_CHECK, CONFIG_KEY_IGNORED)


def in_report(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The measurements report.json's data section shows, each under its report name (None when not made)."""
    return {m.report: extra.get(m.key) for m in MEASURES if m.report is not None}
