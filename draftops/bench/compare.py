"""``bench compare``: two benchmark runs side by side with the accept length test-drafter predicted,
and the conclusions that follow, in plain words.

The rule the findings encode (issue 10): when the measured accept length is far below what
test-drafter predicts for the served config, the server is not feeding the draft what it was
trained on (capture wiring); when it is close, the wiring is right and the draft itself is the
limit, unless test-drafter already said the config's layer ids are wrong (MISMATCH), in which
case the server faithfully runs a wrong config and the fix is ``draft-config --from-report``.
"""
from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from draftops import comparison
from draftops.bench import samples, tuned
from draftops.bench.plan import chat_advice
from draftops.bench.positions import PositionTable, compare_positions
from draftops.bench.result import BenchResult, DraftInfo
from draftops.bench.stats import Stat
from draftops.documents import bench_compare
from draftops.errors import BenchError
from draftops.history import History, RunRecord
from remote.bench.numbers import finite
from remote.eagle import acceptlength

TOLERANCE = 0.10          # measured vs predicted accept length, like the client/server cross-check
SEVERITY_ORDER = {"bad": 0, "warn": 1, "good": 2, "info": 3}


@dataclass
class Prediction:
    """The accept length test-drafter predicts for a served draft config."""

    value: float
    role: str                     # "served": this exact config; "best": the fix the served ids now equal
    steps: int
    run_id: str
    status: str | None            # MATCH / MISMATCH / UNKNOWN
    served: float | None
    best: float | None
    fix_layer_ids: list[int] | None
    how: str
    walk: float | None = None     # a greedy server's rounds on the dump text (docs/bench.md)
    cond_served: list[float | None] | None = None   # predicted cond_acc_k per TTT step, served layout
    cond_best: list[float | None] | None = None     # ... and the best (trained) layout
    cond_rows_served: list[int] | None = None       # the rows each of those counts
    cond_rows_best: list[int] | None = None
    chat_formatted: bool | None = None              # that run found the dumps chat-formatted (None: not known)
    at_temperatures: list[dict[str, Any]] | None = None   # that run's --temperature predictions (records.py)
    temperature: float = 0.0                        # the temperature ``value`` is predicted at
    method: str | None = None                       # at T > 0: the draft sampling method ``value`` is for
    ci: list[float] | None = None                   # at T > 0: its 95% interval
    greedy_value: float | None = None               # at T > 0: the prediction at temperature 0, for the finding

    @property
    def cond(self) -> list[float | None] | None:
        """The predicted conditional acceptance per step of the layout this prediction is for."""
        return self.cond_served if self.role == "served" else self.cond_best

    @property
    def cond_rows(self) -> list[int] | None:
        return self.cond_rows_served if self.role == "served" else self.cond_rows_best


@dataclass
class Finding:
    severity: str                 # bad | warn | good | info
    code: str
    text: str


@dataclass
class Comparison:
    a: BenchResult
    b: BenchResult
    predictions: dict[str, Prediction | None]
    findings: list[Finding] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    speedup: float | None = None
    tolerance: float = TOLERANCE
    noise: float | None = None        # the larger spread of the two runs' repeats (a fraction), shown only
    positions: list[PositionTable] = field(default_factory=list)   # per position, predicted vs measured
    verdicts: dict[str, comparison.Verdict] = field(default_factory=dict)   # the one rule, per metric

    @property
    def speed(self) -> comparison.Verdict | None:
        return self.verdicts.get("throughput")

    @property
    def within_noise(self) -> bool:
        """No decision on throughput: the interval holds both ×1 and a difference beyond the margin."""
        return self.speed is not None and self.speed.decision == comparison.UNDECIDED

    def speed_text(self) -> str:
        """The speed ratio with its interval and decision, as the table and the chart title say it."""
        if self.speed is None or self.speed.ratio is None:
            return "—"
        return self.speed.sentence()

    @property
    def headline(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": bench_compare.SCHEMA, "a": self.a.run_id, "b": self.b.run_id,
                "modes": [self.a.mode, self.b.mode], "speedup": self.speedup, "tolerance": self.tolerance,
                "noise": self.noise, "within_noise": self.within_noise,
                **{name: v.to_dict() for name, v in self.verdicts.items()},
                "samples": {"a": samples.describe(self.a), "b": samples.describe(self.b)},
                "predictions": {k: asdict(v) if v else None for k, v in self.predictions.items()},
                "rows": self.rows, "findings": [asdict(f) for f in self.findings],
                "per_position": [t.to_dict() for t in self.positions], "definitions": definitions(self.a, self.b)}


