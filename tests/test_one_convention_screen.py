"""test-drafter's whole screen in one layer-id convention, the host engine's own, named once above
the tables (issue 35, item 8): the slot, layouts and metrics tables, the verdict's diagnosis and its
fix line. The report stores SGLang ids; a vLLM host reads them shifted by one. Real evaluator runs on
the demo, rendered by the real show function at 80 columns."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from draftops.cli.drafter import show_result
from draftops.documents import parse
from draftops.documents.drafter_report import DrafterReport
from remote.eagle import convention
from tests.support.drafter_support import run_eval

ID_LIST = re.compile(r"\[(-?\d+(?:, -?\d+)*)\]")
OTHER = {"vllm": "SGLang", "sglang": "vLLM ids"}


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def screen(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], str]:
    engine = request.param
    extra = {"engine_version": "0.5.13"} if engine == "sglang" else {}
    report = run_eval(tmp_path_factory.mktemp(engine), engine=engine, limit=64, **extra)
    out = io.StringIO()
    doc = parse(DrafterReport, json.loads(json.dumps(report)), "report.json")
    show_result(doc, "runs/x/report.json", "RUN", "demo", Console(file=out, width=80, color_system=None))
    return engine, report, out.getvalue()


def table_ids(text: str, title: str, end: str) -> list[str]:
    """The id lists in the first column of the table whose title starts with ``title``."""
    part = text[text.index(title):text.index(end)]
    return [m.group(0) for line in part.splitlines() if line.startswith("│ ")
            for m in [ID_LIST.search(line.split("│")[1])] if m]


def test_every_id_list_is_in_the_host_engines_convention_named_once(screen: tuple[str, dict[str, Any], str]) -> None:
    engine, report, text = screen
    name = convention.NAMED[engine]
    assert text.splitlines()[0] == f"layer ids below: {name} (the host engine's convention)", text
    assert OTHER[engine] not in text, text
    own = [str(convention.convert(row["layer_ids"], convention.SGLANG, engine)) for row in report["layouts"]]
    assert table_ids(text, "aux layouts", "per-step") == [
        own[i] for i in sorted(range(len(own)), key=lambda i: -(report["layouts"][i]["acc"] or 0.0))]
    best = str(convention.convert(report["metrics"]["best"]["layer_ids"], convention.SGLANG, engine))
    metrics = text[text.index("per-step"):text.index("─ verdict ─")]
    first = " ".join(line.split("│")[1].strip() for line in metrics.splitlines() if line.startswith("│ "))
    assert f"best {best}" in first.replace("[ ", "[").replace(",  ", ", "), first
    fix = report["verdict"]["fix_layer_ids" if engine == "sglang" else "fix_layer_ids_vllm"]
    assert f"= {fix} ({name}" in " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split()), text
    slots = text[:text.index("aux layouts")]
    assert f"{convention.ENGINE_NAME[engine]} id " in slots and "layer 1 " not in slots
    if engine == "vllm":      # the embedding is 0 in vLLM's ids: no list on the screen holds -1
        assert not [m for m in ID_LIST.findall(text) if "-1" in m.split(", ")], text
    else:
        assert "[-1, " in text


def test_the_diagnosis_names_the_layers_in_the_served_engines_ids(screen: tuple[str, dict[str, Any], str]) -> None:
    engine, report, _ = screen
    diagnosis = report["verdict"]["diagnosis"]
    assert convention.NAMED[engine] in diagnosis and OTHER[engine] not in diagnosis, diagnosis
    assert "[embedding," not in diagnosis, diagnosis


def test_the_doctors_report_writes_its_layers_in_the_host_engines_ids(tmp_path: Path) -> None:
    """The doctor's "what training fed" section: the dumped slots (stored as SGLang ids) in the host
    engine's ids, the convention named once; the fix's written ids named beside them."""
    from draftops.doctor import report
    from tests.support.doctor import synthetic
    made = synthetic(tmp_path)
    made.step("check").outcome["advice_engine"] = "vllm"
    made.step("check").outcome["trained_slots"] = [{"slot": 0, "layer_id": -1, "role": "embedding"},
                                                   {"slot": 1, "layer_id": 1, "role": "layer 1"}]
    made.step("check").outcome["format"] = "speculators"
    text = report.markdown(report.Story(made), None).replace("\\[", "[").replace("\\]", "]")
    fed = text[text.index("## What training fed"):text.index("## Findings")]
    assert "layer ids in this section: vLLM ids: 0 = embedding (the host engine's convention)" in fed, fed
    assert "slot 0 = 0 (embedding), slot 1 = 2 (layer output)" in fed and "SGLang" not in fed, fed
    assert "which vLLM reads as dumped slots" in fed
    fix = text[text.index("## The fix"):text.index("## Predicted")]
    assert "→ [0, 2, 4] (vLLM ids: 0 = embedding)" in fix, fix
