"""The evaluation's measurements for the cause checks are declared once (remote/drafter/measures.py,
issue 37): their keys are spelled there only, so a new one needs no edit of evaluation.py or
report.py beyond its producer, and report.json's data section shows the same values as before."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from remote.drafter import measures
from remote.drafter.causes import Facts
from remote.drafter.measures import CHAT_TEMPLATE, MEASURES, Measure, in_report

DRAFTER = Path(__file__).resolve().parent.parent / "remote" / "drafter"


def test_the_report_shows_the_measurements_it_always_showed() -> None:
    extra = {"slot_statistics": {"slots": []}, "vocab_mapping": {"differs": 3}, "chat-template": {"status": "raw"},
             "capture_check": {"status": "differs"}, "config-key-ignored": {"engine": "vllm"}}
    assert in_report(extra) == {"slot_statistics": {"slots": []}, "vocab_mapping": {"differs": 3},
                                "chat_format": {"status": "raw"}}
    assert in_report({}) == {"slot_statistics": None, "vocab_mapping": None, "chat_format": None}


def test_a_new_measurement_reaches_the_report_from_its_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measures, "MEASURES", (*MEASURES, Measure("accuracy-by-position", report="by_position")))
    assert in_report({"accuracy-by-position": [0.5]})["by_position"] == [0.5]


def test_a_check_reads_a_measurement_by_its_declaration() -> None:
    facts = Facts(opts=None, ctx=None, res=None, extra={"chat-template": {"status": "chat"}})  # type: ignore[arg-type]
    assert facts.measured(CHAT_TEMPLATE) == {"status": "chat"}
    assert facts.measured(Measure("not-made")) is None


@pytest.mark.parametrize("module", ["evaluation.py", "report.py", "causes/usage.py"])
def test_no_measurement_key_is_spelled_outside_its_declaration(module: str) -> None:
    names = {m.key for m in MEASURES} | {m.report for m in MEASURES if m.report}
    tree = ast.parse((DRAFTER / module).read_text())
    spelled = sorted({node.value for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names})
    assert spelled == [], f"{module} spells {spelled}: use remote/drafter/measures.py"