def measured_definition(res: BenchResult) -> str:
    """What the run's measured accept length counts (a result from before the field: by its engine)."""
    if res.accept_length and res.accept_length.definition:
        return res.accept_length.definition
    return acceptlength.VLLM if res.engine.name == "vllm" else acceptlength.SGLANG


def definitions(a: BenchResult, b: BenchResult) -> dict[str, str]:
    """Every accept length the comparison shows, with what it counts (failure-modes.md #12)."""
    out = {f"measured ({r.engine.name})": measured_definition(r) for r in (a, b) if r.mode == "speculative"}
    return {**out, "predicted": acceptlength.PREDICTED, "greedy rounds on the dumps": acceptlength.WALK}


# --- which runs, which prediction ----------------------------------------------------------------

def default_pair(history: History, host: str | None = None) -> tuple[str, str]:
    """The latest baseline and the latest speculative run of the same host, engine and target (the
    baseline first); without a baseline, the two latest speculative runs (older first)."""
    runs = [r for r in history.query(kind="bench", host=host) if r.verdict != "failed"]
    spec = next((r for r in runs if r.draft), None)
    if spec is None:
        where = f" on host {host}" if host else ""
        raise BenchError(f"no successful speculative benchmark{where} in the history: run `invoke serve --draft "
                         "CKPT` and `invoke bench` first (`invoke runs --local --kind bench` lists what is there).")

    def same(r: RunRecord) -> bool:
        return (r.host, r.engine, r.target) == (spec.host, spec.engine, spec.target) and r.run_id != spec.run_id
    base = next((r for r in runs if not r.draft and same(r)), None)
    if base is not None:
        return base.run_id, spec.run_id
    older = next((r for r in runs if r.draft and same(r) and r.time <= spec.time), None)
    if older is not None:
        return older.run_id, spec.run_id
    raise BenchError(f"only one benchmark of {spec.engine} serving {spec.target} on {spec.host} ({spec.run_id}): "
                     "run `invoke serve --baseline` and `invoke bench` for a baseline, or give two run ids.")


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def _prediction(r: RunRecord, role: str, steps: int, how: str) -> Prediction | None:
    """Run ``r``'s prediction for the ``served`` or the ``best`` layout; None when it made none."""
    value = finite(r.metrics.get("predicted_served" if role == "served" else "predicted_best"))
    if value is None or value < 1:      # an accept length counts the verified token: below 1 is no prediction
        return None
    return Prediction(value=value, role=role, steps=steps, run_id=r.run_id, status=r.verdict,
                      served=finite(r.metrics.get("predicted_served")),
                      best=finite(r.metrics.get("predicted_best")),
                      fix_layer_ids=_ints(r.metrics.get("fix_layer_ids")), how=how,
                      walk=finite(r.metrics.get(f"predicted_walk_{role}")),
                      cond_served=_probabilities(r.metrics.get("predicted_cond_served")),
                      cond_best=_probabilities(r.metrics.get("predicted_cond_best")),
                      cond_rows_served=_ints(r.metrics.get("predicted_cond_rows_served")),
                      cond_rows_best=_ints(r.metrics.get("predicted_cond_rows_best")),
                      chat_formatted=_flag(r.metrics.get("chat_formatted")),
                      at_temperatures=_dicts(r.metrics.get("predicted_at_temperature")))


def _dicts(value: Any) -> list[dict[str, Any]] | None:
    """The recorded predictions at temperature (records.py: keyed by the temperature)."""
    return [v for v in value.values() if isinstance(v, dict)] if isinstance(value, dict) else None


#: the draft sampling method the engines use by default: vLLM 0.32's draft_sample_method="greedy" (the
#: rejection sampler sees the draft as one-hot), SGLang's chain EAGLE (target-only verification)
ENGINE_METHOD = "greedy"


