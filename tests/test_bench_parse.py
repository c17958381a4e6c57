"""Benchmark parsers on the engines' exact formats: SGLang decode logs of every generation, both
clients' result files (with a broken last record), vLLM /metrics windows, SGLang server info, and
the accept-length cross-check."""
from __future__ import annotations

import json

import pytest

from remote.bench import client_output, decode_log, server_metrics
from remote.bench.crosscheck import cross_check
from remote.bench.datasets import read_prompts, to_sharegpt, write_sharegpt
from remote.bench.digest import config_digest, file_digest
from remote.bench.errors import BenchParseError
from tests.support import bench_formats as fmt

STYLES = [("0.4", "0.4"), ("0.5.4", "iter"), ("0.5.6", "0.5.6+"), ("iter", "iter")]


# --- SGLang decode log ---------------------------------------------------------------------------

@pytest.mark.parametrize("style,label", STYLES)
def test_decode_line_every_generation(style: str, label: str) -> None:
    line = fmt.sglang_decode_line(style, running=7, tokens=4096, accept_len=2.87, accept_rate=0.72,
                                  gen_tps=512.5, queue=3, forward_ct=880)
    parsed = decode_log.parse_line(line)
    assert parsed is not None
    assert (parsed.style, parsed.running_req, parsed.tokens) == (label, 7, 4096)
    assert parsed.accept_len == pytest.approx(2.87)
    assert parsed.gen_throughput == pytest.approx(512.5)
    assert parsed.queue_req == 3 and parsed.graph == "cuda" and parsed.graph_used is True
    assert parsed.time == "2026-11-30 10:15:02" and parsed.ranks == "TP0"
    # 0.4.x lines have no accept rate; from 0.5.4 on they do
    assert parsed.accept_rate == (None if style == "0.4" else pytest.approx(0.72))
    assert parsed.forward_iter == (880 if style in ("0.5.4", "iter") else None)


def test_decode_line_variants_cpu_graph_hybrid_ranks_and_tail() -> None:
    line = fmt.sglang_decode_line("0.5.6", graph="cpu", graph_on=False, hybrid=True, ranks="DP1 TP3",
                                  accept_len=1.5, tail=", est. decode TFLOPS/s (per GPU): 12.00")
    parsed = decode_log.parse_line(line)
    assert parsed is not None
    assert (parsed.graph, parsed.graph_used, parsed.ranks) == ("cpu", False, "DP1 TP3")
    assert parsed.accept_len == pytest.approx(1.5)
    assert parsed.tokens is None and parsed.token_usage is None    # hybrid prints "#full token" instead


def test_decode_line_baseline_has_no_accept_len_and_other_lines_are_ignored() -> None:
    baseline = decode_log.parse_line(fmt.sglang_decode_line("0.5.6", accept_len=None))
    assert baseline is not None and baseline.accept_len is None
    for other in fmt.sglang_other_lines():
        assert decode_log.parse_line(other) is None


def test_decode_log_window_weighted_by_running_requests_with_warmup_skipped() -> None:
    lines = fmt.sglang_other_lines() + [
        fmt.sglang_decode_line("0.5.6", running=1, accept_len=1.00),    # warm-up
        fmt.sglang_decode_line("0.5.6", running=8, accept_len=3.00, gen_tps=400),
        fmt.sglang_decode_line("0.5.6", running=2, accept_len=2.00, gen_tps=100),
        fmt.sglang_decode_line("0.5.6", running=6, accept_len=2.50, gen_tps=300),
    ]
    summary = decode_log.parse_log("\n".join(lines) + "\n", skip_first=1)
    assert summary.skipped_warmup == 1 and len(summary.lines) == 3
    assert summary.accept_length == pytest.approx((8 * 3.0 + 2 * 2.0 + 6 * 2.5) / 16)
    assert summary.gen_throughput == pytest.approx(300)
    assert summary.truncated is None and summary.malformed == []


