"""``draftops.bench-compare/1`` (compare.json) read through its one model, documents/bench_compare.py
(issue 37, item 6): what bench.compare writes is what the model reads, the schema string is written
once, and the nightly run reads a comparison's findings through it, a tampered file being one ✗
finding that names the file and the field."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from draftops.bench import compare as comparing
from draftops.documents import load
from draftops.documents.bench_compare import SCHEMA, BenchCompare
from draftops.history import History, RunRecord
from draftops.nightly import results
from tests.support import bench_runs as runs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def written(tmp_path: Path) -> dict:
    """A real comparison's compare.json document, as bench.compare writes it."""
    hist = History(tmp_path / "runs" / "history.sqlite")
    base = runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0])
    spec = runs.vllm_run("spec", tok_s=[150.0, 152.0, 149.0], accept=2.5)
    cmp = comparing.compare(base, spec, {r.run_id: comparing.find_prediction(hist, r) for r in (base, spec)})
    return json.loads(json.dumps(cmp.to_dict()))


def compare_run(root: Path, doc: object | bytes) -> tuple[RunRecord, Path]:
    folder = root / "runs" / "cmp-1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "compare.json").write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return RunRecord(run_id="cmp-1", kind="compare", host="local", verdict="faster"), folder / "compare.json"


def test_what_bench_compare_writes_is_what_the_model_reads(written: dict, tmp_path: Path):
    assert written["schema"] == SCHEMA
    path = compare_run(tmp_path, written)[1]
    doc = load(BenchCompare, path)
    assert (doc.a, doc.b, doc.speedup) == ("base", "spec", pytest.approx(written["speedup"]))
    assert [(f.severity, f.code, f.text) for f in doc.findings] == [
        (f["severity"], f["code"], f["text"]) for f in written["findings"]] != []
    assert doc.model_extra is not None and "rows" in doc.model_extra        # the rest kept as written


def test_the_nightly_run_reads_the_findings_through_the_model(written: dict, tmp_path: Path):
    run, _ = compare_run(tmp_path, written)
    found = results.findings_of([run], tmp_path)
    assert [(f.severity, f.code) for f in found] == [(f["severity"], f["code"]) for f in written["findings"]]


@pytest.mark.parametrize("tamper, named", [
    (lambda d: {**d, "schema": "draftops.bench-compare/2"}, "draftops.bench-compare/2"),
    (lambda d: {**d, "findings": "none"}, "field 'findings'"),
    (lambda d: {**d, "findings": [{"severity": "bad", "code": "x"}]}, "field 'findings.0.text'"),
    (lambda d: {**d, "speedup": float("nan")}, "field 'speedup' is not a finite number"),
    (lambda d: b"[" * 100000 + b"]" * 100000, "nested too deep"),
    (lambda d: b"\x1b[31m{", "not readable JSON"),
], ids=["version", "findings-not-a-list", "finding-without-text", "nan", "deep", "escape"])
def test_a_tampered_compare_json_is_one_bad_finding_naming_file_and_field(written, tmp_path, tamper, named):
    run, path = compare_run(tmp_path, tamper(written))
    (finding,) = results.findings_of([run], tmp_path)
    assert (finding.severity, finding.code) == ("bad", "compare-unreadable")
    assert str(path) in finding.text and named in finding.text and "invoke bench.compare" in finding.text


def test_a_fifo_in_place_of_compare_json_is_not_waited_on(written, tmp_path):
    run, path = compare_run(tmp_path, written)
    path.unlink()
    os.mkfifo(path)
    (finding,) = results.findings_of([run], tmp_path)        # would block for ever on open()
    assert finding.code == "compare-unreadable" and "FIFO" in finding.text


def test_the_schema_string_is_written_once():
    uses = [str(p.relative_to(REPO)) for p in sorted((REPO / "draftops").rglob("*.py"))
            if SCHEMA in p.read_text()]
    assert uses == ["draftops/documents/bench_compare.py"]


def test_a_fifo_in_place_of_bench_result_json_is_not_waited_on(tmp_path):
    folder = tmp_path / "runs" / "b-1"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "bench-result.json")
    run = RunRecord(run_id="b-1", kind="bench", host="local", verdict="ok")
    (finding,) = results.findings_of([run], tmp_path)        # would block for ever on open()
    assert finding.code == "bench-result-unreadable" and "FIFO" in finding.text