def at_temperature(pred: Prediction, temperature: float) -> Prediction | None:
    """``pred`` held at a bench's sampling temperature: the same run's prediction at that temperature for
    the same layout and the engine's draft method; None when that run made none (no ``--temperature``)."""
    if temperature == 0:
        return pred
    for row in pred.at_temperatures or []:
        t, fig = finite(row.get("temperature")), row.get(ENGINE_METHOD)
        if t is None or abs(t - temperature) > 1e-9 or row.get("role") != pred.role or not isinstance(fig, dict):
            continue
        value = finite(fig.get("accept_length"))
        if value is None or value < 1:
            return None
        cond, rows = _probabilities(fig.get("cond_acc")), _ints(fig.get("rows"))
        ci = fig.get("ci")
        rounds = fig.get("per_round")
        walk = finite(rounds.get("accept_length")) if isinstance(rounds, dict) else None
        if walk is not None and walk >= 1 and isinstance(rounds, dict):
            # tokens per round is what a server counts; the mean over positions reads ~20% high at T > 0
            value, ci = walk, rounds.get("ci")
        held = replace(pred, value=value, temperature=t, method=ENGINE_METHOD, greedy_value=pred.value, walk=walk,
                       ci=[float(x) for x in ci] if isinstance(ci, list) and len(ci) == 2 else None,
                       how=f"{pred.how}, at temperature {t:g} ({ENGINE_METHOD} draft"
                           f"{', per round' if walk is not None and walk >= 1 else ''})")
        if pred.role == "served":
            held.cond_served, held.cond_rows_served = cond, rows
        else:
            held.cond_best, held.cond_rows_best = cond, rows
        return held
    return None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _probabilities(value: Any) -> list[float | None] | None:
    """A recorded per-step list of probabilities; an entry that is no number in [0, 1] reads as None
    (an edited or broken row), and anything but a list as no list."""
    if not isinstance(value, list):
        return None
    out: list[float | None] = []
    for v in value:
        x = finite(v)
        out.append(x if x is not None and 0 <= x <= 1 else None)
    return out


def _of_this_config(runs: list[RunRecord], draft: DraftInfo, steps: int) -> Prediction | None:
    """The newest run that evaluated this exact config (same digest)."""
    for r in runs if draft.digest else []:
        if r.draft_digest == draft.digest:
            found = _prediction(r, "served", steps, f"test-drafter run {r.run_id} evaluated this exact config")
            if found:
                return found
    return None


def _of_its_fix(runs: list[RunRecord], draft: DraftInfo, steps: int) -> Prediction | None:
    """The newest run of the same draft whose recommended fix is the layer ids now served."""
    if draft.layer_ids is None:
        return None
    key = "fix_layer_ids_vllm" if draft.layer_id_convention == "vllm" else "fix_layer_ids"
    for r in runs:
        if r.draft == draft.path and _ints(r.metrics.get(key)) == draft.layer_ids:
            found = _prediction(r, "best", steps, f"test-drafter run {r.run_id} recommended the layer ids now "
                                f"served ({ids_text(draft.layer_ids, draft.layer_id_convention)}); this is its "
                                "prediction for them")
            if found:
                return found
    return None


def find_prediction(history: History, result: BenchResult) -> Prediction | None:
    """The newest test-drafter prediction for the served draft at the served step count: first one
    that evaluated this exact config (same digest); else one of the same draft whose recommended
    fix is the layer ids now served (its best-layout prediction then describes this config)."""
    draft, steps = result.draft, result.steps
    if draft is None or steps is None:
        return None
    runs = [r for r in history.query(kind="test-drafter") if r.metrics.get("steps") == steps and r.verdict != "failed"]
    temperature = result.settings.temperature or 0.0
    if temperature == 0:
        return _of_this_config(runs, draft, steps) or _of_its_fix(runs, draft, steps)
    # at T > 0 the newest run that predicted at that temperature, exactly this config first
    for found in (_of_this_config(runs, draft, steps), _of_its_fix(runs, draft, steps)):
        held = at_temperature(found, temperature) if found is not None else None
        if held is not None:
            return held
    for r in runs:
        pick = (_prediction(r, "served", steps, f"test-drafter run {r.run_id} evaluated this exact config")
                if draft.digest and r.draft_digest == draft.digest else None)
        held = at_temperature(pick, temperature) if pick is not None else None
        if held is not None:
            return held
    return None


def current_config(history: History, result: BenchResult) -> tuple[str, str] | None:
    """(digest, run id) of the newest run of this host that recorded the served draft's config digest
    (a serve, bench or test-drafter run): what the draft's config is now, as far as this project saw."""
    draft = result.draft
    if draft is None or not draft.path:
        return None
    for r in history.query(host=result.host.name, draft=draft.path):
        if r.draft == draft.path and r.draft_digest and r.kind != "compare":
            return r.draft_digest, r.run_id
    return None


