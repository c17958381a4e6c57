"""The rules and measurements behind four findings (issue 38 items 4, 5, 8, 9), apart from their cause
cases (tests/cause_cases/): which engine versions replace a draft's own embed_tokens/lm_head or give its
KV cache the target's FP8 dtype, what a serve profile's extra_args say about KV dtypes, the off-policy
test's error rate on text the target sampled itself, and engine states that are not rotated."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch

from draftops.serve.host_engine import HostEngine
from draftops.serve.launch_algorithm import kv_dtypes
from remote.drafter import EvalOptions, evaluate
from remote.drafter.errors import OptionError
from remote.drafter.model.headshare import EMBED, HEAD, rules
from remote.drafter.model.kvcache import prepare
from remote.drafter.scoring.policy import PolicyTally
from remote.drafter.scoring.score import VerifierHead


@pytest.mark.parametrize(("args", "expected"), [
    (["--kv-cache-dtype", "fp8"], ("fp8", None)),
    (["--kv-cache-dtype=fp8_e5m2", "--speculative-config", '{"kv_cache_dtype": "bfloat16"}'], ("fp8_e5m2", "bfloat16")),
    (["--kv-cache-dtype", "fp8", "--speculative_config.kv_cache_dtype", "auto"], ("fp8", "auto")),
    (["--kv-cache-dtype", "fp8\x1b[31m"], (None, None)),          # escape sequences never reach the evaluator
    (["--speculative-config", "{not json"], (None, None)),
    ([], (None, None)),
])
def test_a_vllm_profiles_extra_args_give_the_kv_dtypes_test_drafter_passes_on(args, expected) -> None:
    assert kv_dtypes("vllm", args) == expected
    assert kv_dtypes("sglang", args) == (None, None)


def test_the_kv_dtypes_become_the_evaluators_flags() -> None:
    assert HostEngine("vllm", "0.27.0", None, kv_cache_dtype="fp8", draft_kv_cache_dtype="bfloat16").eval_args() == [
        "--engine", "vllm", "--engine-version", "0.27.0", "--serve-kv-cache-dtype", "fp8",
        "--serve-draft-kv-cache-dtype", "bfloat16"]
    assert HostEngine("vllm", None, None).eval_args() == ["--engine", "vllm"]


@pytest.mark.parametrize(("engine", "version", "target", "draft", "inherits"), [
    ("vllm", "0.27.0", "fp8", None, True),
    ("vllm", "0.27.0", "fp8", "bfloat16", True),      # no field of the draft's own before 0.28: ignored
    ("vllm", "0.32.0", "fp8", "bfloat16", False),
    ("vllm", "0.32.0", "fp8", "auto", False),
    ("vllm", "0.32.0", "fp8_e5m2", None, True),
    ("vllm", "0.32.0", "auto", None, False),
    ("vllm", "0.32.0", None, None, False),
    ("sglang", "0.5.23", "fp8", None, False),          # no SGLang rule read
])
def test_the_draft_inherits_an_fp8_kv_cache_only_where_the_engine_version_makes_it(
        engine: str, version: str, target: str | None, draft: str | None, inherits: bool) -> None:
    assert (prepare(engine, version, target, draft) is not None) == inherits


def test_fp8_storage_rounds_and_saturates() -> None:
    got = prepare("vllm", "0.27.0", "fp8", None)
    assert got is not None
    x = torch.tensor([0.1234567, 1000.0, -1000.0])
    y = got.store(x)
    assert y[1] == 448 and y[2] == -448 and 0 < abs(float(y[0]) - 0.1234567) < 0.01


def test_the_option_refuses_a_kv_dtype_with_quotes(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="--serve-kv-cache-dtype"):
        EvalOptions(ckpt=tmp_path, data=tmp_path, serve_kv_cache_dtype="fp8'; rm -rf").validate()


def test_which_parts_each_engine_version_replaces() -> None:
    assert set(rules("vllm", "0.11.0", {}, full_vocab=False)) == {EMBED}
    assert set(rules("vllm", "0.11.0", {}, full_vocab=True)) == {EMBED, HEAD}
    assert rules("vllm", "0.12.0", {}, full_vocab=True) == {}
    assert set(rules("sglang", "0.5.23", {"draft_vocab_size": 80, "hidden_size": 32}, False)) == {EMBED}
    assert set(rules("sglang", "0.5.23", {"hidden_size": 32}, False)) == {EMBED, HEAD}
    assert set(rules("sglang", "0.5.23", {"draft_vocab_size": 80, "hidden_size": 32,
                                          "target_hidden_size": 64}, False)) == set()


def _policy(seed: int, off_policy: bool, rows: int = 4000) -> dict:
    """Rows of a random target over a 20-token draft vocabulary; the next token sampled by the target
    (on-policy) or uniformly (another writer); the draft's token its own argmax of a noisy copy."""
    gen = torch.Generator().manual_seed(seed)
    vd, h = 20, 8
    head = VerifierHead(torch.ones(h), torch.randn(vd, h, generator=gen) * 2, 1e-6)
    final = torch.randn(1, rows, h, generator=gen)
    probs = torch.softmax(torch.nn.functional.normalize(final[0], dim=-1) * h ** 0.5 @ head.rows.T, -1)
    nxt = (torch.randint(0, vd, (rows,), generator=gen) if off_policy
           else torch.multinomial(probs, 1, generator=gen).squeeze(1))
    drafted = (probs + 0.3 * torch.rand(rows, vd, generator=gen)).argmax(-1)
    tally = PolicyTally()
    tally.observe(head, final, nxt[None], torch.ones(1, rows, dtype=torch.bool), torch.ones(vd, dtype=torch.bool),
                  torch.arange(vd), torch.arange(rows), drafted)
    return tally.to_dict(0.05)


def test_the_off_policy_test_holds_its_error_rate_on_text_the_target_sampled() -> None:
    runs = [_policy(seed, off_policy=False) for seed in range(24)]
    assert sum(r["off_policy"] for r in runs) <= 3   # alpha 0.05 one-sided, and the margin: about 0 of 24
    zs = [r["z"] for r in runs]   # standard normal on-policy: mean about 0, spread about 1
    assert abs(sum(zs) / len(zs)) < 0.7 and 0.5 < (sum(z * z for z in zs) / len(zs)) ** 0.5 < 1.6


def test_the_off_policy_test_flags_another_writers_text() -> None:
    got = _policy(0, off_policy=True)
    assert got["off_policy"] and got["shortfall"] > 0.03 and got["shortfall_ci"][0] > 0


def test_engine_states_in_the_dumps_basis_get_no_target_rotated(tmp_path: Path) -> None:
    from tests.cause_cases import healthy
    from tests.cause_cases.healthy import FAST
    from tests.cause_cases.rotation import engine_states

    base = healthy()
    with contextlib.redirect_stdout(io.StringIO()):
        report = evaluate(EvalOptions(ckpt=base.draft, data=base.data["speculators"], verifier=base.target,
                                      out=tmp_path / "run", engine_states=engine_states(tmp_path, None), **FAST))
    agreement = report["engine_states"]["agreement"]
    assert all(s["cosine"] > 0.999 and abs(s["norm_ratio"] - 1) < 1e-6 for s in agreement["slots"])
    assert [f["id"] for f in report["findings"]] == []
