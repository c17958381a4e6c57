"""What the server itself says about speculative decoding.

* vLLM ``/metrics`` (Prometheus text): ``vllm:spec_decode_num_drafts_total``,
  ``vllm:spec_decode_num_draft_tokens_total``, ``vllm:spec_decode_num_accepted_tokens_total`` and
  ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="k"}``, one series per engine /
  model label set (summed here). Counters are cumulative, so a benchmark's accept length is
  ``1 + Δaccepted / Δdrafts`` between a snapshot before and one after (vllm-cpu.md).
* SGLang ``/get_server_info`` (``/server_info`` from 0.5.10): the effective ``speculative_*``
  settings at the top level and ``internal_states[0]["avg_spec_accept_length"]``, cumulative since
  the last ``/flush_cache`` and updated only at decode-log time; a disaggregated server nests it
  under ``decode[0]`` (sglang-eagle3.md §4.3).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import BenchParseError
from .numbers import finite

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}
SPEC_PREFIX = "vllm:spec_decode_"


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Exposition:
    """A parsed /metrics page: samples by name, and the lines that could not be read."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    problems: list[tuple[int, str]] = field(default_factory=list)
    #: (line, metric name, label text) of each sample whose name and label set came before: one series
    #: is one sample per page (Prometheus rejects the page), so it is never counted twice
    duplicates: list[tuple[int, str, str]] = field(default_factory=list)

    def total(self, name: str) -> float | None:
        """Sum of a metric over its label sets; None when the page does not have it."""
        series = self.samples.get(name)
        return None if not series else sum(s.value for s in series)


def _labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """Parse ``{a="x",b="y\\"z"}`` starting at ``line[pos] == "{"``; returns (labels, end)."""
    labels: dict[str, str] = {}
    pos += 1
    while True:
        while pos < len(line) and line[pos] in " ,":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL_NAME.match(line, pos)
        if not match:
            raise ValueError("bad label")
        pos = match.end()
        chars: list[str] = []
        while True:
            if pos >= len(line):
                raise ValueError("unterminated label value")
            ch = line[pos]
            if ch == "\\" and pos + 1 < len(line):
                chars.append(_UNESCAPE.get(line[pos + 1], "\\" + line[pos + 1]))
                pos += 2
                continue
            if ch == '"':
                pos += 1
                break
            chars.append(ch)
            pos += 1
        labels[match.group(1)] = "".join(chars)


def parse_exposition(text: str) -> Exposition:
    """Prometheus text format 0.0.4: ``name{labels} value [timestamp]``; ``#`` lines are comments. A
    series (name and label set, in any label order) repeated on the page keeps its first sample; the
    repeat goes to ``duplicates``."""
    out = Exposition()
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            match = _NAME.match(line)
            if not match:
                raise ValueError("no metric name")
            pos = match.end()
            labels: dict[str, str] = {}
            if pos < len(line) and line[pos] == "{":
                labels, pos = _labels(line, pos)
            parts = line[pos:].split()
            if not parts or len(parts) > 2:
                raise ValueError("expected a value and an optional timestamp")
            value = float(parts[0])       # accepts NaN, +Inf, -Inf as Prometheus writes them
        except ValueError as exc:
            out.problems.append((lineno, f"{exc}: {raw[:120]}"))
            continue
        series = (match.group(0), frozenset(labels.items()))
        if series in seen:
            out.duplicates.append((lineno, match.group(0), ",".join(f"{k}={v!r}" for k, v in sorted(labels.items()))))
            continue
        seen.add(series)
        out.samples.setdefault(match.group(0), []).append(Sample(match.group(0), labels, value))
    return out


def _refuse_duplicates(page: Exposition) -> None:
    """Repeated spec-decode series make the counters ambiguous (which one is the server's?): refused."""
    repeated = [d for d in page.duplicates if d[1].startswith(SPEC_PREFIX)]
    if repeated:
        lineno, name, labels = repeated[0]
        raise BenchParseError(f"the /metrics snapshot has the series {name}{{{labels}}} more than once (line "
                              f"{lineno}, {len(repeated)} repeat(s) in all); a series is one sample per page, so "
                              "the spec-decode counters are ambiguous and this window is not counted (take the "
                              "snapshot again; more than one server answering on the port would do this).")


