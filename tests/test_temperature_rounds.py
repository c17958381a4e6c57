"""Tokens per round at a temperature (remote/drafter/scoring/temperature.py ``per_round``) and the dumps of
the text a server writes (remote/drafter/demo/served.py).

The known answers: a process whose per-row acceptance probabilities are given, where the exact tokens
per round follow from a recursion over the rows a round can start from; and, with the demo's real
target and fixed draft, speculative decoding itself replayed in torch (the draft proposes its argmax K
times, the target accepts each with probability p_T(d) and resamples a rejected one without it), the
server's rule that vLLM 0.32 runs (tests/test_temperature_engine.py checks vLLM itself)."""
from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from remote.bench.demo_prompts import prompts as demo_prompts
from remote.drafter.demo.served import EOS, sample_served, served_dumps
from remote.drafter.demo_spec import DemoSpec
from remote.drafter.load.checkpoint import load_checkpoint
from remote.drafter.load.verifier import Verifier
from remote.drafter.model import tinyllama
from remote.drafter.model.draft import Unroll
from remote.drafter.scoring import metrics, temperature
from tests.support.drafter_support import demo, run_eval

K = 3


def _hard_and_easy(n: int) -> torch.Tensor:
    """[n, K] acceptance probabilities in stretches: easy rows (0.95) and hard ones (0.15)."""
    easy = (torch.arange(n) // 6) % 2 == 0
    return torch.where(easy[:, None], torch.full((n, K), 0.95), torch.full((n, K), 0.15)).double()


def _exact(q: torch.Tensor) -> float:
    """Tokens per round of the process, exactly: s[t] = P(a round starts at row t), ratio of expectations."""
    n = q.shape[0]
    start, rounds, tokens = torch.zeros(n + K + 1, dtype=torch.float64), 0.0, 0.0
    start[0] = 1.0
    for t in range(n - K + 1):                     # rows t..t+K-1 exist: a round may start here
        reach = torch.cat([torch.ones(1, dtype=torch.float64), q[t].cumprod(0)])   # P(a >= j), j = 0..K
        rounds += float(start[t])
        tokens += float(start[t]) * (1 + float(reach[1:].sum()))
        for a in range(K + 1):
            p_a = float(reach[a] - (reach[a + 1] if a < K else 0.0))
            start[t + a + 1] += start[t] * p_a
    return tokens / rounds


def _draw(q: torch.Tensor, samples: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(chain [S, n], credit [S, n]) of ``samples`` texts: each row's draft tokens match the text with
    the probabilities q, independently (a round's draws are fresh wherever it starts)."""
    hit = torch.rand(samples, *q.shape, generator=gen, dtype=torch.float64) < q
    alive = torch.cat([torch.ones(samples, q.shape[0], 1, dtype=torch.bool), hit.cumprod(-1).bool()[..., :-1]], -1)
    return hit.cumprod(-1).sum(-1), (alive * q).sum(-1)


def test_per_round_is_the_exact_tokens_per_round_over_many_seeds() -> None:
    q = _hard_and_easy(60)
    truth = _exact(q)
    positions = 1 + float(q.cumprod(1).sum(1).mean())          # the average over positions
    scored = torch.ones(200, 60, dtype=torch.bool)
    got = []
    for seed in range(40):
        chain, credit = _draw(q, 200, torch.Generator().manual_seed(seed))
        starts = temperature.round_starts(chain, scored, K)
        got.append(temperature.per_round(starts.sum(1).double(), (credit * starts).sum(1), 0.7)["accept_length"])
    mean, sd = sum(got) / len(got), float(torch.tensor(got).std())
    # 40 estimates: the mean's standard error is sd / sqrt(40); 4 of them is the band
    assert abs(mean - truth) <= 4 * sd / math.sqrt(len(got)) + 1e-3, (mean, truth, sd)
    assert positions - truth > 0.25, (positions, truth)         # what the chain over positions says


def test_round_starts_replay_the_walk() -> None:
    gen = torch.Generator().manual_seed(3)
    chain = torch.randint(0, K + 1, (50, 30), generator=gen)
    scored = torch.rand(50, 30, generator=gen) > 0.1
    starts = temperature.round_starts(chain, scored, K)
    assert (int(starts.sum()), int((chain * starts).sum())) == metrics.walk(chain, scored, K)


def test_per_round_interval_and_edges() -> None:
    rounds, credit = torch.tensor([10.0, 12.0, 8.0, 11.0]), torch.tensor([14.0, 20.0, 6.0, 15.0])
    got = temperature.per_round(rounds, credit, 1.0)
    assert got["accept_length"] == pytest.approx(1 + 55 / 41) and got["rounds"] == 41
    assert got["ci"][0] < got["accept_length"] < got["ci"][1]
    assert temperature.per_round(rounds, credit, 1.0) == got                    # seeded
    assert temperature.per_round(torch.zeros(3), torch.zeros(3), 1.0)["accept_length"] is None
    assert temperature.per_round(rounds[:1], credit[:1], 1.0)["ci"] is None


def test_served_dumps_are_the_served_text(tmp_path: Path) -> None:
    d = demo()
    texts = demo_prompts(d.root, DemoSpec().prompt_len)[:4]
    folder = served_dumps(d.root, tmp_path / "data", texts, 1.0, 30, continuations=3, seed=5)
    files = sorted(folder.glob("data_*.pt"))
    assert len(files) == 12
    again = sample_served(d.target, [[int(w[1:]) for w in t.split()] for t in texts], 1.0, 30, 3, seed=5)
    for f, (ids, plen) in zip(sorted(files, key=lambda p: int(p.stem.split("_")[1])), again, strict=True):
        dump = torch.load(f, weights_only=True)
        assert torch.equal(dump["input_ids"], ids) and plen == 4                  # deterministic
        assert dump["loss_mask"].tolist() == [0] * 4 + [1] * (ids.numel() - 4)   # generated tokens only
        assert len(dump["hidden_states"]) == 5
        assert ids.numel() == 34 or (ids[-1] == EOS and EOS not in ids[4:-1].tolist())   # cut after EOS
    with pytest.raises(ValueError, match="temperature"):
        sample_served(d.target, [[5, 6]], float("nan"), 4)
    with pytest.raises(ValueError, match="output_len"):
        sample_served(d.target, [[5, 6]], 0.7, 10**9)


def _simulate(root: Path, prompts: list[list[int]], t: float, output_len: int, seeds: int) -> float:
    """Speculative decoding replayed in torch: tokens per round of a greedy-draft server at ``t``
    (a round's drafts are kept to the ones within ``output_len``, as a server counts them)."""
    cfg, target = tinyllama.load(root / "target")
    draft, _ = load_checkpoint(root / "draft_fixed", verifier=Verifier(root / "target"))
    slots = [i + 1 for i in DemoSpec().trained_ids]
    rounds = accepted = 0
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(seed)
        for prompt in prompts:
            x = list(prompt)
            x.append(_pick(tinyllama.forward(cfg, target, torch.tensor([x]))[1][0, -1:], t, gen)[0])
            while len(x) - len(prompt) < output_len and x[-1] != EOS:
                proposed = _propose(draft, cfg, target, slots, x)
                logits = tinyllama.forward(cfg, target, torch.tensor([x + proposed]))[1][0, len(x) - 1:]
                probs = torch.softmax(logits / t, -1)
                a = 0
                while a < K and float(torch.rand(1, generator=gen)) < float(probs[a, proposed[a]]):
                    a += 1
                rest = probs[a].clone()
                if a < K:
                    rest[proposed[a]] = 0
                new = proposed[:a] + [int(torch.multinomial(rest / rest.sum(), 1, generator=gen))]
                if EOS in new:
                    new = new[: new.index(EOS) + 1]
                x += new[: output_len - (len(x) - len(prompt))]
                rounds, accepted = rounds + 1, accepted + a
    return 1 + accepted / rounds


def _pick(logits: torch.Tensor, t: float, gen: torch.Generator) -> list[int]:
    return torch.multinomial(torch.softmax(logits / t, -1), 1, generator=gen)[:, 0].tolist()


@torch.inference_mode()
def _propose(draft, cfg, target, slots: list[int], x: list[int]) -> list[int]:
    """The draft's K argmax tokens after ``x`` (its step k reads its own token k-1, as a server runs it)."""
    states, _ = tinyllama.forward(cfg, target, torch.tensor([x]))
    n = len(x)
    aux = torch.cat([states[0, : n - 1, slots].flatten(1), states.new_zeros(K - 1, len(slots) * states.shape[-1])])
    unroll = Unroll(draft, aux[None], torch.tensor([x[1:] + [0] * (K - 1)]))
    out: list[int] = []
    for k in range(K):
        d = int(draft.draft_to_target(unroll.step(torch.tensor([n - 2]))[0].argmax()))
        out.append(d)
        if k + 1 < K:
            unroll.ids[0, n - 1 + k] = d
    return out


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The tiny models' ops lose more to thread hand-offs than they gain (20x on a busy host)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_per_round_on_served_text_is_a_simulated_server(tmp_path: Path, one_thread: None) -> None:
    """At T = 0.7, 16 prompts, 32 tokens out: the evaluator on served text against the replayed server
    (both about 0.04 of standard error here), where the chain over positions is far above both."""
    d, t = demo(), 0.7
    texts = demo_prompts(d.root, DemoSpec().prompt_len)[:16]
    simulated = _simulate(d.root, [[int(w[1:]) for w in s.split()] for s in texts], t, 32, seeds=4)
    data = served_dumps(d.root, tmp_path / "data", texts, t, 32, continuations=16)
    got = run_eval(tmp_path / "eval", ckpt=d.root / "draft_fixed", data=data, full=True,
                   temperatures=(t,))["temperature"]["predictions"][0]["greedy"]
    assert abs(got["per_round"]["accept_length"] - simulated) <= 0.15, (got["per_round"], simulated)
    assert got["accept_length"] - simulated > 0.3, (got["accept_length"], simulated)
