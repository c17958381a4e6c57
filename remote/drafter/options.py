"""The inputs of one evaluation (the CLI flags of ``eval``) and their ranges, apart from the
evaluation itself so that the report and the CLI can name them without importing the evaluator."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from ..eagle import acceptlength, engine_rules
from .errors import OptionError

MAX_STEPS = 32
MAX_SEED = 2**63 - 1


@dataclass
class EvalOptions:
    """Inputs of one evaluation (the CLI flags of ``eval``)."""

    ckpt: Path
    data: Path
    verifier: Path | None = None
    config: Path | None = None
    steps: int = 3
    limit: int | None = None
    expected_acc: float | None = None
    expected_accept_length: float | None = None  # a figure from training or a server, as its source defines it
    expected_from: str = "vllm"  # whose definition it follows (remote/eagle/acceptlength.py SOURCES)
    accept_tolerance: float = 0.10  # flag a predicted accept length this fraction below the expected one
    device: str = "auto"
    out: Path = Path(".")
    layout_samples: int = 64
    layout_tolerance: float = 0.01  # a gain below this fraction of the served accept length is no gain
    acc_tolerance: float = 0.05
    batch_tokens: int | None = None
    max_len: int | None = None
    alpha: float = 0.05  # significance level of the paired layout comparison
    min_skill: float = 0.1  # below this share of the way from chance to perfect, a draft is near chance
    engine: str | None = None  # the engine the host serves with (its advice); None: advise for both
    measured: Path | None = None  # a capture-check.json: slot layers measured from the engine
    engine_states: Path | None = None  # a capture check's engine-states/ folder: the draft is scored there too
    engine_version: str | None = None  # that engine's version (engine_rules); None: the newest read is assumed
    serve_algorithm: str | None = None  # the speculative algorithm the host's serve profile sets, if it sets one
    full: bool = False  # every sample, as before the sequential verdict (the complete metrics)
    seed: int = 0  # the sequential verdict's sample order (sequential.order)
    temperatures: tuple[float, ...] = ()  # predict the accept length at these sampling temperatures (temperature.py)

    def validate(self) -> None:
        """Every numeric option in its range (a bad one is an OptionError naming the flag)."""
        _option("--steps", self.steps, f"an integer from 1 to {MAX_STEPS} (the num_steps you serve with; "
                "memory grows with K)", lambda v: _int(v) and 1 <= v <= MAX_STEPS)
        _option("--limit", self.limit, "an integer >= 0, or omit it for every sample",
                lambda v: v is None or (_int(v) and v >= 0))
        _option("--layout-samples", self.layout_samples, "an integer >= 1", lambda v: _int(v) and v >= 1)
        _option("--batch-tokens", self.batch_tokens, "an integer >= 1, or omit it",
                lambda v: v is None or (_int(v) and v >= 1))
        _option("--max-len", self.max_len, "an integer >= 2 (a token and its next token), or omit it",
                lambda v: v is None or (_int(v) and v >= 2))
        _option("--expected-acc", self.expected_acc, "a number in (0, 1], or a percentage in (1, 100]",
                lambda v: v is None or (_num(v) and 0 < v <= 100))
        _option("--expected-accept-length", self.expected_accept_length,
                "a number >= 0 (SpecForge's simulated_acc_len starts at 0; the others at 1)",
                lambda v: v is None or (_num(v) and 0 <= v <= MAX_STEPS + 1))
        _option("--expected-from", self.expected_from, "one of " + ", ".join(acceptlength.SOURCES),
                lambda v: v in acceptlength.SOURCES)
        _option("--accept-tolerance", self.accept_tolerance, "a fraction in [0, 1]", lambda v: _num(v) and 0 <= v <= 1)
        _option("--acc-tolerance", self.acc_tolerance, "a number in [0, 1]", lambda v: _num(v) and 0 <= v <= 1)
        _option("--layout-tolerance", self.layout_tolerance, "a fraction of the accept length in [0, 1]",
                lambda v: _num(v) and 0 <= v <= 1)
        _option("--alpha", self.alpha, "a number in (0, 0.5]", lambda v: _num(v) and 0 < v <= 0.5)
        _option("--min-skill", self.min_skill, "a number in [0, 1)", lambda v: _num(v) and 0 <= v < 1)
        _option("--engine-version", self.engine_version, "a version such as 0.5.13 (digits first)",
                lambda v: v is None or engine_rules.is_version(v))
        _option("--seed", self.seed, f"an integer from 0 to {MAX_SEED}", lambda v: _int(v) and 0 <= v <= MAX_SEED)
        if self.temperatures:
            _option("--temperature", self.temperatures, "numbers from 0 to 100 (0 = greedy), e.g. 0.7 or 0,0.7,1",
                    lambda v: isinstance(v, tuple) and len(v) <= 8 and all(_num(t) and 0 <= t <= 100 for t in v))
        _option("--device", self.device, "auto, cpu or cuda", lambda v: v in ("auto", "cpu", "cuda"))


def _int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _option(flag: str, value: object, expected: str, ok: Callable[[object], bool]) -> None:
    if not ok(value):
        raise OptionError(f"The option {flag} is out of range", field=flag, expected=expected, found=value,
                          fix=f"pass {flag} as {expected}")
