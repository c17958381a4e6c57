"""The engine interface: launch commands, readiness probes, settings read back, log-line parsers, on the
engines' real formats (SGLang: sglang-eagle3.md §4; vLLM 0.32: its log format strings and metric names)."""
from __future__ import annotations

import json
from typing import Any

from draftops.serve import engines
from draftops.serve.engines import Launch

LAUNCH = Launch(python="/env/bin/python", target="/m/target", draft="/m/draft dir", port=30000,
                listen="127.0.0.1", tp=2, max_running_requests=32, mem_fraction=0.8, context_length=4096,
                steps=3, topk=1, draft_tokens=4, extra_args=("--disable-cuda-graph",), sglang_ids=(-1, 1, 3))


def fetcher(answers: dict[str, tuple[int | None, str]]) -> Any:
    return lambda path, body: answers.get(path, (404, ""))


def test_sglang_command_environment_and_probe():
    sgl = engines.get("sglang")
    argv = sgl.command(LAUNCH)
    assert argv[:3] == ["/env/bin/python", "-m", "sglang.launch_server"]
    joined = " ".join(argv)
    for part in ("--tp-size 2", "--max-running-requests 32", "--mem-fraction-static 0.8", "--context-length 4096",
                 "--speculative-algorithm EAGLE3", "--speculative-num-steps 3", "--speculative-eagle-topk 1",
                 "--speculative-num-draft-tokens 4"):
        assert part in joined
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "/m/draft dir"
    assert argv[-1] == "--disable-cuda-graph"
    assert sgl.environment(LAUNCH) == {"DRAFTOPS_EAGLE3_LAYER_IDS": "-1,1,3"}
    assert [p.path for p in sgl.readiness(LAUNCH)] == ["/health_generate"]
    auto = sgl.command(Launch(**{**LAUNCH.__dict__, "steps": None, "topk": None, "draft_tokens": None}))
    assert "--speculative-num-steps" not in auto and "--speculative-algorithm" in auto
    baseline = sgl.command(Launch(**{**LAUNCH.__dict__, "draft": None}))
    assert not any(a.startswith("--speculative") for a in baseline)


def test_sglang_effective_settings_from_server_info():
    info = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/m/draft dir",
            "speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2,
            "max_running_requests": 48, "tp_size": 1, "mem_fraction_static": 0.88, "context_length": None,
            "internal_states": [{"avg_spec_accept_length": 1.9}], "version": "0.5.10"}
    got = engines.get("sglang").effective(fetcher({"/get_server_info": (200, json.dumps(info))}), "")
    assert (got["num_steps"], got["topk"], got["num_draft_tokens"], got["max_running_requests"]) == (1, 1, 2, 48)
    assert engines.get("sglang").effective(fetcher({}), "")["num_draft_tokens"] is None


def test_sglang_decode_log_lines_of_every_version():
    parse = engines.get("sglang").parse_log_line
    old = ("[2025-01-01 10:00:00 TP0] Decode batch. #running-req: 1, #token: 353, token usage: 0.00, "
           "accept len: 2.31, cuda graph: True, gen throughput (token/s): 141.20, #queue-req: 0, ")
    new = ("[2026-11-30 11:21:41 TP0] Decode batch [120], #running-req: 4, #token: 7, token usage: 0.00, "
           "accept len: 3.25, accept rate: 0.81, cpu graph: True, gen throughput (token/s): 264.26, #queue-req: 0, ")
    assert parse(old) == {"running_req": 1, "accept_len": 2.31, "gen_throughput": 141.2}
    assert parse(new) == {"running_req": 4, "accept_len": 3.25, "accept_rate": 0.81, "gen_throughput": 264.26}
    assert parse("[2026-11-30 11:21:40] The server is fired up and ready to roll!") is None


def test_vllm_command_probes_and_settings_from_log_and_metrics():
    vllm = engines.get("vllm")
    argv = vllm.command(LAUNCH)
    assert argv[:5] == ["/env/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "/m/target"]
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "eagle3", "model": "/m/draft dir", "num_speculative_tokens": 3}
    assert "--max-num-seqs" in argv and "--max-model-len" in argv
    assert vllm.environment(LAUNCH)["HF_HUB_OFFLINE"] == "1"
    probes = vllm.readiness(LAUNCH)
    assert [p.path for p in probes] == ["/health", "/v1/completions"] and probes[1].body["max_tokens"] == 1
    head = ("INFO 11-30 12:00:01 [api_server.py:1] non-default args: {'model_tag': '/m/target', 'host': "
            "'127.0.0.1', 'port': 8000, 'max_num_seqs': 32, 'speculative_config': {'method': 'eagle3'}}\n"
            "INFO 11-30 12:00:09 [core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: "
            "model='/m/target', speculative_config=SpeculativeConfig(method='eagle3', model='/m/draft dir', "
            "num_spec_tokens=3), tokenizer='/m/target', skip_tokenizer_init=False, dtype=torch.float32, "
            "max_seq_len=1024, download_dir=None, load_format=auto, tensor_parallel_size=1, "
            "pipeline_parallel_size=1\n")
    metrics = "\n".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{k}"}} 0.0'
                        for k in range(3))
    got = vllm.effective(fetcher({"/metrics": (200, metrics)}), head)
    assert got["method"] == "eagle3" and got["draft"] == "/m/draft dir" and got["num_speculative_tokens"] == 3
    assert (got["max_num_seqs"], got["tp"], got["max_model_len"], got["_metrics_positions"]) == (32, 1, 1024, 3)
    from_metrics = vllm.effective(fetcher({"/metrics": (200, metrics)}), "")
    assert from_metrics["num_speculative_tokens"] == 3 and from_metrics["method"] is None


def test_vllm_periodic_log_lines():
    parse = engines.get("vllm").parse_log_line
    spec = ("INFO 11-30 12:01:00 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 2.24, "
            "Accepted throughput: 10.50 tokens/s, Drafted throughput: 28.10 tokens/s, Accepted: 282 tokens, "
            "Drafted: 756 tokens, Per-position acceptance rate: 0.610, 0.380, 0.130, Avg Draft acceptance rate: 37.3%")
    assert parse(spec) == {"accept_len": 2.24, "accepted": 282, "drafted": 756, "accept_rate_pct": 37.3}
    engine_line = ("INFO 11-30 12:01:00 [loggers.py:281] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
                   "Avg generation throughput: 12.3 tokens/s, Running: 1 reqs, Waiting: 0 reqs")
    assert parse(engine_line) == {"gen_throughput": 12.3}
    assert parse("INFO Started server process [42]") is None
