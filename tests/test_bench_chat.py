"""The bench side of the chat-template cause and of the accept-length definitions: the clients' chat
flags, the warning and compare finding when a chat-trained draft is benchmarked with raw prompts, and
what every accept length the comparison shows counts."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftops.bench import compare as comparing
from draftops.bench.plan import BenchSettings, Client, Server, chat_advice, plan, sglang_argv, vllm_argv
from draftops.bench.result import DraftInfo
from draftops.errors import BenchError
from draftops.history import History
from remote.eagle import acceptlength
from tests.support import bench_runs as runs

VLLM = Client("vllm", ("/venv/bin/vllm", "bench", "serve"), {"--temperature": True, "--endpoint": True})
SGLANG = Client("sglang", ("/venv/bin/python", "-m", "sglang.bench_serving"),
                {"--temperature": True, "--flush-cache": True, "--apply-chat-template": True}, "0.5.10")
SPEC = Server("http://127.0.0.1:30000", "/models/target", speculative=True)
DIGEST = "sha256:cccc000000000000"


def _pair(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_the_chat_template_flag_sends_each_client_through_the_template() -> None:
    raw, chat = BenchSettings(), BenchSettings(chat_template=True)
    v_raw = vllm_argv(VLLM, SPEC, raw, prompts=4, result_dir="/r", result_file="c.json")
    v_chat = vllm_argv(VLLM, SPEC, chat, prompts=4, result_dir="/r", result_file="c.json")
    assert _pair(v_raw, "--backend") == "vllm" and "--endpoint" not in v_raw
    assert _pair(v_chat, "--backend") == "openai-chat" and _pair(v_chat, "--endpoint") == "/v1/chat/completions"
    s_raw = sglang_argv(SGLANG, SPEC, raw, prompts=4, output_file="/r/o.jsonl", sharegpt_path=None)
    s_chat = sglang_argv(SGLANG, SPEC, chat, prompts=4, output_file="/r/o.jsonl", sharegpt_path=None)
    assert "--apply-chat-template" not in s_raw and "--apply-chat-template" in s_chat


def test_an_sglang_client_without_the_chat_option_refuses_the_flag() -> None:
    old = Client("sglang", ("/p", "-m", "sglang.bench_serving"), {"--flush-cache": True}, "0.4.0")
    with pytest.raises(BenchError, match="--apply-chat-template"):
        plan(old, SPEC, BenchSettings(chat_template=True), "/r")


def test_the_advice_names_the_flag_either_way_and_is_silent_when_they_agree() -> None:
    said = chat_advice(True, False, "sglang", "td-9")
    assert said and "invoke bench --chat-template" in said and "--apply-chat-template" in said and "td-9" in said
    assert "drop --chat-template" in (chat_advice(False, True, "vllm", "td-9") or "")
    assert chat_advice(True, True, "vllm", "td") is None and chat_advice(None, False, "vllm", "td") is None


@pytest.fixture
def chat_trained(tmp_path: Path) -> History:
    hist = History(tmp_path / "runs" / "history.sqlite")
    report = runs.drafter_report(status="MATCH", served=2.6, best=2.6, configured=[1, 4, 7])
    report["data"]["chat_format"] = {"status": "chat", "chat_formatted": True}
    runs.record_prediction(hist, "td-chat", report, DIGEST)
    return hist


def _spec(chat: bool):
    draft = DraftInfo(path="/m/draft", digest=DIGEST, format="speculators", layer_ids=[1, 4, 7],
                      layer_id_convention="vllm")
    return runs.vllm_run("spec", tok_s=[60.0] * 3, accept=2.55, draft=draft, chat_template=chat)


def test_compare_finds_a_chat_trained_draft_benchmarked_with_raw_prompts(chat_trained: History) -> None:
    base = runs.vllm_run("base", tok_s=[90.0] * 3)
    cmp = comparing.compare(base, _spec(False), {"spec": comparing.find_prediction(chat_trained, _spec(False))})
    [f] = [f for f in cmp.findings if f.code == "chat-template"]
    assert f.severity == "warn" and "invoke bench --chat-template" in f.text and "td-chat" in f.text
    ok = comparing.compare(base, _spec(True), {"spec": comparing.find_prediction(chat_trained, _spec(True))})
    assert not [f for f in ok.findings if f.code == "chat-template"]


def test_every_accept_length_of_a_comparison_says_what_it_counts(chat_trained: History) -> None:
    base, spec = runs.vllm_run("base", tok_s=[90.0] * 3), _spec(True)
    cmp = comparing.compare(base, spec, {"spec": comparing.find_prediction(chat_trained, spec)})
    assert spec.accept_length is not None and spec.accept_length.definition == acceptlength.VLLM
    defs = cmp.to_dict()["definitions"]
    assert defs == {"measured (vllm)": acceptlength.VLLM, "predicted": acceptlength.PREDICTED,
                    "greedy rounds on the dumps": acceptlength.WALK}
    sg = runs.sglang_run("sg", tok_s=[50.0] * 3, accept=2.4, draft=spec.draft)
    assert comparing.measured_definition(sg) == acceptlength.SGLANG


def test_specforge_figures_gain_the_bonus_token_and_the_others_are_kept() -> None:
    assert acceptlength.normalize(1.94, "specforge") == pytest.approx(2.94)
    assert [acceptlength.normalize(2.5, s) for s in ("vllm", "speculators", "sglang")] == [2.5, 2.5, 2.5]


def test_an_unflushed_sglang_server_info_figure_is_not_taken_for_the_run(tmp_path: Path) -> None:
    """Without a /flush_cache before the repeat, avg_spec_accept_length counts every request since the
    server started: it is left out (and said so), not compared; after a flush it is the run's."""
    from draftops.bench import runner
    info = {"internal_states": [{"avg_spec_accept_length": 2.9}]}
    (tmp_path / "server-info-rep1.json").write_text(__import__("json").dumps(info))
    problems: list[str] = []
    got = runner._server_accept("sglang", tmp_path, {"argv": ["python", "-m", "sglang.bench_serving"]}, problems,
                                "rep1")
    assert got[0] is None and problems and "cumulative since the server started" in problems[0]
    flushed = runner._server_accept("sglang", tmp_path, {"argv": ["x", "--flush-cache"]}, [], "rep1")
    assert flushed[:2] == (2.9, "server info")
