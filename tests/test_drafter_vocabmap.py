"""Vocabulary-map findings (issue 25, cause 6): broken copies of the demo draft, evaluated for real,
each get exactly their finding; the healthy demo gets none; serve refuses a `bad` one unless --force."""
from __future__ import annotations

import io
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from draftops.documents import load, parse
from draftops.documents.drafter_report import DrafterReport
from draftops.documents.serve_inspect import ServeInspect
from draftops.inventory import HostSpec, ServeProfile
from draftops.report import show
from draftops.serve import checks, profiles, verdicts
from draftops.serve.request import Request, demo_dir, resolve
from remote.drafter.data.dumps import DumpSet
from remote.drafter.load import vocabmap
from remote.serve.configs import inspect
from tests.cause_cases.healthy import rewrite_draft
from tests.cause_cases.vocab import arange_d2t, rare_map, zeros_d2t
from tests.support.drafter_support import demo, run_eval

RUN_ID = "20261201-000000-test-drafter-vocab"


def broken_copy(tmp: Path, name: str, change: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """The demo draft with its tensors edited by ``change`` (the cause generator's map breakers)."""
    return rewrite_draft(demo().draft, tmp / name, change)


def rare_vocab(weights: dict[str, torch.Tensor]) -> None:
    """A valid map onto the target ids the demo dumps use least: consistent d2t/t2d, low coverage."""
    dumps = DumpSet.open(demo().data)
    ids = torch.cat([dumps.load(i).token_ids for i in range(min(32, len(dumps.files)))])
    weights["d2t"], weights["t2d"] = rare_map(weights["d2t"].shape[0], weights["t2d"].shape[0], ids)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("vocab")
    drafts = {"healthy": demo().draft,
              "zeros": broken_copy(tmp, "zeros", zeros_d2t),
              "arange": broken_copy(tmp, "arange", arange_d2t),
              "rare": broken_copy(tmp, "rare", rare_vocab)}
    return {name: run_eval(tmp / "runs" / name, ckpt=ckpt, limit=64) for name, ckpt in drafts.items()}


def ids(report: dict[str, Any]) -> list[str]:
    return [f["id"] for f in report["findings"]]


def test_the_healthy_demo_has_no_vocab_finding_and_a_coverage_share(reports):
    report = reports["healthy"]
    assert ids(report) == ["layer-convention-shift"]   # the demo's own bug (the seed's), no vocab finding
    cov = report["data"]["vocab_coverage"]
    assert 0 < cov["share"] <= 1 and cov["share"] >= vocabmap.COVERAGE_WARN
    assert cov["scored_tokens"] > 0 and cov["share_by_t2d"] == cov["share"]
    assert report["checkpoint"]["vocab_map"]["pattern"] is None
    assert report["checkpoint"]["vocab_map"]["t2d_agrees"] is True


@pytest.mark.parametrize("name, pattern, self_mapped", [("zeros", "identity", 48), ("arange", "arange", 1)])
def test_an_identity_or_arange_map_is_the_bad_finding_with_its_numbers(reports, name, pattern, self_mapped):
    report, healthy = reports[name], reports["healthy"]
    assert ids(report) == ["vocab-map-identity"] == report["verdict"]["findings"]
    finding = report["findings"][0]
    ev = finding["evidence"]
    assert finding["severity"] == "bad" and ev["pattern"] == pattern
    assert ev["draft_vocab"] == 48 and ev["target_vocab"] == 64 and ev["self_mapped"] == self_mapped
    assert ev["t2d_agrees"] is False and ev["share_by_t2d"] == healthy["data"]["vocab_coverage"]["share"]
    assert 0 < ev["share"] < healthy["data"]["vocab_coverage"]["share"]
    assert f"{ev['share']:.1%}" in finding["text"] and "vocab_mapping.pt" in finding["fix"]
    if pattern == "arange":
        assert ev["out_of_range"] == 16 and "2i" in finding["text"]


def test_a_valid_map_onto_rare_ids_is_the_coverage_warning(reports):
    report = reports["rare"]
    assert ids(report) == ["vocab-map-coverage"]
    finding = report["findings"][0]
    cov = report["data"]["vocab_coverage"]
    assert finding["severity"] == "warn" and cov["share"] < vocabmap.COVERAGE_WARN
    assert finding["evidence"]["share"] == cov["share"] and report["checkpoint"]["vocab_map"]["t2d_agrees"]
    top = cov["top_missing"]
    assert top and str(top[0]["target_id"]) in finding["text"]
    assert [m["count"] for m in top] == sorted((m["count"] for m in top), reverse=True)


def test_the_report_view_shows_findings_after_the_verdict(reports, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(reports["zeros"]))
    console = Console(file=io.StringIO(), width=400, record=True)
    show(load(DrafterReport, path), console)
    text = console.export_text()
    assert text.index("verdict") < text.index("bad vocab-map-identity") and "fix: Copy d2t" in text


def _serve_findings(tmp_path: Path, draft: Path, force: bool) -> checks.Findings:
    state = tmp_path / "state"
    if not state.exists():
        shutil.copytree(demo().root, state / "demo")
    spec = HostSpec(name="box", address="box.example", engine="vllm",
                    serve={"p": ServeProfile(python=sys.executable, max_running_requests=8)})
    plan = resolve(Request(draft=str(draft), target=str(state / "demo" / "target"), force=force),
                   profiles.resolve(spec), demo_dir(str(state)))
    facts = parse(ServeInspect, inspect("vllm", Path(plan.launch.target), draft, sglang_status=False),
                  "the inspect answer")
    facts.engine.importable = True
    found = checks.Findings()
    checks.fact_checks(plan, facts, verdicts.latest(tmp_path / "runs", str(draft)), found)
    return found


def test_serve_refuses_a_draft_whose_latest_report_holds_a_bad_finding_unless_forced(tmp_path):
    mine = broken_copy(tmp_path, "mine", zeros_d2t)
    run_eval(tmp_path / "runs" / RUN_ID, ckpt=mine, limit=16)
    refused = [r for r in _serve_findings(tmp_path, mine, force=False).refusals if "vocab-map-identity" in r]
    assert len(refused) == 1 and "vocab_mapping.pt" in refused[0] and "--force" in refused[0]
    forced = _serve_findings(tmp_path, mine, force=True)
    assert not any("vocab-map-identity" in r for r in forced.refusals)
    assert any("vocab-map-identity" in w and "Serving anyway (--force)" in w for w in forced.warnings)
