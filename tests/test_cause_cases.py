"""Issue 25's generator: every cause case (tests/cause_cases/) evaluated for real in each of the three
dump formats gets exactly its finding ids, each with a fix, and the same verdict in every format;
the healthy case gets none.  About 5 s once the lab draft is cached (about 90 s the first time)."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest

from remote.drafter import EvalOptions, evaluate
from tests.cause_cases import CASES, FORMATS, Case, healthy
from tests.cause_cases.healthy import FAST, REPORTED

Reports = dict[tuple[str, str], dict[str, Any]]


class _Lazy(dict[tuple[str, str], dict[str, Any]]):
    """Each case's three reports, built the first time a test asks for that case (so ``-k`` on a few
    cases builds only those and the healthy one)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, key: tuple[str, str]) -> dict[str, Any]:
        name = key[0]
        case = next(c for c in CASES if c.name == name)
        base = healthy()
        variant = base.complete(case.build(base, self.root / case.name))
        assert variant.data is not None
        for fmt in FORMATS:
            opts = {**FAST, **variant.options}
            with contextlib.redirect_stdout(io.StringIO()):
                self[name, fmt] = evaluate(EvalOptions(ckpt=variant.draft, data=variant.data[fmt],
                                                       verifier=variant.verifier,
                                                       out=self.root / "runs" / case.name / fmt, **opts))
        return dict.__getitem__(self, key)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Reports:
    """Every case x format, evaluated once (in-process ``python -m remote.drafter eval``), on first use."""
    return _Lazy(tmp_path_factory.mktemp("causes"))


def test_the_registry_has_the_healthy_case_and_unique_names() -> None:
    names = [c.name for c in CASES]
    assert names[0] == "healthy" and CASES[0].findings == () and len(set(names)) == len(names)
    assert all(c.findings for c in CASES[1:])   # a broken case names what it must produce


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_case_gets_exactly_its_findings_each_with_a_fix(case: Case, fmt: str, reports: Reports) -> None:
    report = reports[case.name, fmt]
    assert report["data"]["formats"] == [REPORTED[fmt]]
    found = [f["id"] for f in report["findings"]]
    assert tuple(found) == case.findings == tuple(report["verdict"]["findings"]), report["findings"]
    for finding in report["findings"]:
        assert finding["severity"] in ("bad", "warn") and finding["text"].strip() and finding["fix"].strip()
        assert finding["evidence"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_three_formats_give_the_same_verdict(case: Case, reports: Reports) -> None:
    verdicts = {fmt: reports[case.name, fmt]["verdict"] for fmt in FORMATS}
    ref = verdicts["speculators"]
    for fmt, v in verdicts.items():
        assert (v["status"], v["reason"], v["fix_layer_ids"]) == (ref["status"], ref["reason"],
                                                                  ref["fix_layer_ids"]), fmt
        assert [f["evidence"] for f in reports[case.name, fmt]["findings"]] == \
            [f["evidence"] for f in reports[case.name, "speculators"]["findings"]], fmt


def test_the_healthy_case_is_a_match_so_a_finding_elsewhere_is_the_cause(reports: Reports) -> None:
    assert all(reports["healthy", fmt]["verdict"]["status"] == "MATCH" for fmt in FORMATS)


def test_a_case_is_written_under_its_own_folder(tmp_path: Path) -> None:
    base = healthy()
    variant = CASES[1].build(base, tmp_path / "one")
    assert variant.draft.is_relative_to(tmp_path) and base.draft.exists()
