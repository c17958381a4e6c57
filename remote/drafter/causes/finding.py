"""One named cause of low acceptance as the report states it: a typed record from the cause checks
to report.json, where it becomes the same dict the report has always held (docs/drafter.md § Findings).

``id`` is stable (tests, serve's refusals and nightly comparisons key on it); ``severity`` is ``bad``
(serving is pointless: ``invoke serve`` refuses unless forced) or ``warn``; ``text`` says what is wrong
in this draft in one sentence; ``evidence`` holds the numbers; ``fix`` a command or what to change in
training. Helpers below the checks (load/vocabmap.py, data/chattemplate.py, data/trainermap.py) still
return the dict form, and so may a check: ``Finding.of`` reads either, once.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

SEVERITIES = ("bad", "warn")
FIELDS = ("id", "severity", "text", "evidence", "fix")


@dataclass(frozen=True)
class Finding:
    """A cause's finding; ``to_dict`` is its report.json form."""

    id: str
    severity: str
    text: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES or not (self.id and self.text and self.fix):
            raise ValueError(f"finding {self.id!r}: severity must be one of {SEVERITIES} (not {self.severity!r}) "
                             "and id, text and fix must be given; fix the check that made it")

    @classmethod
    def of(cls, found: Finding | Mapping[str, Any]) -> Finding:
        """A finding from a check's record or from the dict form (helpers and checks written before the
        record); a dict with other keys than the five is a check's bug, named here."""
        if isinstance(found, Finding):
            return found
        extra = sorted(set(found) - set(FIELDS))
        if extra:
            raise ValueError(f"finding {found.get('id')!r} has keys {extra} besides {list(FIELDS)}; "
                             "fix the check that made it")
        return cls(id=found.get("id", ""), severity=found.get("severity", ""), text=found.get("text", ""),
                   evidence=found.get("evidence", {}), fix=found.get("fix", ""))

    def to_dict(self) -> dict[str, Any]:
        """The report.json form: the five keys, in the order the report has always written them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
