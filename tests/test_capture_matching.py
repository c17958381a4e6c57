"""The capture check's slot matching and its "not this target" kinds, on states with known answers."""
from __future__ import annotations

import pytest
import torch

from remote.capture import differences, matching, report


def served_states(tokens: int = 96, layers: int = 6, hidden: int = 16, seed: int = 0) -> torch.Tensor:
    """[T, n+1, H]: an embedding, then a residual update per layer, as a decoder's boundaries are."""
    gen = torch.Generator().manual_seed(seed)
    states = [torch.randn(tokens, hidden, generator=gen)]
    for _ in range(layers):
        states.append(states[-1] + 0.6 * torch.randn(tokens, hidden, generator=gen))
    return torch.stack(states, dim=1)


def tally_of(dump: torch.Tensor, served: torch.Tensor, samples: int = 3) -> matching.Tally:
    tally = matching.Tally(dump.shape[1], served.shape[1])
    per = dump.shape[0] // samples
    for i in range(samples):
        part = slice(i * per, (i + 1) * per)
        tally.add(dump[part], served[part], rows_per_sample=64)
    return tally


def test_each_slot_matches_the_boundary_it_holds_and_no_other():
    served = served_states()
    dump = served[:, [0, 2, 4, 6]] + 1e-5 * torch.randn(96, 4, 16)
    found = matching.match(tally_of(dump, served))
    assert [m.boundary for m in found] == [0, 2, 4, 6]
    assert all(m.matched for m in found)
    assert all(m.error < 1e-3 < m.runner_up_error for m in found if m.runner_up_error is not None)
    assert report.status_of(found) == report.MATCHED


@pytest.mark.parametrize("kind, make", [
    ("scale", lambda s: 1.7 * s),
    ("offset", lambda s: s + 3.0 * torch.ones(s.shape[-1])),
    ("rotation", lambda s: s @ torch.linalg.qr(torch.randn(s.shape[-1], s.shape[-1],
                                                       generator=torch.Generator().manual_seed(5)))[0]),
    ("post-norm", lambda s: 0.5 * s / s.pow(2).mean(dim=-1, keepdim=True).add(1e-6).sqrt()),
])
def test_a_transformed_dump_is_not_this_target_and_the_kind_is_named(kind, make):
    """Scale hides from the cosine (it stays 1.0): the kinds are fitted, never read off the cosine."""
    served = served_states()
    dump = make(served[:, [1, 3, 6]])
    tally = tally_of(dump, served)
    found = matching.match(tally)
    assert not any(m.matched for m in found), [(m.boundary, m.error, m.threshold) for m in found]
    assert report.status_of(found) == report.NOT_THIS_TARGET
    kinds = {differences.explain(tally, m)["kind"] for m in found}
    assert kinds == {kind}
    if kind == "scale":
        assert all(m.cosine > 0.9999 for m in found)


def test_dumps_of_another_target_match_nothing_and_say_unlike():
    served = served_states(seed=1)
    dump = served_states(seed=2)[:, [1, 3, 6]]
    tally = tally_of(dump, served)
    found = matching.match(tally)
    assert not any(m.matched for m in found)
    assert {differences.explain(tally, m)["kind"] for m in found} == {"unlike"}


def test_dtype_noise_still_matches_when_below_half_a_layer_step():
    served = served_states()
    dump = served[:, [0, 3, 6]].to(torch.bfloat16).to(torch.float32)      # bf16 rounding: ~0.4%
    found = matching.match(tally_of(dump, served))
    assert [m.boundary for m in found] == [0, 3, 6] and all(m.matched for m in found)
    assert all(0 < m.error < 0.01 for m in found)


def test_the_threshold_comes_from_the_targets_own_layer_steps():
    """A target whose layers change the state little gets a tighter threshold."""
    gentle = served_states()
    gentle = torch.cat([gentle[:, :1], gentle[:, :1] + 0.05 * (gentle[:, 1:] - gentle[:, :1])], dim=1)
    tally = tally_of(gentle[:, [2]], gentle)
    (m,) = matching.match(tally)
    steps = tally.neighbour_distance()
    assert m.threshold == pytest.approx(min(matching.MATCH_CEILING, matching.MATCH_FRACTION * float(steps[2])))
    assert m.threshold < matching.MATCH_CEILING