def ids_text(ids: list[int] | None, convention: str | None) -> str:
    """Layer ids with the engine convention they are written in (``remote.eagle.convention.ids_text``)."""
    from remote.eagle.convention import ids_text as named
    return named(ids, convention)


# --- findings ------------------------------------------------------------------------------------

def _fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _accept(res: BenchResult) -> float | None:
    return res.accept_length.value if res.accept_length else None


def _wiring_hint(res: BenchResult) -> str:
    if res.engine.name == "sglang":
        return ("the layer ids as SGLang reads them (flat config, -1 = embedding), the SGLang capture patch "
                "that an embedding id needs (`invoke patch-sglang`), and the CUDA-graph path (SGLang ≤0.5.10 "
                "replaces custom ids with its defaults during CUDA-graph decode)")
    return ("the layer ids as vLLM reads them (speculators-format config, 0 = embedding) and which field the "
            "config holds them in")


def _accept_findings(label: str, res: BenchResult, pred: Prediction | None, tol: float,
                     current: tuple[str, str] | None = None) -> list[Finding]:
    acc = _accept(res)
    steps = res.steps
    ckpt = shlex.quote(res.draft.path) if res.draft else "CKPT"
    if acc is None:
        return [Finding("warn", "no-accept-length",
                        f"{label} has no measured accept length. SGLang reports it only at decode-log time: "
                        "serve with `--decode-log-interval 1` and bench again.")]
    if pred is None and (res.settings.temperature or 0.0) != 0:
        return []      # the sampling-temperature finding names the test-drafter run to make
    if pred is None:
        digest = res.draft.digest if res.draft and res.draft.digest else "unknown"
        return [Finding("info", "no-prediction",
                        f"No test-drafter prediction for {label}'s draft config (digest {digest}) at {steps} "
                        f"steps, so its accept length {acc:.2f} cannot be judged. Run `invoke test-drafter --ckpt "
                        f"{ckpt} --steps {steps}` to know what it should reach.")]
    ratio = acc / pred.value
    source = f"test-drafter run {pred.run_id}"
    if ratio < 1 - tol:
        return [Finding("bad", "wiring-suspect",
                        f"{label} measured accept length {acc:.2f}, {1 - ratio:.0%} below the {pred.value:.2f} "
                        f"that {source} predicts for this config. The server is not feeding the draft the "
                        f"hidden states it was trained on: suspect the capture wiring, that is {_wiring_hint(res)}. "
                        f"Run `invoke test-drafter --ckpt {ckpt} --steps {steps}` on the served config.")]
    if ratio > 1 + tol:
        return [Finding("warn", "above-prediction",
                        f"{label} measured accept length {acc:.2f}, {ratio - 1:.0%} above the {pred.value:.2f} "
                        f"{source} predicts. The benchmark's text is easier to draft than the evaluation data "
                        "(random token ids, text repeated past its end with ignore-EOS, another language), so "
                        "the two numbers do not describe the same text: bench with prompts like the draft's data.")]
    if (pred.role == "served" and pred.status == "MISMATCH" and pred.best is not None
            and pred.best > pred.value * (1 + tol)):
        return [_config_wrong(label, res, pred, acc, current)]
    return [Finding("good", "draft-limit",
                    f"{label} measured accept length {acc:.2f}, within {tol:.0%} of the {pred.value:.2f} "
                    f"{source} predicts{' for its recommended ids' if pred.role == 'best' else ''}: the wiring is "
                    "right, and the draft itself is the limit. A longer accept length needs a better draft "
                    "(more or closer training data, more TTT steps), not a serving fix.")]


def _config_wrong(label: str, res: BenchResult, pred: Prediction, acc: float,
                  current: tuple[str, str] | None) -> Finding:
    """The run measured what test-drafter predicted for a config it called wrong. The advice depends
    on whether the draft still has that config: once it changed (draft-config ran), telling this
    run's user to run draft-config again is stale advice."""
    fix = ids_text(pred.fix_layer_ids, "sglang") if pred.fix_layer_ids is not None else "its recommended ids"
    ckpt = shlex.quote(res.draft.path) if res.draft else "CKPT"
    said = (f"{label} measured accept length {acc:.2f}, as test-drafter run {pred.run_id} predicted for the "
            f"config it served ({pred.value:.2f}); test-drafter says that config is wrong (MISMATCH) and "
            f"predicts {pred.best:.2f} with {fix}.")
    digest = res.draft.digest if res.draft else None
    if current is not None and digest and current[0] != digest:
        return Finding("info", "config-changed",
                       f"{said} The draft's config has changed since this run (digest {digest} then, "
                       f"{current[0]} in run {current[1]}): this run describes the config before the change. "
                       "Bench the current config to measure the change.")
    return Finding("bad", "config-wrong",
                   f"{said} The server runs exactly what the config says, and the config is wrong. Run "
                   f"`invoke draft-config --ckpt {ckpt} --from-report {pred.run_id}`, serve again and bench.")


