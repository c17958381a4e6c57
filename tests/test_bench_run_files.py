"""A bench run's own files read once into their models (draftops.documents.bench_run) where the result is
built: host.json as `remote.bench.runner.host_facts` writes it gives the draft's format and layer ids;
a host.json or runner.json that fails its model still gives a result, with a warning naming the file
and the field (it used to stop with an AttributeError); and bench-result.json's load uses the shared
reader's checks with its own messages."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from draftops.bench import result as bench_result
from draftops.bench import runner
from draftops.bench.plan import BenchSettings, Client, Server, plan
from draftops.errors import BenchError
from remote.bench.runner import host_facts
from tests.support.drafter_support import demo

RUNNER_OK = {"status": "succeeded", "started": "2026-12-01T10:00:00Z", "ended": "2026-12-01T10:01:00Z",
             "steps": [{"name": "rep1", "exit_code": 0, "server_alive_after": True}]}


@pytest.fixture(scope="module")
def host_json() -> dict[str, Any]:
    """host.json of a run serving the demo's draft with vLLM (this python stands in for the engine's)."""
    d = demo()
    facts: dict[str, Any] = json.loads(json.dumps(host_facts("vllm", sys.executable, str(d.target), str(d.draft))))
    return facts


def _build(folder: Path, runner_doc: Any, host_doc: Any) -> bench_result.BenchResult:
    client = Client.from_probe({"engine": "vllm", "client": "vllm bench serve", "flags": {}}, python="/py")
    bench = plan(client, Server("http://127.0.0.1:1", "/m/t", "/m/t", True), BenchSettings(repeats=1),
                 runner.RUN_DIR_TOKEN)
    served = runner.ServedBy(engine="vllm", port=1, base_url="http://127.0.0.1:1", python="/py", target="/m/t",
                             draft="/m/d", pid=None, log="/x", run_id="serve-1", effective={}, asked={})
    for name, doc in (("runner.json", runner_doc), ("host.json", host_doc)):
        (folder / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    (folder / "client-rep1.json").write_text(json.dumps({"completed": 1, "output_throughput": 5.0}))
    return runner.build(run_id="r", host="h", folder=folder, job=runner.job_plan(bench, served), bench=bench,
                        served=served, job_state="succeeded")


def test_the_runners_host_facts_give_the_drafts_format_and_layer_ids(tmp_path: Path,
                                                                     host_json: dict[str, Any]) -> None:
    seen = host_json["inspect"]["draft"]
    res = _build(tmp_path, RUNNER_OK, host_json)
    assert res.status == "succeeded" and res.time == RUNNER_OK["ended"] and res.draft is not None
    assert res.draft.format == seen["format"] and res.draft.digest == host_json["draft_digest"]
    assert res.draft.layer_ids == seen["ids_by_engine"][seen["native_engine"]]
    assert res.draft.layer_id_convention == seen["native_engine"]
    assert res.host.cpu == host_json["cpu"] and not [w for w in res.warnings if "host.json" in w]


@pytest.mark.parametrize(("change", "field"), [({"gpu": 3}, "gpu"), ({"inspect": "x"}, "inspect"),
                                               ({"inspect": {"draft": {"ids_by_engine": {"vllm": "1,2"}}}},
                                                "inspect.draft.ids_by_engine.vllm")])
def test_a_host_json_that_fails_its_model_still_gives_a_result(tmp_path: Path, host_json: dict[str, Any],
                                                               change: dict[str, Any], field: str) -> None:
    res = _build(tmp_path, RUNNER_OK, {**host_json, **change})
    assert res.status == "succeeded" and res.host.gpu is None and res.draft and res.draft.format is None
    said = [w for w in res.warnings if str(tmp_path / "host.json") in w]
    assert len(said) == 1 and f"field '{field}" in said[0] and "\n" not in said[0]


@pytest.mark.parametrize("doc", [{"status": "succeeded", "steps": "rep1"}, [1, 2], {"status": 3},
                                 {**RUNNER_OK, "steps": [{"name": "rep1", "exit_code": float("nan")}]}])
def test_a_runner_json_that_fails_its_model_gives_a_failed_result_saying_why(tmp_path: Path,
                                                                             host_json: dict[str, Any],
                                                                             doc: Any) -> None:
    res = _build(tmp_path, doc, host_json)
    assert res.status == "failed" and res.failure and "runner.json" in res.failure
    assert [w for w in res.warnings if str(tmp_path / "runner.json") in w]


def test_a_missing_runner_json_is_a_failed_result_as_before(tmp_path: Path, host_json: dict[str, Any]) -> None:
    res = _build(tmp_path, "{", host_json)
    assert res.status == "failed" and res.failure and "(no runner.json)" in res.failure
    assert not [w for w in res.warnings if "runner.json" in w]


def test_a_bench_result_nested_too_deep_is_not_readable_json(tmp_path: Path) -> None:
    path = tmp_path / bench_result.RESULT_NAME
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BenchError, match="not readable JSON .*nested too deep.*Run the benchmark again"):
        bench_result.load(path)
