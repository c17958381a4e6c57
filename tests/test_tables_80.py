"""Tables at 80 columns and piped (issue 35, item 2): `invoke runs --local` gave 465 lines for 16 runs
with headers cut to `k…`, and `serve.status` dropped target, draft and settings off the edge. At 80
columns the tables show fewer columns whole (id, kind, verdict, headline), wider terminals more; a
run id is never broken; serve.status shows every server's target, draft and settings. The show
functions render to a Console of a given width, as a pipe (80 columns, no terminal) gets one; the
task itself is run piped too."""
from __future__ import annotations

import re
from io import StringIO

import pytest
from rich.console import Console

from draftops.cli.history import show_history
from draftops.cli.serve import show_servers
from draftops.history import RunRecord
from draftops.serve.lifecycle import Server
from tests.support.tasks import invoke

KINDS = ["test-drafter", "serve", "bench", "compare"]


def records(n: int = 16) -> list[RunRecord]:
    out = []
    for i in range(n):
        kind = KINDS[i % 4]
        metrics = {"test-drafter": {"predicted_served": 1.5, "predicted_best": 3.6, "steps": 3,
                                    "fix_layer_ids": [-1, 0, 2], "fix_layer_ids_vllm": [0, 1, 3],
                                    "serving_convention": "vllm"},
                   "serve": {"ready_s": 64.2, "effective": {"num_speculative_tokens": 3, "max_num_seqs": 8}},
                   "bench": {"output_throughput": 61.25, "accept_length": 2.16},
                   "compare": {"speedup": 0.67}}[kind]
        out.append(RunRecord(run_id=f"20261206-0{i:02d}105-{kind}-a{i:03d}", kind=kind, host="local",
                             time=f"2026-12-06T05:{i:02d}:00Z", engine="vllm", engine_version="0.32.0+cpu",
                             target="/home/someone/.draftops/state/demo/target",
                             draft="/home/someone/.draftops/state/demo/draft", draft_digest="sha256:0123456789abcdef",
                             settings={"a": "base", "b": "spec"}, metrics=metrics,
                             verdict={"test-drafter": "MISMATCH", "serve": "succeeded", "bench": "succeeded",
                                      "compare": "wiring-suspect"}[kind]))
    return out


def render(show, *args, width: int) -> str:
    buffer = StringIO()
    show(*args, Console(file=buffer, width=width, highlight=False, color_system=None))
    return buffer.getvalue()


@pytest.mark.parametrize("width", [60, 80, 100, 160, 240])
def test_the_history_fits_and_keeps_ids_and_headers_whole(width):
    recs = records()
    text = render(show_history, recs, "local run history (/a/rather/long/project/path/runs/history.sqlite)", "",
                  width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines[1:]) <= width, text       # the title's path may run on, whole
    assert "…" not in "".join(line for line in lines if "┃" in line), text      # no header cut to `k…`
    for rec in recs:
        assert rec.run_id in text, text                                          # every id whole, on one line
    assert len(lines) <= 16 * 4 + 12, text                                        # not 465 lines
    assert "/a/rather/long/project/path/runs/history.sqlite" in text              # the title's path whole
    if width >= 80:
        header = next(line for line in lines if "┃" in line)
        assert [c.strip() for c in header.strip("┃").split("┃")][:2] == ["id", "kind"]
        assert "headline" in header
        assert "MISMATCH" in text and "tok/s" in text                          # the verdict, in its column or not


def test_wider_terminals_show_more_columns():
    def header(width: int) -> list[str]:
        text = render(show_history, records(), "t", "", width=width)
        line = next(line for line in text.splitlines() if "┃" in line)
        return [c.strip() for c in line.strip("┃").split("┃")]
    narrow, wide = header(80), header(320)
    assert set(narrow) < set(wide)
    assert wide == ["id", "kind", "host", "time (UTC)", "engine", "target", "draft", "verdict", "headline"]


def servers() -> list[Server]:
    return [Server(port=8000 + i, engine="vllm", run_id=f"20261206-05{i}105-serve-draft-b{i:03d}", pid=4242 + i,
                   profile="default", listen="127.0.0.1", started="2026-12-06T04:00:00Z",
                   target="/home/someone/.draftops/state/demo/target",
                   draft="/home/someone/.draftops/state/demo/draft" if i else None,
                   effective={"num_speculative_tokens": 3, "max_num_seqs": 8, "method": "eagle3"} if i else {},
                   state="alive", uptime_s=3725.0) for i in range(2)]


@pytest.mark.parametrize("width", [60, 80, 100])
def test_serve_status_shows_target_draft_and_settings_at_any_width(width):
    text = render(show_servers, servers(), "local", width=width)
    assert max(len(line) for line in text.splitlines()) <= width or "/" in text, text
    flat = text.replace("\n", "")
    for server in servers():
        assert server.run_id in text and str(server.port) in text
        assert server.target in flat
    assert "/home/someone/.draftops/state/demo/draft" in text and "num_speculative_tokens=3" in flat
    assert "(baseline)" in text
    assert not re.search(r"\w…", text), text


def test_serve_status_is_a_table_where_it_fits():
    text = render(show_servers, servers(), "local", width=240)
    assert "┃ port" in text and "draft" in text and "effective settings" in text


def test_runs_local_piped_is_readable(tmp_path, make_project, no_inventory_env):
    from draftops import history
    from tests.conftest import REPO

    root = make_project()
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    hist = history.for_project(root)
    for rec in records():
        hist.insert(rec)
    done = invoke(root, "runs", "--local", "--all", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # the table fits the width; prose lines piped are never wrapped (cmdline: ids and commands whole)
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 80 and len(lines) < 16 * 4 + 12, done.stdout
    assert all(rec.run_id in done.stdout for rec in records())


def comparison():
    from draftops.bench import compare as comparing
    from draftops.bench.result import DraftInfo
    from tests.support import bench_runs

    draft = DraftInfo(path="/home/someone/.draftops/state/demo/draft", digest="sha256:bbbb000000000000",
                      format="speculators", layer_ids=[0, 1, 3], layer_id_convention="vllm")
    a = bench_runs.vllm_run("20261206-051549-bench-baseline-2112", tok_s=[90.0, 91.0, 89.0])
    b = bench_runs.vllm_run("20261206-052549-bench-speculative-2113", tok_s=[60.0, 61.0, 59.0], accept=2.2,
                            draft=draft)
    return comparing.compare(a, b, {}, 0.1, {})


@pytest.mark.parametrize("width", [80, 240])
def test_bench_compare_never_cuts_a_run_id_or_a_path(width):
    from draftops.bench import render as compare_render

    cmp = comparison()
    text = render(compare_render.show, cmp, width=width)
    table = [line for line in text.splitlines() if line.startswith(("┃", "│"))]
    assert table and not any("…" in line for line in table), text
    assert max(len(line) for line in table) <= width
    first = text.splitlines()[0]
    assert cmp.a.run_id in first and cmp.b.run_id in first                  # whole, on the line above
    run_row = [line for line in table if line.startswith("│ run ")]
    assert (run_row and cmp.b.run_id in run_row[0]) if width == 240 else not run_row
