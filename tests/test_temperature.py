"""The accept length predicted at a sampling temperature (remote/drafter/scoring/temperature.py): the acceptance
rule of each draft method against a replay of the rejection sampler itself, the per-depth chain, and a
real evaluation of the demo with ``--temperature`` (its report, its finding, its table)."""
from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch
from invoke.exceptions import Exit
from rich.console import Console

from draftops.cli.drafter import parse_temperatures
from draftops.report import temperature_table
from remote.drafter.errors import OptionError
from remote.drafter.options import EvalOptions
from remote.drafter.scoring import temperature
from tests.support.bench_runs import read_report
from tests.support.drafter_support import demo, run_eval


def _replay(target: torch.Tensor, draft: torch.Tensor, emit: torch.Tensor, t: float, method: str,
            n: int, gen: torch.Generator) -> torch.Tensor:
    """The acceptance rate of vLLM's rejection sampler (rejection_random_sample_kernel), replayed:
    accept d when u < p(d) / q(d); a greedy draft proposes its argmax with q(d) = 1 (NO_DRAFT_PROBS)."""
    p = torch.softmax(target / t, -1)
    q = torch.softmax(draft / t, -1)
    rows = torch.arange(target.shape[0])
    if method == temperature.GREEDY:
        d = draft.argmax(-1).expand(n, -1)
        q_d = torch.ones(n, target.shape[0])
    else:
        d = torch.multinomial(q, n, replacement=True, generator=gen).T      # [n, R]
        q_d = q[rows, d]
    p_d = p[rows, emit[d]]
    u = torch.rand(n, target.shape[0], generator=gen)
    return (u < p_d / q_d).double().mean(0)


