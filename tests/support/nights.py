"""A night built from its parts, for the report tests."""
from __future__ import annotations

from pathlib import Path

from draftops import history
from draftops.nightly import detect
from draftops.nightly.night import HostNightReport, Night
from draftops.nightly.playbook import Playbook, Step
from draftops.nightly.results import Finding
from draftops.nightly.runner import FAILED, OK, HostOutcome, StepResult

EVIL = "<script>alert(1)</script> <img src=x onerror=alert(2)> a | b *c* [l](javascript:x) \x1b]52;c;eA==\x07"


def build_night(tmp_path: Path) -> Night:
    book = Playbook(name="smoke", hosts=["box"], steps=[Step(name="drafter", task="test-drafter")],
                    setup="setup " + EVIL)
    runs = tmp_path / "runs"
    (runs / "pulled-bench-1").mkdir(parents=True)                 # a bench run comes home; a serve run does not
    reason = "error: " + EVIL + "\n# a heading\n| x | y |"
    box = HostOutcome("box", steps=[StepResult("drafter", "test-drafter", OK),
                                    StepResult("bench", "bench", FAILED, failure="step", reason=reason)],
                      metrics={"speculative.tok_s": 10.0}, run_ids=["pulled-bench-1", "serve-on-the-host-2"],
                      facts={"gpu": "GPU\n# pwned " + EVIL, "engine": "vllm \x1b[2J0.32"},
                      findings=[Finding("cmp-1", "bad", "wiring-suspect", "text\n## from " + EVIL)])
    verdicts = detect.judge_all([{"speculative.tok_s": 10.0}], threshold=lambda m: 5.0,
                                lower_better=lambda m: False, window=7, min_nights=3)
    folder = runs / "nightly-2026-12-01"
    (folder / "box").mkdir(parents=True)
    (folder / "box" / "01-drafter.log").write_text("$ invoke test-drafter\n[exit 0]\n")
    return Night("nightly-2026-12-01", folder, book, Path("playbooks/odd\n# name.yaml"), history.now_iso(), "r1",
                 [HostNightReport(box, verdicts, [])])
