"""What test-drafter and serve say about a verdict, read as a user reads it at 80 columns (issue 22,
item 7): the panel states the diagnosis and its figures, the fix states the ids and then the one
command (whole on its line, so it pastes), and serve's warning points at the run and that command;
no paragraph is said twice. Real reports of the generated demo, rendered by the real show functions."""
from __future__ import annotations

import io
import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from draftops import cmdline
from draftops.cli.drafter import show_result
from draftops.cli.serve import show_findings
from draftops.documents import parse
from draftops.documents.drafter_report import DrafterReport
from draftops.documents.serve_inspect import ServeInspect
from draftops.inventory import HostSpec, ServeProfile
from draftops.serve import checks, profiles, verdicts
from draftops.serve.request import Request, demo_dir, resolve
from remote.serve.configs import inspect
from tests.support.draft_flats import flat_copy
from tests.support.drafter_support import demo, run_eval

RUN_ID = "20261201-093015-test-drafter-7f3a"
RUN = 8  # words: a run of this many words said twice is a repeated paragraph, not a shared phrase
BORDERS = re.compile(r"[│╭╮╰╯─]")


def read(report: dict[str, Any]) -> DrafterReport:
    """The evaluator's report as the task reads it: through the JSON file format, into its model."""
    return parse(DrafterReport, json.loads(json.dumps(report)), "report.json")


def render(show: Callable[..., None], *args: Any) -> str:
    out = io.StringIO()
    show(*args, Console(file=out, width=80, color_system=None))
    return out.getvalue()


def repeats(text: str) -> set[tuple[str, ...]]:
    """The runs of RUN words that occur more than once, the panel's borders and line breaks ignored."""
    words = BORDERS.sub(" ", text).split()
    seen: set[tuple[str, ...]] = set()
    twice: set[tuple[str, ...]] = set()
    for i in range(len(words) - RUN + 1):
        run = tuple(words[i:i + RUN])
        (twice if run in seen else seen).add(run)
    return twice


def shared(a: str, b: str) -> set[tuple[str, ...]]:
    return repeats(a + "\n\x00\n" + b) - repeats(a) - repeats(b)


def verdict_and_after(text: str) -> str:
    """From the verdict panel to the end: what the user acts on (the tables above hold the data)."""
    return text[text.index("─ verdict ─"):]


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host's state folder with the demo, and the test-drafter report on its draft in runs/."""
    root = tmp_path_factory.mktemp("host")
    shutil.copytree(demo().root, root / "state" / "demo")
    run_eval(root / "runs" / RUN_ID, ckpt=root / "state" / "demo" / demo().draft.relative_to(demo().root),
             data=demo().data, verifier=demo().target, engine="vllm", limit=64)
    return root / "state"


CASES = {"mismatch, a vLLM host, a training accuracy given": {"engine": "vllm", "expected_acc": 0.85},
         "mismatch, both engines": {"engine": None},
         # SGLang reads a flat config's ids only: the fixed draft it serves as trained is its flat copy
         "match, an SGLang host": {"engine": "sglang", "fixed": "flat"}}


@pytest.mark.parametrize("case", list(CASES))
def test_the_verdict_panel_and_the_fix_say_each_paragraph_once(case: str, tmp_path: Path) -> None:
    kw = dict(CASES[case])
    if kw.pop("fixed", None):
        done = flat_copy(demo().root / "draft_fixed", tmp_path / "flat")        # invoke draft-flat's tool
        assert done.returncode == 0, done.stdout + done.stderr
        kw["ckpt"] = tmp_path / "flat"
    report = run_eval(tmp_path / "out", limit=64, **kw)
    text = verdict_and_after(render(show_result, read(report), str(tmp_path / "out" / "report.json"), RUN_ID, "demo"))
    assert not repeats(text), (repeats(text), text)
    words = " ".join(BORDERS.sub(" ", text).split())
    verdict, accept = report["verdict"], report["predicted_accept_length"]
    # each figure once: the report's numbers, told in the panel's lines and not again in prose
    shown = accept["best"] if accept["best"] is not None else accept["served"]
    figures = [f"{shown:.2f}"]
    if verdict["comparison"]:
        c = verdict["comparison"]
        figures += [f"{c['gain']:+.3f}", f"{c['gain_ci'][0]:+.3f}", f"{c['sign_test_p']:.2g}"]
    assert {f: words.count(f) for f in figures} == {f: 1 for f in figures}, text
    if verdict["fix_layer_ids"]:    # the ids to write once in the fix line (the diagnosis names the trained
        # layout, the same list), in the host engine's convention only where the host is known
        said = words[words.index("fix:"):]
        keys = {"vllm": ["fix_layer_ids_vllm"], "sglang": ["fix_layer_ids"]}.get(
            kw.get("engine") or "", ["fix_layer_ids_vllm", "fix_layer_ids"])
        assert {str(verdict[k]): said.count(str(verdict[k])) for k in keys} == {str(verdict[k]): 1 for k in keys}
    # the diagnosis once, and it holds no figure or advice of its own
    assert verdict["diagnosis"] and verdict["message"].startswith(verdict["diagnosis"].split(" Training")[0])
    assert " ".join(verdict["diagnosis"].split()) in words
    assert "sign test" not in verdict["diagnosis"] and "Put " not in verdict["diagnosis"]
    if verdict["status"] == "MISMATCH":
        assert "fix:" in words
        assert "  " + cmdline.command("draft-config", "--ckpt", "demo", "--from-report", RUN_ID) in text.splitlines()
    else:
        assert "Nothing to fix" in words and "invoke draft-config" not in words