def verdicts(a: BenchResult, b: BenchResult, alpha: float = comparison.ALPHA) -> dict[str, comparison.Verdict]:
    """The comparison rule (draftops.comparison) on throughput, accept length (both speculative) and
    the median TTFT and TPOT (where both runs have them)."""
    out = {"throughput": comparison.compare("throughput", samples.blocks(a, "throughput"),
                                            samples.blocks(b, "throughput"), alpha=alpha)}
    if a.accept_length and b.accept_length:
        out["accept_length"] = comparison.compare("accept_length", samples.accept_blocks(a),
                                                  samples.accept_blocks(b), floor=0.0, alpha=alpha)
    for name in ("ttft", "tpot"):
        got = comparison.compare(name, samples.blocks(a, name), samples.blocks(b, name), higher_is_better=False,
                                 alpha=alpha)
        if got.ratio is not None:
            out[name] = got
    return out


def _throughput_findings(a: BenchResult, b: BenchResult, findings_so_far: list[Finding],
                         speed: comparison.Verdict) -> tuple[list[Finding], float | None]:
    ta, tb = a.metrics.output_throughput, b.metrics.output_throughput
    if ta.median is None or tb.median is None or ta.median <= 0 or speed.ratio is None:
        return [Finding("warn", "no-throughput", "One of the runs has no output throughput; nothing to compare.")], None
    ratio = tb.median / ta.median          # `speedup`, the ratio of medians as before; the interval is the rule's
    said = f"{ta.median:.1f} vs {tb.median:.1f} output tok/s (medians), {speed.sentence()}"
    if speed.decision in (comparison.UNDECIDED, comparison.SAME):
        what = ("No decision" if speed.decision == comparison.UNDECIDED
                else f"The same speed within ±{speed.margin:.0%}")
        more = (" More repeats (`invoke bench --repeats N`) or more prompts would tell them apart."
                if speed.decision == comparison.UNDECIDED else "")
        return [Finding("warn" if speed.decision == comparison.UNDECIDED else "info", "within-noise",
                        f"{what} on throughput between {a.run_id} ({a.mode}) and {b.run_id} ({b.mode}): "
                        f"{said}.{more}")], ratio
    out: list[Finding] = []
    if a.mode == "baseline" and b.mode == "speculative":
        acc = _accept(b)
        if speed.decision == comparison.SLOWER:
            wiring = any(f.code in ("wiring-suspect", "config-wrong") for f in findings_so_far)
            why = (" The accept length is lower than it should be (see that finding): fix it first." if wiring else
                   f" At accept length {_fmt(acc)} each verify step yields too few tokens to pay for drafting "
                   f"{b.steps} token(s); try fewer steps, or a better draft.")
            out.append(Finding("bad", "spec-slower", f"Speculative decoding is slower than the baseline: {said}.{why}"))
        else:
            out.append(Finding("good", "spec-faster",
                               f"Speculative decoding is faster than the baseline: {said}, at accept length "
                               f"{_fmt(acc)}."))
    else:
        change = f"{ta.median:.1f} → {tb.median:.1f} output tok/s (medians), {speed.sentence()}"
        if a.mode == b.mode == "speculative":
            change += f"; accept length {_fmt(_accept(a))} → {_fmt(_accept(b))}"
        out.append(Finding("info", "change", f"From {a.run_id} to {b.run_id}: {change}."))
    return out, ratio