@pytest.mark.parametrize("t", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("method", temperature.METHODS)
def test_acceptance_is_what_the_rejection_sampler_accepts(t: float, method: str) -> None:
    gen = torch.Generator().manual_seed(7)
    target = torch.randn(6, 12, generator=gen) * 2
    draft = target[:, [0, 2, 3, 5, 7, 8, 11]] + torch.randn(6, 7, generator=gen)   # a draft vocab of 7
    emit = torch.tensor([0, 2, 3, 5, 7, 8, 11])
    want = temperature.acceptance(target, draft, emit, t)[method].double()
    got = _replay(target, draft, emit, t, method, 40_000, gen)
    # 40,000 Bernoulli draws: the standard error is at most 0.0025; 0.012 is beyond four of them
    assert torch.allclose(got, want, atol=0.012), (got, want)


def test_acceptance_edges() -> None:
    emit = torch.tensor([0, 1, 2])
    same = torch.tensor([[3.0, 1.0, 0.0]])
    out = temperature.acceptance(same, same.clone(), emit, 1.0)
    assert out[temperature.PROBABILISTIC].item() == pytest.approx(1.0)      # q = p: always accepted
    assert out[temperature.GREEDY].item() == pytest.approx(torch.softmax(same, -1)[0, 0].item())
    zero = temperature.acceptance(torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([[9.0, 0.0, 0.0]]), emit, 0)
    assert zero[temperature.GREEDY].item() == 0.0 == zero[temperature.PROBABILISTIC].item()
    # a draft id whose target token is outside the target vocabulary is never accepted
    outside = temperature.acceptance(torch.tensor([[1.0, 1.0]]), torch.tensor([[5.0, 0.0]]), torch.tensor([7, 1]), 1.0)
    assert outside[temperature.GREEDY].item() == 0.0
    assert outside[temperature.PROBABILISTIC].item() == pytest.approx(1 / (1 + math.e ** 5))   # min(0.5, q(1))


def test_chain_is_the_product_of_the_conditionals() -> None:
    cond, length = temperature.chain(torch.tensor([100.0, 50.0, 0.0], dtype=torch.float64),
                                   torch.tensor([80.0, 25.0, 0.0], dtype=torch.float64))
    assert cond == [0.8, 0.5, None]
    assert length == pytest.approx(1 + 0.8 + 0.8 * 0.5)


def test_options_refuse_bad_temperatures() -> None:
    for bad in ((float("nan"),), (-0.1,), (101.0,), (float("inf"),)):
        with pytest.raises(OptionError, match="--temperature"):
            EvalOptions(ckpt=Path("c"), data=Path("d"), temperatures=bad).validate()
    assert parse_temperatures("0.7, 1,0.7") == "0.7,1.0"
    for bad in ("nan", "-1", "x", "", "1e400", ",".join(["1"] * 9)):
        with pytest.raises(Exit, match="--temperature"):
            parse_temperatures(bad)


@pytest.fixture(scope="module")
def fixed_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The fixed demo draft evaluated at temperatures 0, 0.7 and 1 (every sample)."""
    return run_eval(tmp_path_factory.mktemp("t"), ckpt=demo().root / "draft_fixed", full=True,
                    temperatures=(0.0, 0.7, 1.0))


def test_demo_prediction_at_temperature(fixed_report: dict) -> None:
    part = fixed_report["temperature"]
    assert part["role"] == "served" and part["steps"] == 3
    rows = {row["temperature"]: row for row in part["predictions"]}
    assert set(rows) == {0.0, 0.7, 1.0}
    greedy0 = rows[0.0][temperature.GREEDY]
    # at 0 both methods are the greedy figure, and that is the evaluator's greedy prediction (its chain is
    # conditioned on the dump's tokens, the verifier chain's on the verifier's: a few per cent apart at most)
    assert greedy0["accept_length"] == rows[0.0][temperature.PROBABILISTIC]["accept_length"]
    assert greedy0["accept_length"] == pytest.approx(fixed_report["predicted_accept_length"]["served"], rel=0.03)
    for t in (0.7, 1.0):
        for m in temperature.METHODS:
            fig = rows[t][m]
            lo, hi = fig["ci"]
            assert lo < fig["accept_length"] < hi and hi - lo < 0.2
            assert 1 < fig["accept_length"] < greedy0["accept_length"]
            assert len(fig["cond_acc"]) == 3 and fig["rows"][0] > fig["rows"][2] > 0
    assert rows[1.0][temperature.GREEDY]["accept_length"] < rows[0.7][temperature.GREEDY]["accept_length"]
    finding = next(f for f in fixed_report["findings"] if f["id"] == "sampling-temperature")
    assert finding["severity"] == "warn" and "at temperature 0.7" in finding["text"]
    assert f"{rows[0.7][temperature.GREEDY]['accept_length']:.2f}" in finding["text"]
    assert "invoke bench --temperature 0.7" in finding["fix"]
    rounds = rows[0.7][temperature.GREEDY]["per_round"]
    assert f"{rounds['accept_length']:.2f} per round" in finding["text"]
    assert 1 < rounds["accept_length"] < rows[0.7][temperature.GREEDY]["accept_length"]   # rounds pile up in hard parts


def test_report_renders_the_table(fixed_report: dict) -> None:
    part = read_report(fixed_report).temperature
    assert part is not None
    out = Console(width=80, record=True, file=io.StringIO())
    out.print(temperature_table(part))
    text = out.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    g = part.at(0.7)
    assert g is not None and f"{g.greedy.accept_length:.2f}" in text and "probabilistic" in text
    assert g.greedy.per_round is not None and f"{g.greedy.per_round.accept_length:.2f}" in text


def test_without_temperature_or_verifier(tmp_path: Path) -> None:
    plain = run_eval(tmp_path / "a", limit=8, full=True)
    assert plain["temperature"] is None and "sampling-temperature" not in plain["verdict"]["findings"]
    blind = run_eval(tmp_path / "b", limit=8, full=True, verifier=None, temperatures=(0.7,))
    assert blind["temperature"] is None
    assert any("--temperature needs the target" in w for w in blind["warnings"])