@dataclass
class SpecCounters:
    """vLLM's cumulative spec-decode counters at one moment."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: dict[int, float] = field(default_factory=dict)


def spec_counters(text: str) -> SpecCounters | None:
    """The spec-decode counters of a /metrics page; None when it has none (no draft served)."""
    page = parse_exposition(text)
    _refuse_duplicates(page)
    drafts = page.total(SPEC_PREFIX + "num_drafts_total")
    draft_tokens = page.total(SPEC_PREFIX + "num_draft_tokens_total")
    accepted = page.total(SPEC_PREFIX + "num_accepted_tokens_total")
    if drafts is None and draft_tokens is None and accepted is None:
        return None
    values = {"num_drafts_total": drafts, "num_draft_tokens_total": draft_tokens,
              "num_accepted_tokens_total": accepted}
    bad = [SPEC_PREFIX + k for k, v in values.items() if v is None or not math.isfinite(v)]
    if bad:
        raise BenchParseError(f"the /metrics snapshot has spec-decode counters but not {', '.join(bad)} as a "
                              "finite number; it may be cut off or from a vLLM whose metric names differ "
                              "(take the snapshot again, or compare its names with vllm-cpu.md).")
    per_position: dict[int, float] = {}
    for sample in page.samples.get(SPEC_PREFIX + "num_accepted_tokens_per_pos_total", []):
        try:
            pos = int(sample.labels.get("position", ""))
        except ValueError:
            continue
        per_position[pos] = per_position.get(pos, 0.0) + sample.value
    return SpecCounters(drafts or 0.0, draft_tokens or 0.0, accepted or 0.0, per_position)


@dataclass
class WindowAccept:
    """Accept length over the window between two /metrics snapshots."""

    value: float | None
    drafts: float
    draft_tokens: float
    accepted: float
    acceptance_rate: float | None           # accepted / draft tokens, 0..1
    per_position: list[float]               # accepted at position k / drafts
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def accept_length_window(before: SpecCounters | None, after: SpecCounters | None) -> WindowAccept | None:
    """``1 + Δaccepted / Δdrafts`` between two snapshots (None when neither has counters)."""
    if before is None and after is None:
        return None
    if before is None or after is None:
        which = "before" if before is None else "after"
        raise BenchParseError(f"the /metrics snapshot taken {which} the benchmark has no spec-decode counters "
                              "while the other has: the server was replaced in between (serve again, then bench).")
    d_drafts = after.drafts - before.drafts
    d_tokens = after.draft_tokens - before.draft_tokens
    d_accepted = after.accepted - before.accepted
    if d_drafts < 0 or d_tokens < 0 or d_accepted < 0:
        raise BenchParseError("the spec-decode counters went down between the /metrics snapshots: the server "
                              "restarted during the benchmark, so this window measures nothing (bench again).")
    if d_drafts == 0:
        return WindowAccept(None, 0.0, d_tokens, d_accepted, None, [],
                            note="no drafts between the snapshots: no request was decoded speculatively")
    positions = sorted(set(before.per_position) | set(after.per_position))
    per_pos = [(after.per_position.get(p, 0.0) - before.per_position.get(p, 0.0)) / d_drafts for p in positions]
    return WindowAccept(1 + d_accepted / d_drafts, d_drafts, d_tokens, d_accepted,
                        d_accepted / d_tokens if d_tokens else None, per_pos)


def _node(info: dict[str, Any]) -> dict[str, Any]:
    decode = info.get("decode")
    if isinstance(decode, list) and decode and isinstance(decode[0], dict):
        return decode[0]
    return info


def server_info_accept_length(info: Any) -> float | None:
    """``internal_states[0].avg_spec_accept_length`` of SGLang's server info; None when absent
    (baseline, or fewer than ``--decode-log-interval`` decode steps since the last flush)."""
    if not isinstance(info, dict):
        raise BenchParseError("the server-info snapshot is not a JSON object; /get_server_info answered "
                              "something else (an error page?): take it again while the server is up.")
    states = _node(info).get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = finite(states[0].get("avg_spec_accept_length"))
        return value if value and value > 0 else None
    return None


def effective_speculative(info: dict[str, Any]) -> dict[str, Any]:
    """The speculative settings SGLang actually runs with (after its own adjustments)."""
    node = _node(info)
    keys = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
            "speculative_num_draft_tokens", "speculative_draft_model_path", "max_running_requests",
            "decode_log_interval", "disable_cuda_graph", "version")
    return {key: node.get(key, info.get(key)) for key in keys if key in node or key in info}
