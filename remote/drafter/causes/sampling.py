"""``sampling-temperature``: the draft is served or benched at a temperature above 0, where the server
verifies each drafted token by rejection sampling and accepts fewer than greedy decoding does.  The
numbers are the evaluator's own prediction at that temperature (remote/drafter/scoring/temperature.py), set
beside the greedy one, so a bench at that temperature is held against the right figure."""
from __future__ import annotations

from typing import Any

from ..scoring.temperature import GREEDY, ID, PROBABILISTIC
from .facts import Facts

FINDING = "sampling-temperature"


def check(facts: Facts) -> list[dict[str, Any]]:
    part = facts.extra.get(ID)
    if not part:
        return []
    rows = [row for row in part.get("predictions", []) if row["temperature"] > 0]
    zero = part.get("greedy_at_zero")
    if not rows or zero is None:
        return []
    return [finding(rows, zero, part.get("steps"))]


def finding(rows: list[dict[str, Any]], zero: float, steps: int | None) -> dict[str, Any]:
    """One finding for every temperature above 0 asked for (the lowest one's figures in the text)."""
    said = "; ".join(
        f"at temperature {row['temperature']:g} {_num(row[GREEDY]['accept_length'])} with a greedy draft "
        f"(95% CI {_ci(row[GREEDY]['ci'])}; vLLM's default, SGLang's chain; {_rounds(row[GREEDY])}) and "
        f"{_num(row[PROBABILISTIC]['accept_length'])} with a probabilistic one" for row in rows)
    t = rows[0]["temperature"]
    return {"id": FINDING, "severity": "warn",
            "text": f"Sampled at a temperature above 0, the server accepts fewer drafted tokens than greedy: this "
                    f"draft's predicted accept length at K={steps} is {_num(zero)} at temperature 0 and {said}.",
            "evidence": {"greedy_at_zero": zero, "steps": steps,
                         "at": [{"temperature": row["temperature"],
                                 GREEDY: row[GREEDY]["accept_length"], f"{GREEDY}_ci": row[GREEDY]["ci"],
                                 f"{GREEDY}_per_round": (row[GREEDY].get("per_round") or {}).get("accept_length"),
                                 PROBABILISTIC: row[PROBABILISTIC]["accept_length"],
                                 f"{PROBABILISTIC}_ci": row[PROBABILISTIC]["ci"]} for row in rows]},
            "fix": f"nothing to fix in the draft: hold a bench at temperature {t:g} against these figures "
                   f"(`invoke bench --temperature {t:g}`, then `invoke bench.compare`), not against the greedy "
                   "prediction: the per-round figure is what a server reports, and it is the bench's own on "
                   f"dumps of the text the target writes at {t:g} from the bench's prompts (other dumps, above "
                   "all ones generated cooler, read high); serve at temperature 0 where greedy output is "
                   "acceptable"}


def _rounds(fig: dict[str, Any]) -> str:
    """The greedy draft's tokens per round (what a server reports) next to its average over positions."""
    rounds = fig.get("per_round") or {}
    return f"{_num(rounds.get('accept_length'))} per round, {_ci(rounds.get('ci'))}"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _ci(ci: list[float] | None) -> str:
    return "n/a" if not ci else f"{ci[0]:.2f}-{ci[1]:.2f}"