def test_decode_log_mixed_generations_in_one_file() -> None:
    text = "\n".join(fmt.sglang_decode_line(style, accept_len=2.0) for style, _ in STYLES) + "\n"
    summary = decode_log.parse_log(text)
    assert summary.to_dict()["styles"] == ["0.4", "0.5.6+", "iter"]
    assert summary.accept_length == pytest.approx(2.0)


def test_truncated_log_reports_the_cut_line_and_keeps_the_rest() -> None:
    full = [fmt.sglang_decode_line("0.5.6", running=4, accept_len=a) for a in (2.0, 3.0, 2.5)]
    cut_inside_fields = "\n".join(full[:2]) + "\n" + full[2][: full[2].index("accept len") + 14]
    summary = decode_log.parse_log(cut_inside_fields)
    assert len(summary.lines) == 2 and summary.truncated is not None
    assert summary.accept_length == pytest.approx(2.5)
    # a complete-looking last line without its newline may still have a cut number: not counted
    cut_at_end = "\n".join(full)
    summary = decode_log.parse_log(cut_at_end)
    assert len(summary.lines) == 2 and summary.truncated == full[2]


def test_malformed_decode_line_in_the_middle_is_listed_not_fatal() -> None:
    good = fmt.sglang_decode_line("0.4", accept_len=2.0)
    broken = good[: good.index("gen throughput")]
    summary = decode_log.parse_log(f"{good}\n{broken}\n{good}\n")
    assert len(summary.lines) == 2 and [n for n, _ in summary.malformed] == [2]


@pytest.mark.parametrize("field,written", [("gen throughput (token/s): 141.20", "gen throughput (token/s): 1,234.50"),
                                           ("gen throughput (token/s): 141.20", "gen throughput (token/s): 1.5e+03"),
                                           ("accept len: 3.00", "accept len: 3.5e+00"),
                                           ("accept len: 3.00", "accept len: 2,500.00"),
                                           ("accept len: 3.00", "accept len: nan"),
                                           ("accept len: 3.00", "accept len: -3.00")])
def test_a_number_not_written_as_sglang_writes_it_is_malformed_not_cut_short(field: str, written: str) -> None:
    """SGLang writes every number with ``:.2f``; "1,234.50" was read as 1.0, "3.5e+00" as 3.5 by luck,
    and an accept length of "nan" made a speculative line count as a baseline one."""
    good = fmt.sglang_decode_line("0.5.6", running=4, accept_len=3.0)
    assert field in good
    summary = decode_log.parse_log(f"{good}\n{good.replace(field, written)}\n{good}\n")
    assert len(summary.lines) == 2 and [n for n, _ in summary.malformed] == [2]
    assert summary.gen_throughput == pytest.approx(141.2) and summary.accept_length == pytest.approx(3.0)


# --- benchmark clients ---------------------------------------------------------------------------

def _sglang_records(n: int) -> list[dict]:
    return [fmt.sglang_bench_record(ttfts_ms=[20.0 + i, 25.0, 30.0], tpots_ms=[10.0, 11.0 + i, 12.0],
                                    itls_ms=[9.0, 10.0, 40.0], output_tokens=3000 + 100 * i, duration=10.0,
                                    accept_length=2.4 + 0.1 * i,
                                    server_info=fmt.sglang_server_info(accept_length=2.4 + 0.1 * i,
                                                                       steps=1, draft_tokens=2))
            for i in range(n)]


def test_sglang_jsonl_records_normalised() -> None:
    out = client_output.parse_sglang(fmt.jsonl(_sglang_records(2)))
    assert out.problems == [] and len(out.records) == 2
    rec = out.records[1]
    assert rec.output_throughput == pytest.approx(310.0)
    assert rec.median_ttft_ms == pytest.approx(25.0) and rec.p99_tpot_ms == pytest.approx(12.0)
    assert rec.accept_length == pytest.approx(2.5)
    # the effective settings SGLang ran with: 1 step forces 2 draft tokens
    assert rec.server_settings["speculative_num_draft_tokens"] == 2
    assert rec.server_settings["version"] == "0.5.10"


