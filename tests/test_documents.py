"""The JSON documents the remote tools write are read once into their models (draftops.documents):
the tools' real output reads, a key added within the version is kept, and a document of another
version, with NaN or infinity, or with a field of the wrong type is one paragraph naming the file and
the field, never a pydantic traceback. Every reader of a document refuses it the same way."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from draftops.documents import Document, load, parse
from draftops.documents.draft_config import DraftConfigResult
from draftops.documents.draft_flat import DraftFlatResult
from draftops.documents.drafter_report import DrafterReport
from draftops.documents.env_check import EnvCheck
from draftops.documents.serve_inspect import ServeInspect
from draftops.documents.sglang_patch import SglangPatch
from draftops.errors import DocumentError, ToolFailed
from draftops.nightly import results
from draftops.runs.tools import ToolResult
from draftops.serve import verdicts
from tests.conftest import REPO
from tests.support.drafter_support import demo, run_eval

RUN_ID = "20261201-100000-test-drafter-aaaa"
OLDER = "20261130-100000-test-drafter-bbbb"


@pytest.fixture(scope="module")
def report_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report.json the evaluator writes (the demo's draft, on few samples to stay quick)."""
    out = tmp_path_factory.mktemp("runs") / RUN_ID
    run_eval(out, limit=16)
    return out / "report.json"


@pytest.fixture()
def report(report_file: Path) -> dict[str, Any]:
    return json.loads(report_file.read_text())


def test_the_evaluators_report_reads_into_its_model(report_file: Path, report: dict[str, Any]) -> None:
    doc = load(DrafterReport, report_file)
    assert doc.verdict.status == report["verdict"]["status"] == "MISMATCH"
    assert doc.verdict.diagnosis == report["verdict"]["diagnosis"] and doc.verdict.advice == report["verdict"]["advice"]
    assert doc.verdict.fix_layer_ids == report["verdict"]["fix_layer_ids"] and doc.fixable
    assert doc.predicted_accept_length is not None
    assert doc.predicted_accept_length.served == report["predicted_accept_length"]["served"]
    assert doc.predicted_accept_length.walk.best == report["predicted_accept_length"]["walk"]["best"]
    assert doc.checkpoint.path == report["checkpoint"]["path"] and doc.data.samples == 16
    assert [r.rms for r in doc.slot_norms] == [r["rms"] for r in report["slot_norms"]]


