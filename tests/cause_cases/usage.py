"""Usage and training causes (chat-template, undertrained), from the builders in tests/support/usage_causes.py."""
from __future__ import annotations

from pathlib import Path

from tests.support import usage_causes

from .healthy import Healthy, Variant


def chat_template_raw(base: Healthy, out: Path) -> Variant:
    """The target's tokenizer has a chat template with role markers, but the dumps are raw text."""
    return Variant(base.draft, verifier=usage_causes.chat_target(out / "target"))


def undertrained(base: Healthy, out: Path) -> Variant:
    """The same layers, a tenth of the training: per-position accuracy below the field's floors."""
    return Variant(usage_causes.barely_trained(out / "draft"))