Getter = Callable[[BenchResult], Any]
SETTINGS: list[tuple[str, Getter]] = [
    ("host", lambda r: r.host.name), ("GPU", lambda r: r.host.gpu), ("engine", lambda r: r.engine.name),
    ("engine version", lambda r: r.engine.version), ("target", lambda r: r.target),
    ("max running requests", lambda r: r.settings.max_running_requests),
    ("dataset", lambda r: r.settings.dataset), ("input length", lambda r: r.settings.input_len),
    ("output length", lambda r: r.settings.output_len), ("concurrency", lambda r: r.settings.concurrency),
    ("prompts", lambda r: r.settings.prompts), ("seed", lambda r: r.settings.seed),
    ("temperature", lambda r: r.settings.temperature), ("request rate", lambda r: r.settings.request_rate),
    ("ignore EOS", lambda r: r.settings.ignore_eos),
]
SPEC_SETTINGS: list[tuple[str, Getter]] = [
    ("steps", lambda r: r.speculative.num_steps if r.speculative else None),
    ("topk", lambda r: r.speculative.topk if r.speculative else None),
    ("draft tokens", lambda r: r.speculative.num_draft_tokens if r.speculative else None),
]


def _settings_findings(a: BenchResult, b: BenchResult) -> list[Finding]:
    fields = SETTINGS + (SPEC_SETTINGS if a.mode == b.mode == "speculative" else [])
    diffs = [f"{name} {get(a)} vs {get(b)}" for name, get in fields if get(a) != get(b)]
    out = []
    if diffs:
        out.append(Finding("warn", "settings-differ",
                           f"The two runs differ in {'; '.join(diffs)}. Their numbers are not like for like: "
                           "rerun one with the other's settings before drawing conclusions."))
    unset = [r.run_id for r in (a, b) if r.settings.max_running_requests is None]
    if unset:
        out.append(Finding("warn", "max-running-unset",
                           f"Max running requests was not set explicitly for {', '.join(unset)}; SGLang resets it "
                           "to 48 for speculative decoding, so baseline and speculative may run different batch "
                           "limits. Serve both with the same explicit value."))
    return out


def _chat_findings(label: str, res: BenchResult, pred: Prediction | None) -> list[Finding]:
    """The draft's data and the bench's prompts disagree about the chat template (plan.chat_advice)."""
    if pred is None:
        return []
    advice = chat_advice(pred.chat_formatted, bool(res.settings.chat_template), res.engine.name, pred.run_id)
    return [Finding("warn", "chat-template", f"{label}: {advice}")] if advice else []


def _temperature_findings(label: str, res: BenchResult, pred: Prediction | None) -> list[Finding]:
    """``sampling-temperature``: the run sampled at T > 0, so it is held against the prediction at T
    (which it names beside the one at 0), or, without one, against nothing."""
    temperature = res.settings.temperature or 0.0
    if temperature == 0:
        return []
    ckpt = shlex.quote(res.draft.path) if res.draft else "CKPT"
    if pred is None or pred.temperature != temperature:
        return [Finding("warn", "sampling-temperature",
                        f"{label} sampled at temperature {temperature:g}, where a server accepts fewer drafted tokens "
                        "than greedy, and no test-drafter run predicted this config at that temperature, so its "
                        "accept length is held against nothing. Run `invoke test-drafter --ckpt "
                        f"{ckpt} --steps {res.steps} --temperature {temperature:g}`, then compare again.")]
    ci = f" (95% CI {pred.ci[0]:.2f}-{pred.ci[1]:.2f})" if pred.ci else ""
    return [Finding("info", "sampling-temperature",
                    f"{label} sampled at temperature {temperature:g}: test-drafter run {pred.run_id} predicts "
                    f"{pred.value:.2f}{ci} there with a {pred.method} draft ({res.engine.name}'s default), against "
                    f"{_fmt(pred.greedy_value)} at temperature 0; the run is held against the prediction at "
                    f"{temperature:g}.")]


def _run_findings(label: str, res: BenchResult) -> list[Finding]:
    out = []
    if res.status == "failed":
        out.append(Finding("bad", "run-failed",
                           f"{label} failed ({res.failure or 'no reason recorded'}); its numbers cover only what "
                           "was written before the failure."))
    if res.mode == "speculative" and res.settings.temperature is None:
        out.append(Finding("warn", "not-greedy",
                           f"{label} recorded no sampling temperature; accept lengths under sampling are lower, so "
                           "it cannot be told whether test-drafter's greedy prediction applies."))
    if res.mode == "speculative" and res.settings.dataset_kind == "random-ids":
        out.append(Finding("warn", "random-ids",
                           f"{label} used random token ids; accept lengths on noise mean little. Bench with a "
                           "prompt file in the draft's language (`invoke bench --dataset PATH`)."))
    check = res.accept_length.cross_check if res.accept_length else None
    if check and check.get("agree") is False:
        out.append(Finding("warn", "accept-disagree",
                           f"{label}: the two accept-length measurements disagree ({check.get('message')}); the "
                           "measurement window is suspect (warm-up counted, a restart, no cache flush)."))
    return out


