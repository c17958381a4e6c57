"""What the server says about itself, read by `invoke bench`: a /metrics page repeating a series is not
summed twice, and a /get_server_info with values of the wrong types still gives a written result."""
from __future__ import annotations

import json

import pytest

from draftops.history import History
from remote.bench import server_metrics
from remote.bench.errors import BenchParseError
from tests.support import bench_formats as fmt
from tests.support.bench_folders import bench_a_faulty_double, bench_folder
from tests.support.serving import ok, profile, project, serve_draft  # noqa: F401
from tests.support.tasks import invoke

DRAFTS = 'vllm:spec_decode_num_drafts_total{model_name="/m/target",engine="0"} 100.0'


def page(**counts: int) -> str:
    return fmt.vllm_metrics_text(drafts=100, draft_tokens=300, accepted=200, per_pos=[60, 40, 20], **counts)


@pytest.mark.parametrize("repeat", [DRAFTS, 'vllm:spec_decode_num_drafts_total{engine="0",model_name="/m/target"} 100'])
def test_a_repeated_series_is_refused_not_summed(repeat: str) -> None:
    text = page()
    assert DRAFTS in text
    with pytest.raises(BenchParseError, match="vllm:spec_decode_num_drafts_total.* more than once"):
        server_metrics.spec_counters(text.replace(DRAFTS, DRAFTS + "\n" + repeat))


def test_a_repeated_series_keeps_its_first_sample_and_other_label_sets_still_add_up() -> None:
    parsed = server_metrics.parse_exposition('m{a="1"} 2\nm{a="1"} 5\nm{a="2"} 3\n')
    assert parsed.total("m") == 5.0 and [d[0] for d in parsed.duplicates] == [2]
    two = server_metrics.spec_counters(page(engines=2))
    assert two is not None and two.drafts == 100.0           # two engines, the counts split: two series, summed


@pytest.mark.ssh
def test_wrong_typed_server_info_still_writes_the_result_and_its_history_row(project, tmp_path):  # noqa: F811
    root, run = bench_a_faulty_double(project, tmp_path, {"DRAFTOPS_SGLANG_DOUBLE_SERVER_INFO": "wrong-types"},
                                      prompts=3, repeats=1, output_len=8)
    assert "Traceback" not in run.stdout + run.stderr and "ValidationError" not in run.stdout + run.stderr
    folder = bench_folder(root, run.stdout)
    res = json.loads((folder / "bench-result.json").read_text())
    assert res["speculative"]["num_steps"] is None and res["speculative"]["topk"] is None
    flat = " ".join(res["warnings"])
    assert "/get_server_info speculative_num_steps is str 'three', not a number" in flat
    assert "speculative_eagle_topk is list [1]" in flat
    row = History(root / "runs" / "history.sqlite").get(folder.name)
    assert row is not None and row.kind == "bench"
    again = invoke(root, "bench.collect", folder.name)          # collect builds it the same way
    assert "Traceback" not in again.stdout + again.stderr and "ValidationError" not in again.stdout + again.stderr
    ok(invoke(root, "serve.stop", "--all"))
