"""Display at the edge (issue 8): the task layer's show functions take data and a Console; these
render to ``Console(file=StringIO())`` and read the text, with host-supplied text that looks like
rich markup (it must be shown as it is, never interpreted)."""
from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from rich.console import Console

from draftops.cli.history import show_history
from draftops.cli.serve import show_findings, show_readback, show_servers
from draftops.cli.sglang import show_patch
from draftops.console import show_sync
from draftops.history import RunRecord
from draftops.serve import checks, lifecycle
from draftops.sync import SyncReport


def render(show: Callable[..., None], *args: Any, width: int = 200) -> str:
    out = io.StringIO()
    show(*args, Console(file=out, width=width, color_system=None))
    return out.getvalue()


def test_patch_table_shows_states_changed_files_checks_and_notes_as_text():
    report = {"sglang_version": "0.5.5", "action": "apply", "changed": ["srt/models/llama.py"],
              "files": [{"file": "srt/models/llama.py", "model": "llama", "state": "patched", "detail": "[red]x"},
                        {"file": "srt/models/qwen2.py", "model": "qwen2", "state": "needs-patch", "detail": ""}],
              "checks": [{"file": "srt/models/llama.py", "check": "compiles", "ok": False, "detail": "line [1]"}],
              "notes": ["see [link]"]}
    text = render(show_patch, report, "box")
    assert "SGLang 0.5.5 on box: apply" in text
    assert "patched (changed)" in text and "needs-patch" in text and "qwen2.py" in text
    assert "[red]x" in text and "FAIL srt/models/llama.py: compiles line [1]" in text and "see [link]" in text


def test_readback_marks_what_differs_and_keeps_notes():
    readback = lifecycle.Readback(rows=[("num_steps", 3, 3, False), ("topk [x]", 4, 1, True)],
                                  notes=["SGLang changed [b]draft tokens[/b]"], effective={})
    text = render(show_readback, readback, "SGLang")
    assert "SGLang: asked for vs effective" in text
    assert "the server runs with other values than asked for: topk [x]" in text
    assert "note: SGLang changed [b]draft tokens[/b]" in text
    assert "runs with other values" not in render(show_readback, lifecycle.Readback(
        rows=[("num_steps", 3, 3, False)], notes=[], effective={}), "SGLang")


def test_findings_show_notes_and_warnings():
    text = render(show_findings, checks.Findings(notes=["demo [draft]"], warnings=["ids [9] wrong"]))
    assert "· demo [draft]" in text and "warning: ids [9] wrong" in text


def test_servers_table_or_the_line_that_there_are_none():
    server = lifecycle.Server(port=8000, run_id="20261130-serve-vllm-8000-abcd", engine="vllm", profile="default",
                              target="/m/[target]", draft=None, listen="127.0.0.1", state="running", pid=4242,
                              started=None, uptime_s=3725.0, effective={"num_speculative_tokens": 3, "_x": 1})
    text = render(show_servers, [server], "box")
    assert "servers on box" in text and "8000" in text and "1h02m" in text and "/m/[target]" in text
    assert "(baseline)" in text and "num_speculative_tokens=3" in text and "_x" not in text
    assert render(show_servers, [], "gpu [1]").strip() == "no draftops servers on gpu [1]"


def test_sync_report_lines():
    report = SyncReport(host="box", upload=["remote/[a].py"], delete=["old.py"], unchanged=3, bytes_changed=2048,
                        bytes_sent=1000, seconds=0.25, dry_run=True)
    text = render(show_sync, report)
    assert "sync box: would send 1 file(s) (2.0 KiB changed, 1000 B on the wire), deleted 1, 3 unchanged" in text
    assert "+ remote/[a].py" in text and "- old.py" in text


def test_history_table_and_its_empty_line():
    rec = RunRecord(run_id="r-1", kind="test-drafter", host="box", time="2026-11-30T10:00:00Z", verdict="MISMATCH",
                    draft="/d/[draft]")
    text = render(show_history, [rec], "local run history", "kind test-drafter", width=300)
    assert "local run history: kind test-drafter" in text and "r-1" in text and "MISMATCH" in text
    assert "/d/[draft]" in text
    assert "no runs recorded match" in render(show_history, [], "h", "host x")
    assert "no runs recorded yet" in render(show_history, [], "h", "")
