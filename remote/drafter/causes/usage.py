"""How the draft's data was formatted against how its target is used (failure-modes.md #8): the
``chat-template`` finding, judged by remote/drafter/data/chattemplate.py on what the metrics pass loaded."""
from __future__ import annotations

from typing import Any

from ..data import chattemplate
from .facts import Facts


def check(facts: Facts) -> list[dict[str, Any]]:
    return chattemplate.finding(facts.extra.get("chat-template"))
