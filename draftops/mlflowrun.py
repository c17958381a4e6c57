"""What one history row becomes in MLflow: pure conversions from a ``RunRecord`` (and its run
folder) to tags, params, metrics and artifact files, so the live logging and ``runs.export`` send
exactly the same run, and the tests can read the mapping without a server.

* run name: draftops' run id; tag ``draftops.run_id`` finds it again (``runs.export`` skips it);
* tags: kind, host, engine and its version, target, draft and its digest, git revision, verdict,
  findings, and every text a row's metrics hold (``result.<name>``);
* params: the settings, flattened (``speculative.num_steps``);
* metrics: every number of the row's metrics; a list of numbers is one metric with one value per
  position (step 1 = the first drafted token, as the drafter report counts them);
* artifacts: the run folder's documents and charts (report.json/md/html, bench-result.json,
  compare.*, doctor.*, PNGs), top level only, regular files only, each bounded.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftops.history import RunRecord, parse_time

RUN_ID_TAG = "draftops.run_id"
TEXT_MAX = 5000                         # MLflow keeps up to 6000 characters of a param, 8000 of a tag
KEY_MAX = 250
ARTIFACT_SUFFIXES = (".json", ".md", ".html", ".png", ".svg")
ARTIFACT_MAX_BYTES = 16 * 1024 * 1024
ARTIFACT_MAX_FILES = 40
_RECORD_TAGS = ("kind", "host", "engine", "engine_version", "target", "draft", "draft_digest", "git_rev", "verdict")
_KEY_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")
#: verdicts that make the MLflow run FAILED (the run's own state, not a finding)
FAILED_VERDICTS = frozenset({"failed", "infrastructure", "stopped", "no-report"})


@dataclass(frozen=True)
class Payload:
    """One run as MLflow takes it."""

    name: str
    start_ms: int
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: list[tuple[str, float, int]] = field(default_factory=list)     # (key, value, step)
    files: list[Path] = field(default_factory=list)
    children: list[str] = field(default_factory=list)     # draftops run ids this run is the parent of

    @property
    def status(self) -> str:
        return "FAILED" if self.tags.get("verdict") in FAILED_VERDICTS else "FINISHED"


def key(text: str) -> str:
    """A metric, param or tag name MLflow accepts (letters, digits, ``_-. /``; at most 250 long)."""
    return _KEY_BAD.sub("_", text)[:KEY_MAX] or "_"


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= TEXT_MAX else text[:TEXT_MAX - 1] + "…"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _flat(prefix: str, value: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(dotted name, leaf) for every leaf of nested mappings (depth-bounded: a row is never deep)."""
    if isinstance(value, Mapping) and depth < 6:
        for k, v in value.items():
            yield from _flat(f"{prefix}.{k}" if prefix else str(k), v, depth + 1)
    elif value is not None:
        yield prefix, value


def _series(value: Any) -> list[float | None] | None:
    """A list whose items are all numbers (or None: not measured at that position)."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    numbers = [_number(v) for v in value]
    if any(n is None and v is not None for n, v in zip(numbers, value, strict=True)) or all(n is None for n in numbers):
        return None
    return numbers


def split_metrics(metrics: Mapping[str, Any]) -> tuple[list[tuple[str, float, int]], dict[str, str]]:
    """A row's metrics as MLflow metrics (numbers; a list per position) and tags (the texts)."""
    numbers: list[tuple[str, float, int]] = []
    texts: dict[str, str] = {}
    for name, value in _flat("", metrics):
        if name.endswith("ids"):              # layer ids name layers: a tag, not a measurement
            texts[key(f"result.{name}")] = _text(", ".join(map(str, value)) if isinstance(value, list) else value)
            continue
        single, series = _number(value), _series(value)
        if single is not None:
            numbers.append((key(name), single, 0))
        elif series is not None:
            numbers += [(key(name), v, step) for step, v in enumerate(series, start=1) if v is not None]
        elif not isinstance(value, (int, float)) or isinstance(value, bool):
            texts[key(f"result.{name}")] = _text(", ".join(map(str, value)) if isinstance(value, list) else value)
    return numbers, texts


def children(rec: RunRecord) -> list[str]:
    """The runs a doctor (``metrics.runs``) or a night (``settings.runs``) made: nested under it."""
    found = rec.metrics.get("runs") if rec.kind == "doctor" else rec.settings.get("runs")
    return [r for r in found if isinstance(r, str) and r != rec.run_id][:200] if isinstance(found, list) else []


def payload(rec: RunRecord, folder: Path | None = None) -> Payload:
    """The MLflow run of ``rec``; ``folder``: where its files are (``runs/<id>/``), if anywhere."""
    numbers, texts = split_metrics(rec.metrics)
    tags = {RUN_ID_TAG: rec.run_id, **texts}
    tags.update({name: _text(getattr(rec, name)) for name in _RECORD_TAGS if getattr(rec, name)})
    findings = rec.metrics.get("findings")
    if isinstance(findings, list):
        tags["findings"] = _text(", ".join(map(str, findings)))
    if rec.git_rev:
        tags["mlflow.source.git.commit"] = rec.git_rev.removesuffix("-dirty")
    params = {key(name): _text(value) for name, value in _flat("", rec.settings)}
    start = int(parse_time(rec.time).timestamp() * 1000)
    return Payload(name=rec.run_id, start_ms=start, tags=tags, params=params, metrics=numbers,
                   files=artifacts(folder) if folder is not None else [], children=children(rec))


def run_folder(root: Path, run_id: str) -> Path | None:
    """``runs/<id>/`` of the project, None for an id that is not one plain folder name."""
    return Path(root) / "runs" / run_id if _SAFE_ID.match(run_id) else None


def artifacts(folder: Path) -> list[Path]:
    """The folder's documents and charts: top level, regular files (no links, FIFOs or devices),
    each at most ARTIFACT_MAX_BYTES, at most ARTIFACT_MAX_FILES of them, in name order."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    found = []
    for entry in entries:
        if not entry.name.endswith(ARTIFACT_SUFFIXES) or entry.name.startswith("."):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_size <= ARTIFACT_MAX_BYTES:
            found.append(Path(entry.path))
        if len(found) >= ARTIFACT_MAX_FILES:
            break
    return found
