"""Findings as a typed record (remote/drafter/causes/finding.py, issue 37): the checks hand
``Finding`` records to the report, which writes each as the same five-key dict as before; a check
that still returns the dict form is read through ``Finding.of``, once."""
from __future__ import annotations

from typing import Any

import pytest

from remote.drafter import causes
from remote.drafter.causes import Facts, Finding, collect

AS_DICT = {"id": "vocab-map-missing", "severity": "bad", "text": "The draft's vocab has 8 ids.",
           "evidence": {"draft_vocab": 8}, "fix": "Write d2t."}


def facts() -> Facts:
    return Facts(opts=None, ctx=None, res=None, extra={})  # type: ignore[arg-type]  # the checks here read none


def test_a_record_is_the_reports_dict_and_back() -> None:
    record = Finding.of(AS_DICT)
    assert record == Finding(id="vocab-map-missing", severity="bad", text="The draft's vocab has 8 ids.",
                             evidence={"draft_vocab": 8}, fix="Write d2t.")
    assert record.to_dict() == AS_DICT and list(record.to_dict()) == ["id", "severity", "text", "evidence", "fix"]
    assert Finding.of(record) is record


@pytest.mark.parametrize("bad", [{**AS_DICT, "severity": "fatal"}, {**AS_DICT, "fix": ""},
                                 {k: v for k, v in AS_DICT.items() if k != "text"}])
def test_a_finding_without_its_parts_names_itself(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="vocab-map-missing"):
        Finding.of(bad)


def test_a_dict_with_a_key_the_report_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\['severty'\]"):
        Finding.of({**AS_DICT, "severty": "bad"})


def test_collect_reads_records_and_dicts_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    warn = Finding(id="chat-template", severity="warn", text="Twice BOS.", evidence={}, fix="Drop one.")
    residual = {"id": "undertrained", "severity": "warn", "text": "Low.", "evidence": {}, "fix": "Train more."}

    def record_check(_: Facts) -> list[Finding]:
        return [warn]

    def dict_check(_: Facts) -> list[dict[str, Any]]:   # a check written before the record
        return [AS_DICT, residual]

    monkeypatch.setattr(causes, "CHECKS", (record_check, dict_check))
    found = collect(facts())
    assert found == [Finding.of(AS_DICT), warn]          # bad first; the residual cause dropped
    assert all(isinstance(f, Finding) for f in found)
    monkeypatch.setattr(causes, "CHECKS", (lambda _: [residual],))
    assert [f.id for f in collect(facts())] == ["undertrained"]   # alone, it is reported