def test_sglang_jsonl_broken_last_record_good_ones_count() -> None:
    text = fmt.jsonl(_sglang_records(3))
    cut = text[: len(text) - 400]           # the client was killed while appending the third run
    out = client_output.parse_sglang(cut)
    assert [r.index for r in out.records] == [0, 1]
    assert len(out.problems) == 1 and out.problems[0]["line"] == 3
    assert "cut off" in out.problems[0]["message"]


def test_sglang_jsonl_bad_middle_line_and_nan_and_null_accept_length() -> None:
    records = _sglang_records(2)
    records[0]["std_ttft_ms"] = float("nan")            # json.dumps writes NaN; still a good record
    records[1]["accept_length"] = None                  # non-SGLang backend / baseline
    text = fmt.jsonl(records[:1]) + "{this is not json\n" + fmt.jsonl(records[1:])
    out = client_output.parse_sglang(text)
    assert len(out.records) == 2 and out.problems[0]["line"] == 2
    assert "still count" in out.problems[0]["message"]
    assert out.records[1].accept_length is None


def test_byte_order_mark_at_the_start_is_not_a_broken_record() -> None:
    out = client_output.parse_sglang("\ufeff" + fmt.jsonl(_sglang_records(1)))
    assert len(out.records) == 1 and out.problems == []


def test_client_error_record_without_results_is_a_problem() -> None:
    out = client_output.parse_sglang(json.dumps({"error": "Initial test run failed"}) + "\n")
    assert out.records == [] and "output_throughput" in out.problems[0]["message"]


def _vllm(spec: dict | None, **kw) -> dict:
    return fmt.vllm_bench_result(ttfts_ms=[100.0, 120.0, 400.0], tpots_ms=[30.0, 31.0, 60.0],
                                 itls_ms=[28.0, 30.0, 90.0], output_tokens=640, duration=8.0, spec=spec, **kw)


def test_vllm_result_json_with_spec_decode_fields() -> None:
    spec = {"drafts": 252, "draft_tokens": 756, "accepted": 310, "per_pos": [150, 100, 60]}
    out = client_output.parse_vllm(json.dumps(_vllm(spec)))
    rec = out.records[0]
    assert rec.output_throughput == pytest.approx(80.0)
    assert rec.accept_length == pytest.approx(1 + 310 / 252)
    assert rec.accept_rate == pytest.approx(310 / 756)              # the file has percent
    assert rec.per_position_acceptance == pytest.approx([150 / 252, 100 / 252, 60 / 252])
    assert rec.median_itl_ms == pytest.approx(30.0) and rec.p99_ttft_ms == pytest.approx(400.0)
    assert rec.failed == 0


def test_vllm_baseline_has_no_accept_length() -> None:
    rec = client_output.parse_vllm(json.dumps(_vllm(None))).records[0]
    assert rec.accept_length is None and rec.num_drafts is None


def test_vllm_appended_results_with_broken_last_record() -> None:
    spec = {"drafts": 100, "draft_tokens": 300, "accepted": 120}
    text = fmt.vllm_appended([_vllm(spec), _vllm(spec, failed=1), _vllm(spec)])
    out = client_output.parse_vllm(text[:-50])
    assert len(out.records) == 2 and out.records[1].failed == 1
    assert out.problems[0]["line"] == 3 and "cut off" in out.problems[0]["message"]


def test_vllm_pretty_printed_file_and_non_object() -> None:
    spec = {"drafts": 10, "draft_tokens": 30, "accepted": 12}
    out = client_output.parse_vllm(json.dumps(_vllm(spec), indent=2) + "\n[1, 2]\n")
    assert len(out.records) == 1 and "list" in out.problems[0]["message"]


def test_unknown_engine_refused() -> None:
    with pytest.raises(ValueError, match="sglang"):
        client_output.parse("tgi", "{}")


