"""Numbers read from engine output: only finite ints and floats count (NaN, inf, bools and strings
are "not measured"; so is an integer too big for a float, which JSON can hold)."""
from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None