def _stat_cell(stat: Stat, digits: int = 1) -> str:
    if stat.median is None:
        return "—"
    spread = f" ±{stat.spread / 2:.0%}" if stat.spread else ""
    return f"{stat.median:.{digits}f}{spread}"


def _metric_getter(name: str) -> Getter:
    return lambda r: getattr(r.metrics, name).median


def _rows(a: BenchResult, b: BenchResult, preds: dict[str, Prediction | None], speedup: float | None,
          speed: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(label: str, get: Getter, show: Callable[[Any], str] = str, text: Getter | None = None) -> None:
        va, vb = get(a), get(b)
        cells = [text(r) if text else ("—" if v is None else show(v)) for r, v in ((a, va), (b, vb))]
        rows.append({"metric": label, "a": va, "b": vb, "a_text": cells[0], "b_text": cells[1]})
    add("run", lambda r: r.run_id)
    add("mode", lambda r: r.mode)
    add("time", lambda r: r.time[:19].replace("T", " "))
    add("status", lambda r: r.status)
    add("output tok/s (± half spread)", lambda r: r.metrics.output_throughput.median,
        text=lambda r: _stat_cell(r.metrics.output_throughput))
    rows.append({"metric": "speedup (b / a)", "a": None, "b": speedup, "a_text": "", "b_text": speed})
    for label, name in (("TTFT median ms", "ttft_median_ms"), ("TTFT p99 ms", "ttft_p99_ms"),
                        ("TPOT median ms", "tpot_median_ms"), ("TPOT p99 ms", "tpot_p99_ms"),
                        ("ITL median ms", "itl_median_ms"), ("ITL p99 ms", "itl_p99_ms")):
        add(label, _metric_getter(name), lambda v: f"{v:.1f}")
    add("accept length (measured)", _accept, lambda v: f"{v:.2f}")
    add("accept length source", lambda r: r.accept_length.source if r.accept_length else None)
    add("accept length client / server",
        lambda r: (f"{_fmt(r.accept_length.client.median if r.accept_length.client else None)} / "
                   f"{_fmt(r.accept_length.server.median if r.accept_length.server else None)}")
        if r.accept_length else None)
    def predicted(r: BenchResult) -> float | None:
        pred = preds.get(r.run_id)
        return pred.value if pred else None

    def walked(r: BenchResult) -> float | None:
        pred = preds.get(r.run_id)
        return pred.walk if pred else None

    def ratio(r: BenchResult) -> float | None:
        pred, acc = predicted(r), _accept(r)
        return acc / pred if pred and acc is not None else None

    def origin(r: BenchResult) -> str | None:
        pred = preds.get(r.run_id)
        return f"{pred.run_id} ({pred.role})" if pred else None
    add("accept length (predicted)", predicted, lambda v: f"{v:.2f}")
    add("accept length (greedy rounds on the dumps)", walked, lambda v: f"{v:.2f}")
    add("prediction from", origin)
    add("measured / predicted", ratio, lambda v: f"{v:.0%}")
    add("steps / topk / draft tokens", lambda r: (f"{r.speculative.num_steps} / {r.speculative.topk} / "
                                                  f"{r.speculative.num_draft_tokens}") if r.speculative else None)
    add("draft", lambda r: r.draft.path if r.draft else None)
    add("draft layer ids", lambda r: r.draft.layer_ids if r.draft else None,
        text=lambda r: ids_text(r.draft.layer_ids, r.draft.layer_id_convention) if r.draft else "—")
    for label, get in SETTINGS[3:]:
        add(label, get)
    return rows


def _newer_config(res: BenchResult, other: BenchResult) -> tuple[str, str] | None:
    """The other run's config when it serves the same draft, later, with another digest."""
    if (res.draft is None or other.draft is None or other.draft.path != res.draft.path
            or not other.draft.digest or other.time <= res.time):
        return None
    return other.draft.digest, other.run_id


def _positions(label: str, res: BenchResult, pred: Prediction | None) -> PositionTable | None:
    """The run's per-position comparison, when it measured per position (or says why not) and its
    prediction recorded per-step acceptance; a prediction for ids test-drafter called wrong also
    shows the trained layout's, which is where such a config parts."""
    if res.mode != "speculative" or res.per_position is None or pred is None or pred.cond is None:
        return None
    trained = pred.cond_best if pred.role == "served" and pred.status == "MISMATCH" else None
    return compare_positions(f"{label} ({res.run_id})", res.run_id, res.per_position, pred.cond,
                             prediction_run=pred.run_id, role=pred.role, trained=trained,
                             predicted_rows=pred.cond_rows,
                             trained_rows=pred.cond_rows_best if trained is not None else None)


def compare(a: BenchResult, b: BenchResult, predictions: dict[str, Prediction | None],
            tolerance: float = TOLERANCE, current: dict[str, tuple[str, str] | None] | None = None,
            alpha: float = comparison.ALPHA) -> Comparison:
    """Hold two runs against each other (a baseline is put first) and derive the findings.

    ``current``: per run id, the draft's config digest now and the run that recorded it
    (:func:`current_config`); without it, a later run of the same draft in the pair stands for it."""
    if a.mode == "speculative" and b.mode == "baseline":
        a, b = b, a
    findings: list[Finding] = []
    for label, res, other in (("run A", a, b), ("run B", b, a)):
        findings += _run_findings(f"{label} ({res.run_id})", res)
        if res.mode == "speculative":
            now = (current or {}).get(res.run_id) or _newer_config(res, other)
            findings += _accept_findings(f"{label} ({res.run_id})", res, predictions.get(res.run_id), tolerance,
                                         now)
            findings += _chat_findings(f"{label} ({res.run_id})", res, predictions.get(res.run_id))
            findings += _temperature_findings(f"{label} ({res.run_id})", res, predictions.get(res.run_id))
    rule = verdicts(a, b, alpha)
    through, speedup = _throughput_findings(a, b, findings, rule["throughput"])
    findings += through + _settings_findings(a, b) + [Finding(*t) for t in _tune_findings(a, b, predictions, rule)]
    tables = [t for t in (_positions(label, res, predictions.get(res.run_id))
                          for label, res in (("run A", a), ("run B", b))) if t is not None]
    findings += [Finding(*t.finding) for t in tables if t.finding]
    findings.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 9))
    noise = max(a.metrics.output_throughput.spread or 0.0, b.metrics.output_throughput.spread or 0.0)
    cmp = Comparison(a=a, b=b, predictions=predictions, findings=findings, speedup=speedup, tolerance=tolerance,
                     noise=noise, positions=tables, verdicts=rule)
    cmp.rows = _rows(a, b, predictions, speedup, cmp.speed_text())
    return cmp


