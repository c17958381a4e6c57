"""Where the test suite keeps what it builds or downloads between runs (the demo, the drafter lab's
trained weights, SGLang wheels): ``$DRAFTOPS_TEST_CACHE``, or ``~/.cache/draftops``."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("DRAFTOPS_TEST_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "draftops"
