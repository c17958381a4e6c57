"""The evaluator's speed paths compute what the plain forward computes.

Pruned scoring (later TTT steps only for rows still right) gives the same counts as scoring every
row; a step over a subset of rows gives those rows' logits; the inference attention (fused causal
kernel + merged diagonal keys) equals the dense formulation the demo trains with; parallel reads
keep the order and the errors; the benchmark refuses ``--device cuda`` without CUDA in one line.
"""
from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from remote.drafter import Verifier, load_checkpoint
from remote.drafter.data.batching import collate, iter_batches
from remote.drafter.data.dumps import DumpSet, Sample
from remote.drafter.errors import CorruptFileError
from remote.drafter.load.checkpoint import expected_shapes
from remote.drafter.model.draft import DraftArch, Eagle3Draft, Unroll
from remote.drafter.model.rope import RopeSpec
from remote.drafter.scoring.score import VerifierHead, new_score, score_batch
from tests.support.drafter_support import demo

REPO = Path(__file__).resolve().parent.parent


def _demo_head(draft: Eagle3Draft) -> VerifierHead:
    verifier = Verifier(demo().target)
    targets = draft.draft_to_target(torch.arange(draft.arch.draft_vocab_size))
    order = torch.argsort(targets)
    rows = torch.empty(draft.arch.draft_vocab_size, draft.arch.hidden_size)
    rows[order] = verifier.lm_head_rows(targets[order]).float()
    return VerifierHead(verifier.final_norm().float(), rows, draft.arch.rms_norm_eps)


@pytest.mark.parametrize("slots", [(0, 1, 2), (1, 2, 3)])  # the trained layout, and the served (wrong) one
def test_pruned_scoring_counts_equal_every_row(slots: tuple[int, ...]) -> None:
    draft, _ = load_checkpoint(demo().draft)
    head = _demo_head(draft)
    data = DumpSet.open(demo().data)
    batch = collate([data.load(i) for i in range(48)])
    targets = head.targets(batch.final(4))
    pruned, every = new_score(slots, 4, True), new_score(slots, 4, True)
    with torch.inference_mode():
        ran = score_batch(draft, batch, pruned, 4, targets)
        ran_all = score_batch(draft, batch, every, 4, targets, prune=False)
    assert pruned.data.to_dict() == every.data.to_dict()
    assert pruned.verifier is not None and every.verifier is not None
    assert pruned.verifier.to_dict() == every.verifier.to_dict()
    assert ran_all == [batch.input_ids.numel()] * 4
    assert ran[0] == int(batch.scored.sum())  # step 0: every scored row
    assert all(a > b for a, b in itertools.pairwise(ran))  # each later step runs only the survivors
    assert ran[1] <= int((batch.scored & (batch.next_ids >= 0)).sum())


def test_a_step_over_some_rows_gives_those_rows_logits() -> None:
    draft, _ = load_checkpoint(demo().draft)
    data = DumpSet.open(demo().data)
    batch = collate([data.load(i) for i in (3, 4, 5)])
    aux, ids = batch.aux([0, 1, 2]), batch.input_ids
    gen = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        full = [x.reshape(-1, x.shape[-1]) for x in draft.forward(aux, ids, 3, batch.lengths)]
        unroll = Unroll(draft, aux, ids)
        rows = torch.arange(ids.numel())
        for k in range(3):
            rows = rows[torch.rand(rows.numel(), generator=gen) < 0.7]
            assert torch.allclose(unroll.step(rows), full[k][rows], atol=1e-5)
        with pytest.raises(ValueError, match="subset"):
            unroll.step(torch.tensor([int(rows.max()) + 1]))


def _random_draft(**changes: object) -> Eagle3Draft:
    arch = DraftArch(hidden_size=48, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
                     num_layers=1, num_aux=3, aux_hidden_size=48, draft_vocab_size=60, vocab_size=80,
                     rms_norm_eps=1e-5, rope=RopeSpec(), norm_before_residual=False, norm_output=False,
                     norm_before_fc=False, fc_norm=False, qk_norm=False, sliding_windows=(None,))
    arch = replace(arch, **changes)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(9)
    weights = {}
    for name, shape in expected_shapes(arch).items():
        if name == "d2t":
            keep = torch.randperm(arch.vocab_size, generator=gen)[: arch.draft_vocab_size].sort().values
            weights[name] = keep - torch.arange(arch.draft_vocab_size)
        elif len(shape) == 1:
            weights[name] = torch.rand(shape, generator=gen) + 0.5
        else:
            weights[name] = torch.randn(shape, generator=gen) * shape[-1] ** -0.5
    return Eagle3Draft(arch, weights)