# --- server side ---------------------------------------------------------------------------------

def test_vllm_metrics_window_accept_length() -> None:
    before = server_metrics.spec_counters(fmt.vllm_metrics_text(drafts=100, draft_tokens=300, accepted=120,
                                                                 per_pos=[60, 40, 20]))
    after = server_metrics.spec_counters(fmt.vllm_metrics_text(drafts=352, draft_tokens=1056, accepted=430,
                                                                per_pos=[210, 140, 80], engines=2))
    window = server_metrics.accept_length_window(before, after)
    assert window is not None
    assert window.value == pytest.approx(1 + 310 / 252)
    assert window.acceptance_rate == pytest.approx(310 / 756)
    assert window.per_position == pytest.approx([150 / 252, 100 / 252, 60 / 252])
    # the client's own figure over the same window agrees with it
    client = client_output.parse_vllm(json.dumps(_vllm({"drafts": 252, "draft_tokens": 756,
                                                         "accepted": 310}))).records[0]
    assert cross_check(client.accept_length, window.value, a_source="client", b_source="metrics").agree


def test_vllm_metrics_baseline_and_idle_window() -> None:
    assert server_metrics.spec_counters(fmt.vllm_metrics_text(drafts=None)) is None
    assert server_metrics.accept_length_window(None, None) is None
    same = server_metrics.spec_counters(fmt.vllm_metrics_text(drafts=5, draft_tokens=15, accepted=3))
    window = server_metrics.accept_length_window(same, same)
    assert window is not None and window.value is None and "no drafts" in (window.note or "")


def test_vllm_metrics_restart_and_missing_snapshot_are_errors() -> None:
    high = server_metrics.spec_counters(fmt.vllm_metrics_text(drafts=500, draft_tokens=1500, accepted=600))
    low = server_metrics.spec_counters(fmt.vllm_metrics_text(drafts=20, draft_tokens=60, accepted=30))
    with pytest.raises(BenchParseError, match="restarted"):
        server_metrics.accept_length_window(high, low)
    with pytest.raises(BenchParseError, match="before"):
        server_metrics.accept_length_window(None, low)


def test_prometheus_text_edge_cases() -> None:
    text = ('# HELP x y\n'
            'vllm:spec_decode_num_drafts_total{model_name="a \\"quoted\\", {odd} name",engine="0"} 7.0 1700000000\n'
            'vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} 21\n'
            'vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 9e0\n'
            'vllm:gauge_nan NaN\n'
            'garbage line without value {\n')
    page = server_metrics.parse_exposition(text)
    sample = page.samples["vllm:spec_decode_num_drafts_total"][0]
    assert sample.labels["model_name"] == 'a "quoted", {odd} name' and sample.value == 7.0
    assert len(page.problems) == 1 and page.problems[0][0] == 6
    counters = server_metrics.spec_counters(text)
    assert counters is not None and (counters.drafts, counters.draft_tokens, counters.accepted) == (7, 21, 9)


def test_vllm_metrics_partial_counters_refused() -> None:
    text = 'vllm:spec_decode_num_drafts_total{engine="0"} 7.0\nvllm:spec_decode_num_accepted_tokens_total NaN\n'
    with pytest.raises(BenchParseError, match="num_draft_tokens_total"):
        server_metrics.spec_counters(text)


@pytest.mark.parametrize("disaggregated", [False, True])
def test_sglang_server_info_accept_length_and_effective_settings(disaggregated: bool) -> None:
    info = fmt.sglang_server_info(accept_length=2.85, steps=1, topk=1, draft_tokens=2,
                                  disaggregated=disaggregated)
    assert server_metrics.server_info_accept_length(info) == pytest.approx(2.85)
    eff = server_metrics.effective_speculative(info)
    assert (eff["speculative_num_steps"], eff["speculative_num_draft_tokens"]) == (1, 2)


