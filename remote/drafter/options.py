"""The inputs of one evaluation (the CLI flags of ``eval``) and their ranges, apart from the
evaluation itself so that the report and the CLI can name them without importing the evaluator.

The flags are declared once, in :data:`FLAGS`: ``python -m remote.drafter eval`` builds its parser
from them (:meth:`EvalOptions.add_arguments`, :meth:`EvalOptions.from_argv`) and the laptop builds
the argument list it starts the evaluator with from the same table (:meth:`EvalOptions.to_argv`),
so a new option is one field and one line here. Stdlib only: the laptop imports this module."""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from ..eagle import acceptlength, engine_rules
from .errors import OptionError

MAX_STEPS = 32
MAX_SEED = 2**63 - 1
#: a KV cache dtype as engines name them (fp8, fp8_e4m3, bfloat16, auto): nothing else reaches a finding's text
KV_DTYPE = re.compile(r"[A-Za-z0-9_]{1,32}")


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
    served_context: int | None = None  # the serve profile's context_length (None: the target's max_position_embeddings)
    serve_kv_cache_dtype: str | None = None  # the profile's --kv-cache-dtype (the target's KV cache), if it sets one
    serve_draft_kv_cache_dtype: str | None = None  # its speculative config's kv_cache_dtype (the draft's), if set
    full: bool = False  # every sample, as before the sequential verdict (the complete metrics)
    seed: int = 0  # the sequential verdict's sample order (sequential.order)
    temperatures: tuple[float, ...] = ()  # predict the accept length at these sampling temperatures (temperature.py)
    demo: bool = False  # the generated demo: ckpt and data (verifier, expected_acc) are filled in on the host
    demo_dir: Path | None = None  # the demo's folder there (default $DRAFTOPS_DEMO_DIR or ./demo)

    @classmethod
    def of_demo(cls, **given: Any) -> EvalOptions:
        """Options for the generated demo, whose paths only the host knows (no --ckpt, no --data)."""
        return cls(ckpt=Path(), data=Path(), demo=True, **given)

    def to_argv(self) -> list[str]:
        """The ``eval`` flags that give these options (a field at its default is left out; the demo's
        paths are the host's to fill in)."""
        argv: list[str] = []
        defaults = _defaults()
        for flag in FLAGS:
            value = getattr(self, flag.field)
            if (self.demo and flag.field in ("ckpt", "data")) or value is None or value == defaults.get(flag.field):
                continue
            text = flag.text(value)   # a separate word (the job's shell expands a RUN_DIR there), unless a flag
            argv += [flag.name] if flag.kind is bool else [f"{flag.name}={text}"] if text.startswith("-") \
                else [flag.name, text]
        return argv

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Declare every ``eval`` flag on ``parser`` (its defaults those of the fields)."""
        defaults = _defaults()
        for flag in FLAGS:
            default = None if flag.field in ("ckpt", "data") else defaults.get(flag.field)
            if flag.kind is bool:
                parser.add_argument(flag.name, dest=flag.field, action="store_true", help=flag.help)
            else:
                parser.add_argument(flag.name, dest=flag.field, type=flag.kind, choices=flag.choices, default=default,
                                    help=flag.help)

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> EvalOptions:
        """The options an ``eval`` argument list gives (an unknown flag or a bad value: argparse's
        usage error, exit 2)."""
        parser = argparse.ArgumentParser(prog="python -m remote.drafter eval")
        cls.add_arguments(parser)
        return cls.from_namespace(parser.parse_args(list(argv)), parser)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, parser: argparse.ArgumentParser) -> EvalOptions:
        """The options of parsed flags; neither --ckpt nor --data: the demo; one of them: a usage error."""
        given = {flag.field: getattr(args, flag.field) for flag in FLAGS}
        if given["ckpt"] is None and given["data"] is None:
            return cls.of_demo(**{k: v for k, v in given.items() if k not in ("ckpt", "data")})
        if given["ckpt"] is None or given["data"] is None:
            parser.error("eval: give both --ckpt and --data, or neither (to run the demo)")
        return cls(**given)

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
        _option("--served-context", self.served_context, "an integer >= 1 (the serve profile's context_length), "
                "or omit it", lambda v: v is None or (_int(v) and 1 <= v <= 1 << 40))
        for flag, value in (("--serve-kv-cache-dtype", self.serve_kv_cache_dtype),
                            ("--serve-draft-kv-cache-dtype", self.serve_draft_kv_cache_dtype)):
            _option(flag, value, "a KV cache dtype name such as fp8, fp8_e5m2, auto or bfloat16",
                    lambda v: v is None or (isinstance(v, str) and KV_DTYPE.fullmatch(v) is not None))
        _option("--seed", self.seed, f"an integer from 0 to {MAX_SEED}", lambda v: _int(v) and 0 <= v <= MAX_SEED)
        if self.temperatures:
            _option("--temperature", self.temperatures, "numbers from 0 to 100 (0 = greedy), e.g. 0.7 or 0,0.7,1",
                    lambda v: isinstance(v, tuple) and len(v) <= 8 and all(_num(t) and 0 <= t <= 100 for t in v))
        _option("--device", self.device, "auto, cpu or cuda", lambda v: v in ("auto", "cpu", "cuda"))


@dataclass(frozen=True)
class Flag:
    """One ``eval`` flag: the field it sets, its type (bool: a switch; a callable: parses the word) and
    its help; ``spelled``: the flag's name where it is not the field's."""

    field: str
    kind: Callable[[str], Any]
    help: str
    choices: tuple[str, ...] | None = None
    spelled: str | None = None

    @property
    def name(self) -> str:
        return self.spelled or "--" + self.field.replace("_", "-")

    @staticmethod
    def text(value: object) -> str:
        """The word that gives ``value`` back through ``kind`` (a tuple of numbers: comma-separated)."""
        return ",".join(f"{v:g}" for v in value) if isinstance(value, tuple) else str(value)


def temperatures(text: str) -> tuple[float, ...]:
    """``--temperature 0.7`` or ``0,0.7,1``: the values in order, each once (ranges: EvalOptions.validate)."""
    try:
        values = [float(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--temperature takes numbers such as 0.7 or 0.7,1, got {text!r}") from None
    return tuple(dict.fromkeys(values))


FLAGS = (
    Flag("ckpt", Path, "draft checkpoint folder (config.json + safetensors)"),
    Flag("data", Path, "dump folder or file (*.safetensors or legacy *.pt)"),
    Flag("verifier", Path, "target model folder (HF layout) for verifier targets"),
    Flag("config", Path, "use this config file instead of <ckpt>/config.json"),
    Flag("steps", int, "TTT steps = num_steps you serve with (3)"),
    Flag("limit", int, "evaluate at most N samples"),
    Flag("expected_acc", float, "training-reported step-0 accuracy (0-1 or percent) to compare with"),
    Flag("expected_accept_length", float,
         "an accept length reported by training or a server, compared with the prediction"),
    Flag("expected_from", str, "whose definition --expected-accept-length follows (specforge: simulated_acc_len, "
         "no +1)", tuple(acceptlength.SOURCES)),
    Flag("accept_tolerance", float, "flag a prediction this fraction below --expected-accept-length (0.10)"),
    Flag("device", str, "auto, cpu or cuda", ("auto", "cpu", "cuda")),
    Flag("engine", str, "the engine the host serves with: the verdict's advice is for it (default: both)",
         ("sglang", "vllm")),
    Flag("engine_version", str, "that engine's version (e.g. 0.5.13): the findings apply its rules (default: the "
         "newest version read, said in each finding)"),
    Flag("serve_algorithm", str, "the speculative algorithm the host's serve profile launches with, when it sets "
         "one (e.g. EAGLE): an EAGLE-3 draft under EAGLE is a finding"),
    Flag("served_context", int, "the context length the host serves (its serve profile's context_length): a draft "
         "trained on fewer positions is a finding (default: the target's max_position_embeddings)"),
    Flag("serve_kv_cache_dtype", str, "the KV cache dtype the host's serve profile launches the target with "
         "(--kv-cache-dtype), when it sets one: an FP8 cache the draft inherits is a finding"),
    Flag("serve_draft_kv_cache_dtype", str, "the draft's own KV cache dtype the profile's speculative config sets "
         "(kv_cache_dtype), if any"),
    Flag("measured", Path, "capture-check.json: slot layers measured from the engine"),
    Flag("engine_states", Path, "a capture check's engine-states/ folder (the engine's own states at every layer "
         "boundary for some of these dumps' samples): the draft is scored there too"),
    Flag("out", Path, "folder for report.json (cwd)"),
    Flag("demo_dir", Path, "demo cache (default $DRAFTOPS_DEMO_DIR or ./demo)"),
    Flag("layout_samples", int, "samples for the layout scan (64)"),
    Flag("layout_tolerance", float, "the best layout counts as the same as the served one when it raises the "
         "predicted accept length by less than this fraction (0.01 = 1%%)"),
    Flag("alpha", float, "significance level of the paired served-vs-best comparison (0.05)"),
    Flag("min_skill", float, "UNKNOWN when no layout closes this share of the gap between always guessing the "
         "most frequent target and perfect (0.1)"),
    Flag("acc_tolerance", float, "flag --expected-acc gaps larger than this (0.05)"),
    Flag("full", bool, "score every sample (the complete metrics) instead of stopping once the verdict is decided "
         "(the sequential verdict, the default)"),
    Flag("seed", int, "seed of the random order the sequential verdict scores samples in (0)"),
    Flag("temperatures", temperatures, "also predict the accept length at these sampling temperatures "
         "(comma-separated, e.g. 0.7 or 0,0.7,1; needs --verifier and a final-layer slot)", spelled="--temperature"),
    Flag("batch_tokens", int, "padded tokens per forward (8192 CPU, 16384 GPU)"),
    Flag("max_len", int, "truncate samples to this many tokens"),
)


def _defaults() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(EvalOptions) if f.default is not dataclasses.MISSING}


def _int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _option(flag: str, value: object, expected: str, ok: Callable[[object], bool]) -> None:
    if not ok(value):
        raise OptionError(f"The option {flag} is out of range", field=flag, expected=expected, found=value,
                          fix=f"pass {flag} as {expected}")