@pytest.mark.parametrize("changes", [
    {},
    {"num_layers": 2, "sliding_windows": (5, None), "qk_norm": True, "norm_before_residual": True,
     "norm_output": True, "num_kv_heads": 1},
])
def test_fused_attention_equals_the_exact_formulation(changes: dict) -> None:
    """The half-precision path (fused causal kernel over the step-0 keys + each row's own later keys
    merged by log-sum-exp), run here in fp32, against speculators' dense formulation; all rows and
    a shrinking subset.  The dense path under autograd (training) equals inference bit for bit."""
    draft = _random_draft(**changes)
    gen = torch.Generator().manual_seed(2)
    aux = torch.randn(3, 13, 3 * 48, generator=gen) * 3
    ids = torch.randint(0, 80, (3, 13), generator=gen)
    with torch.enable_grad():
        trained = [x.detach() for x in draft.forward(aux.clone().requires_grad_(True), ids, 4)]
    with torch.inference_mode():
        exact = [x.reshape(39, -1) for x in draft.forward(aux, ids, 4)]
        every, some = Unroll(draft, aux, ids, exact=False), Unroll(draft, aux, ids, exact=False)
        rows = torch.arange(39)
        for k in range(4):
            rows = rows[torch.rand(39, generator=gen)[rows] < 0.8]
            assert torch.allclose(every.step(), exact[k], atol=1e-5, rtol=1e-5)
            assert torch.allclose(some.step(rows), exact[k][rows], atol=1e-5, rtol=1e-5)
            assert torch.equal(trained[k].reshape(39, -1), exact[k])


def test_read_ahead_keeps_the_order_and_raises_in_turn() -> None:
    gen = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randint(0, 9, (n,), generator=gen), torch.randn(n, 2, 4, generator=gen), None,
                      Path(f"s{i}")) for i, n in enumerate((5, 9, 3, 7, 8, 4, 6, 5))]

    def load(i: int) -> Sample:
        if i == 6:
            raise CorruptFileError("cut", path=f"s{i}")
        return samples[i]

    serial = list(iter_batches(samples.__getitem__, range(8), 16, readers=1))
    parallel = list(iter_batches(samples.__getitem__, range(8), 16, readers=3))
    assert len(serial) == len(parallel) > 2
    for a, b in zip(serial, parallel, strict=True):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.states, b.states)
    seen = []
    with pytest.raises(CorruptFileError):
        for batch in iter_batches(load, range(8), 16, readers=3):
            seen.append(batch.input_ids)
    assert seen and len(seen) < len(serial)  # the batches before the bad file, then its error
    assert torch.equal(torch.cat([s.flatten() for s in seen]),
                       torch.cat([b.input_ids.flatten() for b in serial[: len(seen)]]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("script", ["drafter_eval.py", "gpu_figures.py"])
def test_cuda_benchmarks_fail_in_one_line_without_cuda(script: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--device", "cuda",
                           *(["--out", str(tmp_path)] if script == "gpu_figures.py" else [])],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda needs a CUDA GPU" in lines[0] and "--device cpu" in lines[0]
    assert not proc.stdout.strip()


@pytest.mark.slow
def test_gpu_figures_script_runs_end_to_end_on_cpu(tmp_path: Path) -> None:
    """The one-run GPU script, at tiny shapes on the CPU: every section ends without an error and
    the correctness section compares like with like (CPU against CPU here, so identical)."""
    import json

    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_figures.py"), "--device", "cpu",
                           "--smoke", "--no-compile", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"),
                           "--sections", "env,probe,throughput,overlap,naive,correct,e2e"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads((tmp_path / "out" / "gpu_figures.json").read_text())
    assert "errors" not in figures, figures.get("errors")
    variants = figures["throughput"]["variants"]
    assert all("error" not in v for v in variants.values()) and len(variants) >= 4
    kimi = figures["correct"]["kimi"]
    assert kimi["verdict_identical"] and kimi["verdict_cpu"]["status"] == "MISMATCH"
    assert kimi["verdict_cpu"]["best_slots"] == [0, 1, 2]  # the slots the targets were built from
    assert kimi["logits"]["within_tolerance"]
    assert figures["e2e"]["pruned"]["verdict"] == figures["e2e"]["every_row"]["verdict"] == "MISMATCH"
    assert "==== summary ====" in proc.stdout
