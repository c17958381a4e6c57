"""How the draft's data was formatted against how its target is used (failure-modes.md #8): the
``chat-template`` finding, judged by remote/drafter/data/chattemplate.py on what the metrics pass loaded."""
from __future__ import annotations

from ..data import chattemplate
from ..measures import CHAT_TEMPLATE
from .facts import Facts
from .finding import Finding


def check(facts: Facts) -> list[Finding]:
    return [Finding.of(f) for f in chattemplate.finding(facts.measured(CHAT_TEMPLATE))]
