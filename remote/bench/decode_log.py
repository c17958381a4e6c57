"""SGLang decode log lines: accept length, accept rate, running requests, graph use and throughput.

SGLang writes one line every ``--decode-log-interval`` (default 40) decode steps. The formats, all
read here (sglang-eagle3.md §4.4):

* ≤0.5.2:  ``Decode batch. #running-req: 1, #token: 353, token usage: 0.00, accept len: 2.31,
  cuda graph: True, gen throughput (token/s): 141.20, #queue-req: 0, ``
* 0.5.4:   ``Decode batch [<forward_ct>], #running-req: ...`` and ``accept len: X, accept rate: Y, ``
* 0.5.6+:  ``Decode batch, #running-req: ...`` (``Decode batch [<iter>], ...`` with
  ``SGLANG_LOG_FORWARD_ITERS=1``); the graph label may be ``cuda graph``, ``cpu graph`` or
  ``npu graph``; hybrid models print ``#full token``/``swa token usage`` parts; the newest may
  append ``cap len``/``block accept len`` and MFU estimates after ``#queue-req``.

Each line's accept length covers only its own interval (the counters reset after every line), so
the window's accept length is the mean of the lines weighted by the running requests, which is
what the interval's forward count grows with.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .numbers import finite

_PREFIX = re.compile(r"^\[(?P<time>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?P<ranks>(?: [A-Z]+\d+)*)\] ")
_HEAD = re.compile(r"Decode batch(?P<sep>\.|,| \[(?P<iter>\d+)\],)\s*#running-req:\s*(?P<running>\d+)")
# each field's label and its whole value (up to ", " or a space), so "1,234.50" or "1.5e+03" is seen
# whole and refused, not read as its first digits
_VALUE = r":\s*([^\s,]*(?:,[^\s,]+)*)"
_FIELDS = {
    "tokens": re.compile(r"(?:^|, )#token" + _VALUE),
    "token_usage": re.compile(r"(?:^|, )token usage" + _VALUE),
    "accept_len": re.compile(r"(?:^|, )accept len" + _VALUE),
    "accept_rate": re.compile(r"(?:^|, )accept rate" + _VALUE),
    "gen_throughput": re.compile(r"gen throughput \(token/s\)" + _VALUE),
    "queue_req": re.compile(r"#queue-req" + _VALUE),
}
_INT_FIELDS = ("tokens", "queue_req")
_INT = re.compile(r"\d+")
_FLOAT = re.compile(r"[0-9]+(?:\.[0-9]+)?")      # SGLang writes every float with :.2f
_GRAPH = re.compile(r"(?P<kind>cuda|cpu|npu) graph:\s*(?P<on>True|False)")


@dataclass
class DecodeLine:
    """One parsed decode line; ``lineno`` is 1-based in the text that was parsed."""

    lineno: int
    style: str                   # "0.4" (Decode batch.), "iter" (Decode batch [n],), "0.5.6+" (Decode batch,)
    running_req: int
    time: str | None = None
    ranks: str | None = None     # "TP0", "DP0 TP1", ...
    forward_iter: int | None = None
    tokens: int | None = None
    token_usage: float | None = None
    accept_len: float | None = None
    accept_rate: float | None = None
    graph: str | None = None     # "cuda", "cpu", "npu"
    graph_used: bool | None = None
    gen_throughput: float | None = None
    queue_req: int | None = None


@dataclass
class DecodeLogSummary:
    """The decode lines of a log window and what they add up to."""

    lines: list[DecodeLine] = field(default_factory=list)
    skipped_warmup: int = 0
    truncated: str | None = None                             # the cut last line, when the log ends mid-line
    malformed: list[tuple[int, str]] = field(default_factory=list)

    @property
    def spec_lines(self) -> list[DecodeLine]:
        return [ln for ln in self.lines if ln.accept_len is not None]

    @property
    def accept_length(self) -> float | None:
        """Mean accept length over the window, each line weighted by its running requests."""
        return _weighted([(ln.accept_len, ln.running_req) for ln in self.spec_lines])

    @property
    def accept_rate(self) -> float | None:
        return _weighted([(ln.accept_rate, ln.running_req) for ln in self.spec_lines
                          if ln.accept_rate is not None])

    @property
    def gen_throughput(self) -> float | None:
        """Median aggregate generation throughput (token/s) of the lines."""
        values = sorted(ln.gen_throughput for ln in self.lines if ln.gen_throughput is not None)
        if not values:
            return None
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    @property
    def graph_off_lines(self) -> int:
        """Lines whose batch did not run as a CUDA/CPU graph (eager decode)."""
        return sum(1 for ln in self.lines if ln.graph_used is False)

    def to_dict(self) -> dict[str, Any]:
        return {"lines": len(self.lines), "spec_lines": len(self.spec_lines),
                "skipped_warmup": self.skipped_warmup, "accept_length": self.accept_length,
                "accept_rate": self.accept_rate, "gen_throughput": self.gen_throughput,
                "graph_off_lines": self.graph_off_lines,
                "styles": sorted({ln.style for ln in self.lines}),
                "truncated": self.truncated,
                "malformed": [{"line": n, "text": t[:200]} for n, t in self.malformed],
                "first": asdict(self.lines[0]) if self.lines else None,
                "last": asdict(self.lines[-1]) if self.lines else None}


def _weighted(pairs: list[tuple[float | None, int]]) -> float | None:
    kept = [(v, max(w, 1)) for v, w in pairs if v is not None]
    total = sum(w for _, w in kept)
    return sum(v * w for v, w in kept) / total if total else None


def parse_line(line: str, lineno: int = 0) -> DecodeLine | None:
    """The decode line in ``line``, or None when it is another log line.

    Raises ValueError for a line that starts like a decode line but lacks the fields every
    version writes (``#queue-req``, the last of them, marks a complete line).
    """
    head = _HEAD.search(line)
    if head is None:
        return None
    sep = head.group("sep")
    style = "0.4" if sep == "." else ("0.5.6+" if sep == "," else "iter")
    prefix = _PREFIX.match(line)
    rest = line[head.end():]
    found = {name: rx.search(rest) for name, rx in _FIELDS.items()}
    if found["queue_req"] is None or found["gen_throughput"] is None:
        raise ValueError("decode line without its gen throughput / #queue-req fields")
    graph = _GRAPH.search(rest)
    out = DecodeLine(lineno=lineno, style=style, running_req=int(head.group("running")),
                     time=prefix.group("time") if prefix else None,
                     ranks=prefix.group("ranks").strip() or None if prefix else None,
                     forward_iter=int(head.group("iter")) if head.group("iter") else None,
                     graph=graph.group("kind") if graph else None,
                     graph_used=(graph.group("on") == "True") if graph else None)
    for name, match in found.items():
        if match is None:
            continue
        raw = match.group(1)
        if not (_INT if name in _INT_FIELDS else _FLOAT).fullmatch(raw):
            raise ValueError(f"decode line with {name} {raw!r}, not a number as SGLang writes it")
        setattr(out, name, int(raw) if name in _INT_FIELDS else finite(float(raw)))
    return out


def parse_log(text: str, *, skip_first: int = 0) -> DecodeLogSummary:
    """Every decode line of ``text`` (a server log or the slice written during a benchmark).

    ``skip_first`` drops that many leading decode lines (warm-up). A last line without its
    newline is the log being cut mid-write: it is reported in ``truncated`` and not counted, since
    its numbers may be cut too. Lines that start like decode lines but are incomplete are listed
    in ``malformed``; the rest still count.
    """
    summary = DecodeLogSummary()
    raw_lines = text.split("\n")
    ends_cut = not text.endswith("\n") and raw_lines[-1] != ""
    for index, line in enumerate(raw_lines, start=1):
        last = index == len(raw_lines)
        if last and not line:
            continue
        try:
            parsed = parse_line(line.rstrip("\r"), index)
        except ValueError:
            if last and ends_cut:
                summary.truncated = line
            else:
                summary.malformed.append((index, line))
            continue
        if parsed is None:
            continue
        if last and ends_cut:
            summary.truncated = line
            continue
        if summary.skipped_warmup < skip_first:
            summary.skipped_warmup += 1
            continue
        summary.lines.append(parsed)
    return summary