def test_sglang_server_info_without_accept_length() -> None:
    # fewer decode steps than --decode-log-interval since the flush: the key is absent
    assert server_metrics.server_info_accept_length(fmt.sglang_server_info(accept_length=None)) is None
    assert server_metrics.server_info_accept_length(fmt.sglang_server_info(algorithm=None)) is None
    with pytest.raises(BenchParseError, match="server-info"):
        server_metrics.server_info_accept_length(["not", "a", "dict"])


def test_sglang_client_decode_log_and_server_info_cross_check() -> None:
    log = "\n".join(fmt.sglang_decode_line("0.5.6", running=4, accept_len=a) for a in (2.5, 2.7, 2.9)) + "\n"
    from_log = decode_log.parse_log(log).accept_length
    from_info = server_metrics.server_info_accept_length(fmt.sglang_server_info(accept_length=2.7))
    assert cross_check(from_log, from_info, a_source="decode log", b_source="server info").agree


# --- cross-check ---------------------------------------------------------------------------------

def test_cross_check_flags_beyond_ten_percent_either_order() -> None:
    close = cross_check(2.00, 2.19, a_source="client", b_source="server")
    far = cross_check(2.00, 2.40, a_source="client", b_source="server")
    far_reversed = cross_check(2.40, 2.00, a_source="server", b_source="client")
    assert close.agree is True and far.agree is False and far_reversed.agree is False
    assert far.rel_diff == pytest.approx(far_reversed.rel_diff)
    assert "DISAGREE" in far.message


@pytest.mark.parametrize("missing", [None, float("nan"), "2.0", True])
def test_cross_check_missing_side(missing: object) -> None:
    check = cross_check(missing, 2.0, a_source="client", b_source="server")
    assert check.agree is None and "client" in check.message


# --- digest and datasets -------------------------------------------------------------------------

def test_config_digest_ignores_layout_but_not_layer_ids(tmp_path) -> None:
    eagle: dict[str, list[int]] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": eagle}
    a = config_digest(json.dumps(cfg).encode())
    b = config_digest(json.dumps(cfg, indent=4, sort_keys=True).encode())
    eagle["eagle_aux_hidden_state_layer_ids"] = [-1, 1, 3]
    c = config_digest(json.dumps(cfg).encode())
    assert a == b != c and a.startswith("sha256:")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert file_digest(tmp_path) == c
    assert config_digest(b"\xff not json").startswith("sha256:")


def test_prompt_dataset_to_sharegpt(tmp_path) -> None:
    src = tmp_path / "prompts.jsonl"
    src.write_text('{"prompt": "the cat sat"}\n\n{"prompt": "quotes \\" and \\u00e9"}\n')
    dest = tmp_path / "sharegpt.json"
    assert write_sharegpt(src, dest) == 2
    data = json.loads(dest.read_text())
    assert data == to_sharegpt(["the cat sat", 'quotes " and é'])
    assert all(len(row["conversations"]) >= 2 for row in data)


@pytest.mark.parametrize("content,needle", [('{"prompt": "a"}\nnot json\n', ":2:"),
                                            ('{"text": "a"}\n', ":1:"), ("", "no prompts")])
def test_prompt_dataset_errors_name_file_and_line(tmp_path, content: str, needle: str) -> None:
    src = tmp_path / "p.jsonl"
    src.write_text(content)
    with pytest.raises(BenchParseError, match=needle):
        read_prompts(src)


