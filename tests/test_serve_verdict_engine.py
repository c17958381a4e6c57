"""`invoke serve` on vLLM does not repeat a verdict judged for SGLang: a test-drafter report made on an
SGLang host judges the ids as SGLang reads them (a speculators config's field SGLang never reads, the
`draft-flat` fix, the capture patch); vLLM reads that field, so serving the same draft with vLLM shows
that verdict as a note, without its warning, refusal or fix. Real files: the generated demo's fixed
draft, the drafter's own report, and the host tool's reading of the draft for each engine."""
from __future__ import annotations

import sys
from pathlib import Path

from draftops.documents import parse
from draftops.documents.serve_inspect import ServeInspect
from draftops.inventory import HostSpec, ServeProfile
from draftops.serve import checks, profiles, verdicts
from draftops.serve.request import Request, resolve
from remote.serve.configs import inspect
from tests.support.drafter_support import demo, run_eval

RUN_ID = "20261206-060000-test-drafter-c0de"


def findings(engine: str, draft: Path, runs: Path) -> checks.Findings:
    """The pre-start findings of `serve --draft DRAFT` on a profile of ``engine`` (demo target)."""
    spec = HostSpec(name="box", address="box.example", engine=engine,
                    serve={"p": ServeProfile(python=sys.executable, target=str(demo().target),
                                             max_running_requests=8)})
    plan = resolve(Request(draft=str(draft), steps=3, topk=1, draft_tokens=4) if engine == "sglang"
                   else Request(draft=str(draft)), profiles.resolve(spec), "/unused/demo")
    facts = parse(ServeInspect, inspect(engine, demo().target, draft, sglang_status=False), "the inspect answer")
    facts.engine.importable = True            # as the profile's engine python would see it
    found = checks.Findings()
    checks.fact_checks(plan, facts, verdicts.latest(runs, str(draft)), found)
    return found


def test_a_verdict_judged_for_sglang_is_not_repeated_as_a_warning_or_refusal_on_vllm(tmp_path: Path) -> None:
    ckpt = demo().root / "draft_fixed"          # speculators format, the trained ids: vLLM reads them as trained
    run_eval(tmp_path / "runs" / RUN_ID, ckpt=ckpt, engine="sglang", engine_version="0.5.13")
    verdict = verdicts.latest(tmp_path / "runs", str(ckpt))
    assert verdict is not None and verdict.status == "MISMATCH" and verdict.serving_convention == "sglang"

    on_sglang = findings("sglang", ckpt, tmp_path / "runs")     # where it was judged: refused, as before
    assert any("is MISMATCH" in r and RUN_ID in r for r in on_sglang.refusals)

    on_vllm = findings("vllm", ckpt, tmp_path / "runs")
    said = on_vllm.refusals + on_vllm.warnings
    assert not any("MISMATCH" in s or "SGLang" in s or "draft-flat" in s or "patch-sglang" in s for s in said), said
    note = next(n for n in on_vllm.notes if RUN_ID in n)
    assert "judged as SGLang reads the ids" in note and "do not apply here" in note