def test_a_key_added_within_the_version_is_kept(report: dict[str, Any]) -> None:
    report["added_later"] = {"x": 1}
    report["verdict"]["added_too"] = [1, 2]
    doc = parse(DrafterReport, report, "report.json")
    assert (doc.model_extra or {})["added_later"] == {"x": 1}
    assert (doc.verdict.model_extra or {})["added_too"] == [1, 2]


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``doc`` with the value at the dotted ``path`` (list indices as numbers) replaced."""
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    here: Any = doc
    for key in parents:
        here = here[int(key)] if isinstance(here, list) else here[key]
    here[int(last) if isinstance(here, list) else last] = value
    return doc


# (what is changed, to what, the words the message must hold)
BROKEN = [
    ("schema", "draftops.drafter-report/2",
     "'draftops.drafter-report/2'; this draftops reads draftops.drafter-report/1"),
    ("predicted_accept_length.served", float("nan"), "field 'predicted_accept_length.served' is not a finite"),
    ("verdict.comparison.gain", float("inf"), "field 'verdict.comparison.gain' is not a finite"),
    ("slot_norms.0.rms", -float("inf"), "field 'slot_norms.0.rms' is not a finite"),
    ("verdict.fix_layer_ids", "-1,1,3", "field 'verdict.fix_layer_ids'"),
    ("verdict.status", 3, "field 'verdict.status'"),
    ("checkpoint", ["not", "an", "object"], "field 'checkpoint'"),
    ("slot_norms.0.rms", "0.5x", "field 'slot_norms.0.rms'"),
    ("metrics.served.verifier.full_acc", {"0": 1.0}, "field 'metrics.served.verifier.full_acc'"),
]


def _refusal(call: Callable[[], Any]) -> str:
    with pytest.raises(DocumentError) as caught:
        call()
    text = str(caught.value)
    assert "\n" not in text and "pydantic" not in text and "validation error" not in text.lower()
    return text


@pytest.mark.parametrize(("path", "value", "said"), BROKEN, ids=[f"{p}={v!r}" for p, v, _ in BROKEN])
def test_a_broken_report_is_one_paragraph_naming_file_and_field(report: dict[str, Any], tmp_path: Path,
                                                                path: str, value: Any, said: str) -> None:
    file = tmp_path / "report.json"
    file.write_text(json.dumps(_set(report, path, value)))      # json writes NaN and Infinity as they come
    text = _refusal(lambda: load(DrafterReport, file))
    assert str(file) in text and said in text and "invoke test-drafter" in text


@pytest.mark.parametrize("raw", ['{"schema": "draftops.drafter-report/1", "verdict": {"sta', "[]", "",
                                 "[" * 100_000 + "]" * 100_000, "\xff\xfe"])
def test_a_report_that_is_no_json_object_is_one_paragraph(raw: str, tmp_path: Path) -> None:
    file = tmp_path / "report.json"
    file.write_bytes(raw.encode("latin-1") if raw == "\xff\xfe" else raw.encode())
    assert str(file) in _refusal(lambda: load(DrafterReport, file))


def test_the_tool_result_reads_its_file_into_the_model_once(report: dict[str, Any], tmp_path: Path) -> None:
    done = ToolResult("box", RUN_ID, {"state": "succeeded"}, result_file=tmp_path / "report.json", data=report)
    assert done.document(DrafterReport).verdict.status == "MISMATCH"              # type: ignore[union-attr]
    assert ToolResult("box", RUN_ID, {"state": "failed"}).document(DrafterReport) is None
    broken = ToolResult("box", RUN_ID, {"state": "succeeded"}, result_file=tmp_path / "report.json",
                        data=_set(report, "verdict.fix_layer_ids", [1.5]))
    said = _refusal(lambda: broken.document(DrafterReport))
    assert f"{tmp_path / 'report.json'}: field 'verdict.fix_layer_ids.0'" in said
    broken.final = {"state": "failed", "exit_code": 4, "outcome": {"error": "the evaluator crashed"}}
    with pytest.raises(ToolFailed, match="the evaluator crashed"):      # the run's reason comes first
        broken.document(DrafterReport)


def test_serves_verdict_lookup_and_the_nightly_metric_pass_over_a_report_that_fails_its_model(
        report: dict[str, Any], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for run_id, doc in ((RUN_ID, _set(report, "verdict.fix_layer_ids", "-1,1,3")), (OLDER, report)):
        (runs / run_id).mkdir(parents=True)
        (runs / run_id / "report.json").write_text(json.dumps(doc))
    found = verdicts.latest(runs, report["checkpoint"]["path"])
    assert found is not None and found.run_id == OLDER and found.status == "MISMATCH"
    assert found.accept_best == report["predicted_accept_length"]["best"]
    assert results._report_step0(runs / RUN_ID / "report.json") is None
    assert results._report_step0(runs / OLDER / "report.json") == report["metrics"]["served"]["verifier"]["full_acc"][0]


def _tool(tmp_path: Path, module: str, *args: str) -> Path:
    """Run a remote tool as the host would (``python -m``) with ``--out``; the folder it wrote into."""
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", module, *args, "--out", str(out)], cwd=REPO, capture_output=True,
                   timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    return out


def _draft_config(tmp_path: Path) -> Path:
    ckpt = shutil.copytree(demo().draft, tmp_path / "draft")
    return _tool(tmp_path, "remote.draft_config", "--ckpt", str(ckpt), "--layer-ids", "-1,1,3", "--dry-run") \
        / "draft_config.json"


def _draft_flat(tmp_path: Path) -> Path:
    return _tool(tmp_path, "remote.draft_flat", "--ckpt", str(demo().root / "draft_fixed"), "--dest",
                 str(tmp_path / "flat")) / "draft_flat.json"


def _sglang_patch(tmp_path: Path) -> Path:
    """patch.json of a status on a python without SGLang (the tool's refusal still writes it)."""
    return _tool(tmp_path, "remote.sglang_patch", "status", "--state-dir", str(tmp_path / "state")) / "patch.json"


def _env_check(tmp_path: Path) -> Path:
    """env.json of this python (torch without CUDA here; the GPU rows are read in test_env_document)."""
    return _tool(tmp_path, "remote.envcheck") / "env.json"


TOOLS: dict[str, tuple[type[Document], Callable[[Path], Path], str, Any]] = {
    "draft-config": (DraftConfigResult, _draft_config, "written_ids", "-1,1,3"),
    "draft-flat": (DraftFlatResult, _draft_flat, "layer_ids", "-1,1,3"),
    "sglang-patch": (SglangPatch, _sglang_patch, "files", {"file": "x"}),
    "env-check": (EnvCheck, _env_check, "packages", ["torch"]),
}


@pytest.mark.parametrize("name", TOOLS)
def test_each_tools_real_result_reads_and_a_broken_one_is_one_paragraph(name: str, tmp_path: Path) -> None:
    model, make, field, wrong = TOOLS[name]
    path = make(tmp_path)
    doc = json.loads(path.read_text())
    assert load(model, path).model_dump(by_alias=True)[field] == doc[field]
    for change, said in (({"schema": f"{model.SCHEMA[:-1]}2"}, f"this draftops reads {model.SCHEMA}"),
                         ({field: wrong}, f"field '{field}"), ({"ok": float("nan")}, "field 'ok' is not a finite")):
        path.write_text(json.dumps({**doc, **change}))
        text = _refusal(lambda: load(model, path))
        assert str(path) in text and said in text and model.TASK in text


def _inspect_answer(tmp_path: Path) -> dict[str, Any]:
    """What `remote.serve inspect` answers about the demo's target and draft (its stdout's JSON)."""
    d = demo()
    done = subprocess.run([sys.executable, "-m", "remote.serve", "inspect", "--engine", "sglang", "--target",
                           str(d.target), "--draft", str(d.draft), "--sglang-status"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


def test_the_serve_inspect_answer_reads_and_a_broken_one_is_one_paragraph(tmp_path: Path) -> None:
    answer = _inspect_answer(tmp_path)
    facts = parse(ServeInspect, answer, "the answer of `remote.serve inspect` on host 'box'")
    assert facts.draft and facts.draft.reading and answer["draft"]["reading"]["ids"] == facts.draft.reading.ids
    assert facts.draft.ids_by_engine == answer["draft"]["ids_by_engine"] and facts.target
    assert facts.target.num_hidden_layers == answer["target"]["num_hidden_layers"]
    for path, value, said in (("schema", "draftops.serve-inspect/2", "this draftops reads draftops.serve-inspect/1"),
                              ("draft.reading.ids", "1,2", "field 'draft.reading.ids'"),
                              ("target.num_hidden_layers", float("nan"), "field 'target.num_hidden_layers' is not"),
                              ("engine.importable", "maybe", "field 'engine.importable'")):
        broken = _set(answer, path, value)
        text = _refusal(lambda: parse(ServeInspect, broken, "the answer on host 'box'"))  # noqa: B023
        assert "the answer on host 'box'" in text and said in text and "invoke serve" in text