def test_the_runner_converts_the_dataset_in_process_and_reports_a_bad_one(tmp_path) -> None:
    """The plan's `python -m remote.bench.datasets SRC DEST` step runs inside the runner (no second
    python); a good file is converted, a broken one fails the step with its reason in prepare.log."""
    from remote.bench.runner import Runner
    runner = Runner({"server": {}}, tmp_path)
    good, bad, out = tmp_path / "p's.jsonl", tmp_path / "bad.jsonl", tmp_path / "out.json"
    good.write_text(json.dumps({"prompt": "w05 \"q\" $(x)"}) + "\n")
    bad.write_text("{not json\n")
    assert runner.prepare(["/no/such/python", "-m", "remote.bench.datasets", str(good), str(out)]) == (0, "")
    assert json.loads(out.read_text())[0]["conversations"][0]["value"] == "w05 \"q\" $(x)"
    code, why = runner.prepare(["/no/such/python", "-m", "remote.bench.datasets", str(bad), str(tmp_path / "o2.json")])
    assert code == 1 and not (tmp_path / "o2.json").exists()
    assert f"{bad}:1: not JSON" in why            # the reason reaches the user's error, not only prepare.log
    assert "error:" in (tmp_path / "prepare.log").read_text()
    code, _ = runner.prepare(["/no/such/python", "-m", "remote.bench.datasets", str(tmp_path / "gone"), str(out)])
    assert code == 1
    deep = tmp_path / "deep.jsonl"                  # not a parse error but a crash of the parser: still a failed step
    deep.write_text("[" * 100_000 + "\n")
    code, _ = runner.prepare(["/no/such/python", "-m", "remote.bench.datasets", str(deep), str(tmp_path / "o3.json")])
    assert code == 1 and "RecursionError" in (tmp_path / "prepare.log").read_text()


def test_an_integer_too_big_for_a_float_is_not_measured() -> None:
    big = "1" + "0" * 400                                  # json.loads gives an int; float() overflows
    text = '{"completed": 3, "output_throughput": 80.0, "mean_ttft_ms": ' + big + "}\n"
    for engine in ("sglang", "vllm"):
        rec = client_output.parse(engine, text).records[0]
        assert rec.mean_ttft_ms is None and rec.output_throughput == pytest.approx(80.0)


@pytest.mark.parametrize("bad", ['{"completed": 1' + "0" * 5000 + "}",     # past Python's int digit limit
                                 '{"x": ' + "[" * 5000 + "]" * 5000 + "}"])  # past the recursion limit
def test_a_record_json_cannot_hold_is_a_problem_and_the_others_count(bad: str) -> None:
    good = json.dumps({"completed": 3, "output_throughput": 80.0})
    for engine in ("sglang", "vllm"):
        out = client_output.parse(engine, good + "\n" + bad + "\n" + good + "\n")
        assert len(out.records) == 2 and out.problems[0]["line"] == 2


@pytest.mark.parametrize("decode", [[3], ["speculative_algorithm"], [None], []])
def test_sglang_server_info_whose_decode_entry_is_not_an_object_is_read_as_the_top_level(decode: list) -> None:
    raw = {"completed": 3, "output_throughput": 80.0,
           "server_info": {"decode": decode, "speculative_algorithm": "EAGLE3"}}
    rec = client_output.parse_sglang(json.dumps(raw) + "\n").records[0]
    assert rec.server_settings == {"speculative_algorithm": "EAGLE3"}


def test_a_failed_clients_last_words_skip_progress_bars_and_its_own_command_line(tmp_path) -> None:
    from remote.bench.runner import last_words
    log = tmp_path / "client-warmup.log"
    log.write_bytes(b"$ python -m sglang.bench_serving --output-len 99999999999999999999\n"
                    b"  0%|          | 0/5 [00:00<?, ?it/s]\r 20%|##        | 1/5 [00:01<00:04,  1.02s/it]\n"
                    b"Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                    b"OverflowError: Python int too large to convert to C long\n\n"
                    b"100%|##########| 5/5 [00:05<00:00,  1.00it/s]\r\n")
    assert last_words(log) == "OverflowError: Python int too large to convert to C long"
    log.write_bytes(b"$ python -m sglang.bench_serving\n" + b"x" * 1000 + b"\x1b[31m\n")
    said = last_words(log, limit=50)
    assert len(said) == 50 and said.endswith("...") and "\x1b" not in said
    assert last_words(tmp_path / "missing.log") == ""
    log.write_bytes(b"$ python -m sglang.bench_serving --seed 1\n\n")
    assert last_words(log) == ""