def _tune_findings(a: BenchResult, b: BenchResult, predictions: dict[str, Prediction | None],
                   rule: dict[str, comparison.Verdict]) -> list[tuned.Said]:
    """over-drafting (a speculative run whose prediction knows the acceptance per step) and
    acceptance-drops-with-batch (two speculative runs at two concurrencies): draftops/bench/tuned.py."""
    out = tuned.batch_drop(a, b, rule.get("accept_length"))
    for label, res in (("run A", a), ("run B", b)):
        pred = predictions.get(res.run_id)
        if pred is not None:
            out += tuned.over_drafting(f"{label} ({res.run_id})", res, a if res is b else None, pred.cond,
                                       pred.run_id, rule.get("throughput") if res is b else None)
    return out


def compare_record(cmp: Comparison, run_id: str, git_rev: str | None) -> RunRecord:
    """A bench comparison: which two runs, the speedup, the findings; the verdict is the headline
    finding's code (wiring-suspect, config-wrong, draft-limit, spec-slower, ...)."""
    b = cmp.b
    return RunRecord(
        run_id=run_id, kind="compare", host=b.host.name, git_rev=git_rev, engine=b.engine.name,
        engine_version=b.engine.version, target=b.target, draft=b.draft.path if b.draft else None,
        draft_digest=b.draft.digest if b.draft else None,
        settings={"a": cmp.a.run_id, "b": b.run_id, "tolerance": cmp.tolerance},
        metrics={"speedup": cmp.speedup,
                 "speedup_ci": [cmp.speed.lo, cmp.speed.hi] if cmp.speed else None,
                 "speed_decision": cmp.speed.decision if cmp.speed else None,
                 "accept_length_a": cmp.a.accept_length.value if cmp.a.accept_length else None,
                 "accept_length_b": b.accept_length.value if b.accept_length else None,
                 "findings": [f.code for f in cmp.findings]},
        verdict=cmp.headline.code if cmp.headline else "nothing")
