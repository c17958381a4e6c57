"""`invoke bench.compare` and `invoke runs --local` as a user types them, in a throwaway project whose
runs/ holds bench results and history rows written the way the runner and test-drafter write them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftops.bench.result import DraftInfo
from draftops.history import History
from tests.conftest import BOTH_INSTALLS, REPO, copy_remote_package
from tests.support import bench_runs as runs
from tests.support.tasks import invoke_wide as invoke


@pytest.fixture
def project(make_project, no_inventory_env) -> Path:
    root = make_project()
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    # the project's remote/ is the real one, as in a checkout: invoke puts the project folder first on
    # sys.path, so a stub remote/ there would hide the one draftops imports (remote.bench)
    copy_remote_package(root)
    hist = History(root / "runs" / "history.sqlite")
    report = runs.drafter_report(status="MISMATCH", served=1.50, best=3.60, configured=[1, 4, 7],
                                 fix=[-1, 0, 2], fix_vllm=[0, 1, 3], ckpt="/data/drafts/demo")
    runs.record_prediction(hist, "20261130-090000-test-drafter-aaaa", report, "sha256:aaaa000000000000")
    draft = DraftInfo(path="/data/drafts/demo", digest="sha256:aaaa000000000000", format="speculators",
                      layer_ids=[1, 4, 7], layer_id_convention="vllm")
    runs.save(root, runs.vllm_run("20261130-100000-bench-base", tok_s=[90.0, 91.0, 89.0],
                                  time="2026-11-30T10:00:00Z"), hist)
    runs.save(root, runs.vllm_run("20261130-110000-bench-spec", tok_s=[46.7, 47.0, 46.1], accept=1.53, draft=draft,
                                  time="2026-11-30T11:00:00Z"), hist)
    return root


@pytest.mark.parametrize("laptop", BOTH_INSTALLS, indirect=True)   # the base install drives it too
def test_compare_default_pair_writes_the_folder_and_records_itself(project: Path, laptop: str) -> None:
    done = invoke(project, "bench.compare")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "20261130-100000-bench-base" in done.stdout and "20261130-110000-bench-spec" in done.stdout
    assert "the config is wrong" in done.stdout and "slower than the baseline" in done.stdout
    assert "predicts 3.60 with [-1, 0, 2] (SGLang ids: -1 = embedding)" in done.stdout   # brackets are text, not markup
    folder = next((project / "runs").glob("*-bench-compare-*"))
    assert {p.name for p in folder.iterdir()} == {"compare.json", "compare.md", "compare.png"}
    codes = [f["code"] for f in json.loads((folder / "compare.json").read_text())["findings"]]
    assert codes[:2] == ["config-wrong", "spec-slower"]
    listed = invoke(project, "runs", "--local", "--kind", "compare")
    assert listed.returncode == 0 and folder.name in listed.stdout and "config-wrong" in listed.stdout


def test_compare_explicit_runs_and_bad_arguments(project: Path) -> None:
    done = invoke(project, "bench.compare", "--run-a", "20261130-110000-bench-spec",
                  "--run-b", str(project / "runs" / "20261130-100000-bench-base"))
    assert done.returncode == 0, done.stdout + done.stderr
    for args, needle in ((["--run-a", "20261130-100000-bench-base"], "give both --run-a and --run-b"),
                         (["--run-a", "nope", "--run-b", "20261130-100000-bench-base"], "invoke runs --local"),
                         (["--run-a", "../../etc", "--run-b", "x"], "neither a run id"),
                         (["--tolerance", "2"], "--tolerance"),
                         (["--run-a", "20261130-100000-bench-base", "--run-b", "20261130-100000-bench-base"],
                          "the same run")):
        bad = invoke(project, "bench.compare", *args)
        assert bad.returncode == 1 and needle in bad.stdout + bad.stderr, (args, bad.stdout, bad.stderr)
        assert "Traceback" not in bad.stderr


def test_runs_local_lists_and_filters(project: Path) -> None:
    every = invoke(project, "runs", "--local")
    assert every.returncode == 0, every.stderr
    for run_id in ("20261130-090000-test-drafter-aaaa", "20261130-100000-bench-base", "20261130-110000-bench-spec"):
        assert run_id in every.stdout
    assert "MISMATCH" in every.stdout and "predicted accept 1.50 (best 3.60) at K=3" in every.stdout
    benches = invoke(project, "runs", "--local", "--kind", "bench")
    assert "bench-base" in benches.stdout and "test-drafter-aaaa" not in benches.stdout
    by_draft = invoke(project, "runs", "--local", "--draft", "demo")
    assert "bench-spec" in by_draft.stdout and "test-drafter-aaaa" in by_draft.stdout
    assert "bench-base" not in by_draft.stdout
    since = invoke(project, "runs", "--local", "--since", "2026-11-30T10:30:00Z")
    assert "bench-spec" in since.stdout and "bench-base" not in since.stdout
    bad = invoke(project, "runs", "--local", "--since", "last tuesday")
    assert bad.returncode == 1 and "--since" in bad.stderr and "Traceback" not in bad.stderr


def test_runs_local_with_a_broken_history_file(project: Path) -> None:
    broken = project / "runs" / "history.sqlite"
    broken.write_bytes(b"not a database at all" * 50)
    for name in ("history.sqlite-wal", "history.sqlite-shm"):
        (project / "runs" / name).unlink(missing_ok=True)
    done = invoke(project, "runs", "--local")
    text = " ".join(done.stderr.split())                       # rich may wrap the paragraph
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"mv {broken} {broken}.bad" in text, done.stderr      # the file, and the fix, named
    assert broken.read_bytes() == b"not a database at all" * 50  # nothing lost: left for the user to move
    assert not broken.with_name("history.sqlite.bad").exists()