def test_the_fix_command_is_one_unbroken_line_at_80_columns(state: Path) -> None:
    """However long the checkpoint path, the command is on one line, quoted, whole (it is pasted)."""
    report = verdicts_report(state)
    ckpt = "/data/checkpoints/team drafts/eagle3-llama-3.1-8b-instruct-sharegpt-ultrachat-run-0042"
    lines = render(show_result, read(report), "/very/long/runs/" + RUN_ID + "/report.json", RUN_ID, ckpt).splitlines()
    command = "  " + cmdline.command("draft-config", "--ckpt", ckpt, "--from-report", RUN_ID)
    assert len(command) > 80 and command in lines
    assert f"report: /very/long/runs/{RUN_ID}/report.json" in lines


def verdicts_report(state: Path) -> dict[str, Any]:
    return json.loads((state.parent / "runs" / RUN_ID / "report.json").read_text())


def serve_findings(state: Path, draft: str) -> checks.Findings:
    """`invoke serve --draft DRAFT` on a vLLM profile: the pre-start findings, the facts read from the
    real demo files and the verdict from the real report in runs/."""
    spec = HostSpec(name="box", address="box.example", engine="vllm",
                    serve={"p": ServeProfile(python=sys.executable, max_running_requests=8)})
    target = None if draft == "demo" else str(state / "demo" / "target")
    plan = resolve(Request(draft=draft, target=target), profiles.resolve(spec),
                   demo_dir(str(state)))
    folder = state / "demo" / "draft"
    answer = inspect("vllm", Path(plan.launch.target), folder, sglang_status=False)
    facts = parse(ServeInspect, answer, "the inspect answer")
    facts.engine.importable = True            # as the profile's engine python would see it
    found = checks.Findings()
    checks.fact_checks(plan, facts, verdicts.latest(state.parent / "runs", str(folder)), found)
    return found


def test_serve_demo_warns_in_a_few_lines_with_the_run_and_the_command_whole(state: Path) -> None:
    report = verdicts_report(state)
    found = serve_findings(state, "demo")
    [warning] = [w for w in found.warnings if "MISMATCH" in w]
    text = render(show_findings, checks.Findings(warnings=[warning]))
    lines = text.splitlines()
    command = "  " + cmdline.command("draft-config", "--ckpt", "demo", "--from-report", RUN_ID)
    assert lines[-1] == command and len(lines) <= 4, text
    accept = report["predicted_accept_length"]
    assert RUN_ID in lines[0] + lines[1] and f"{accept['served']:.2f}" in text and f"{accept['best']:.2f}" in text
    panel = verdict_and_after(render(show_result, read(report), "runs/x/report.json", RUN_ID, "demo"))
    panel = panel[:panel.index("report: ")]                            # the command is meant to be in both
    assert not shared(text, panel), shared(text, panel)                # nothing the panel already said


def test_serve_refusing_another_draft_gives_the_diagnosis_once_not_the_report(state: Path) -> None:
    """A draft other than the demo is refused: the refusal is all the user sees, so it carries the
    diagnosis, the figures in a few words and the command, not the report's whole message."""
    report = verdicts_report(state)
    found = serve_findings(state, str(state / "demo" / "draft"))
    [refusal] = [r for r in found.refusals if "MISMATCH" in r]
    assert refusal.count(report["verdict"]["diagnosis"]) == 1
    assert "sign test" not in refusal and "Put \"" not in refusal and "--force" in refusal
    assert f"--from-report {RUN_ID}" in refusal and f"{report['predicted_accept_length']['best']:.2f}" in refusal


def test_host_text_in_a_report_reaches_the_terminal_cleaned(state: Path) -> None:
    """The report is the host's text (its verdict's sentences, a slot's role, a layout's tags): escape
    sequences and control characters in it never reach the terminal (issue 22, probe A)."""
    esc = "\x1b]0;owned\x07\x1b[2J\x1b[31m"
    report = json.loads(json.dumps(verdicts_report(state)))
    report["verdict"]["message"] += esc
    report["verdict"]["diagnosis"] += esc
    report["verdict"]["advice"] = (report["verdict"].get("advice") or "") + esc
    text = render(show_result, read(report), "/runs/" + RUN_ID + "/report.json", RUN_ID, "demo")
    assert "\x1b" not in text and "\x07" not in text, repr(text)
