"""``off-policy-data`` (failure-modes.md, more causes: speculators #725): the dumps' text is not what the
target generates, so the draft learnt to predict another writer's next tokens, and a server, which
only ever verifies the target's own tokens, accepts what the verifier figure says, not the data
figure training reported.  Measured by remote/drafter/scoring/policy.py on the metrics pass (served layout,
step 0): the draft hits the data's next tokens less often than it would hit tokens the target sampled."""
from __future__ import annotations

from typing import Any

from ..scoring.policy import ID
from .facts import Facts

FIX = ("Regenerate the responses of the training data with the target itself (speculators' response "
       "regeneration, recommended by speculators #725; SpecForge #192), dump the target's states on that text "
       "and retrain the draft on it; judge the draft by its verifier-basis figures meanwhile.")


def check(facts: Facts) -> list[dict[str, Any]]:
    measured = facts.extra.get(ID)
    if not measured or not measured.get("off_policy"):
        return []
    res, steps = facts.res, facts.opts.steps
    score = res.full.get("best") or res.full.get("served")   # the layout policy.py watched
    if score is None or score.verifier is None:
        return []
    data, verifier = score.data, score.verifier
    d0, v0 = data.full_acc()[0], verifier.full_acc()[0]
    if d0 is None or v0 is None:
        return []
    al_data, al_verifier = data.accept_length(steps), verifier.accept_length(steps)
    lo, hi = measured["shortfall_ci"]
    text = (f"The dumps' next tokens are not text this target generates: on the {measured['rows']} rows whose next "
            f"token the draft vocabulary holds, the draft's step-0 token is the data's {measured['observed_acc']:.3f} "
            f"of the time, against {measured['expected_acc']:.3f} if the target had sampled those tokens itself "
            f"(short by {measured['shortfall']:.3f}, {measured['ci_level']:.0%} interval {lo:.3f} to {hi:.3f}; "
            f"z = {measured['z']:.1f}, one-sided p = {measured['p_value']:.2g} at alpha {measured['alpha']:g}). A "
            f"draft trained on such text learns another writer's continuations; this one scores step-0 accuracy "
            f"{d0:.3f} against the data's tokens but {v0:.3f} "
            f"against the target's greedy ones, predicted accept length {al_data:.2f} (data) against "
            f"{al_verifier:.2f} (verifier) at K={steps}; a server verifies the target's own tokens, so it "
            f"measures the verifier figure, not the one training reported.")
    evidence = {"rows": measured["rows"], "observed_acc": measured["observed_acc"],
                "expected_acc": measured["expected_acc"], "shortfall": measured["shortfall"],
                "shortfall_ci": measured["shortfall_ci"], "ci_level": measured["ci_level"], "z": measured["z"],
                "p_value": measured["p_value"],
                "alpha": measured["alpha"], "margin": measured["margin"], "method": measured["method"],
                "step0_acc_data": d0, "step0_acc_verifier": v0, "accept_length_data": al_data,
                "accept_length_verifier": al_verifier, "steps": steps}
    return [{"id": ID, "severity": "warn", "text": text, "evidence": _rounded(evidence), "fix": FIX}]


def _rounded(evidence: dict[str, Any]) -> dict[str, Any]:
    """Figures to 6 significant digits: sums taken in another batch order differ in the last bits."""
    def r(v: Any) -> Any:
        if isinstance(v, float):
            return float(f"{v:.6g}")
        return [r(x) for x in v] if isinstance(v, list) else v
    return {k: r(v) for k, v in evidence.items()}
