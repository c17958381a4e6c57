"""tune's SGLang branch through the SGLang double (tests/doubles/sglang: SGLang 0.5.10's flags, its
topk=1 adjustment, `/get_server_info` and bench_serving's JSONL): a tree setting served with
`invoke serve`, benched with `invoke bench`, and read back as tune's measured point keyed by what the
server really ran; the answer's three flags as a pasteable line that SGLang's parser takes; and the
whole `invoke tune` on a host whose engine is the double (trees predicted, the best confirmed, the
flags and the serve command, nothing left running)."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from draftops.bench import result
from draftops.tune import sglang, trees
from tests.conftest import REPO, copy_remote_package
from tests.test_bench_run_ssh import bench_folder, prompts_file
from tests.test_env_ssh import invoke
from tests.test_serve_ssh import (
    DOUBLES,
    draft_config,
    ok,
    processes_of_runs_under,
    profile,
    stop_processes,
    write_model,
)


@pytest.fixture
def loc(make_project, tmp_path: Path, no_inventory_env):
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot"),
                                 "serve": {"default": profile(tmp_path)}}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    yield root
    stop_processes(processes_of_runs_under(tmp_path))


def _served_point(root: Path, tmp_path: Path, draft: str, flags: list[str],
                  asked: trees.TreeSetting) -> sglang.Point:
    ok(invoke(root, "serve", "--draft", draft, *flags))
    try:
        out = ok(invoke(root, "bench", "--prompts", "4", "--repeats", "2", "--output-len", "16", "--concurrency", "2",
                        "--dataset", prompts_file(tmp_path)))
    finally:
        ok(invoke(root, "serve.stop", "--all"))
    return sglang.measured(result.load(bench_folder(root, out)), asked)


def test_a_tree_setting_is_served_benched_and_read_back(loc: Path, tmp_path: Path) -> None:
    draft = write_model(tmp_path / "draft", draft_config([1, 15, 28]))
    tree = trees.TreeSetting(3, 2, 6)
    assert sglang.serve_args(tree) == ["--steps", "3", "--topk", "2", "--draft-tokens", "6"]
    point = _served_point(loc, tmp_path, draft, sglang.serve_args(tree), tree)
    assert point.setting == tree and point.adjusted is None
    assert point.concurrency == 2 and point.tok_s is not None and point.tok_s > 0
    assert point.accept_length is not None and 1.0 <= point.accept_length <= 4.0
    row = point.to_dict()
    assert (row["k"], row["topk"], row["draft_tokens"], row["concurrency"]) == (3, 2, 6, 2)


def test_sglangs_topk_one_adjustment_keys_the_point_by_what_it_served(loc: Path, tmp_path: Path) -> None:
    draft = write_model(tmp_path / "draft", draft_config([1, 15, 28]))
    asked = trees.TreeSetting(3, 1, 16)              # SGLang serves 4 draft tokens for this
    point = _served_point(loc, tmp_path, draft, ["--steps", "3", "--topk", "1", "--draft-tokens", "16",
                                                      "--allow-override"], asked)
    assert point.setting.effective_draft_tokens == 4 and point.setting.topk == 1
    assert point.adjusted == ("SGLang served draft tokens 16 → 4 (SGLang sets draft tokens to steps + 1 "
                              "with topk 1)")


def test_a_baseline_or_vllm_bench_is_not_a_tree_point() -> None:
    from tests.support import bench_runs as runs
    with pytest.raises(sglang.NotATree, match="not an SGLang speculative run"):
        sglang.measured(runs.vllm_run("v", tok_s=[100.0], accept=2.0,
                                      draft=result.DraftInfo(path="/m/draft")))
    with pytest.raises(sglang.NotATree, match="baseline"):
        sglang.measured(runs.sglang_run("b", tok_s=[100.0]))


@pytest.mark.parametrize("setting", [trees.TreeSetting(3, 1), trees.TreeSetting(4, 2, 8), trees.TreeSetting(5, 4, 16)])
def test_the_answer_is_a_line_sglangs_own_parser_takes(setting: trees.TreeSetting) -> None:
    answer = sglang.engine_args(setting)
    assert shlex.split(answer["line"]) == answer["args"]
    # the double's launch_server has SGLang 0.5.10's parser and post-init checks (the topk=1
    # adjustment): it prints the effective values it would serve
    code = ("import sys; from sglang.launch_server import ServerArgs, build_parser; "
            "a = ServerArgs(**vars(build_parser().parse_args(sys.argv[1:]))); "
            "print(a.speculative_num_steps, a.speculative_eagle_topk, a.speculative_num_draft_tokens)")
    args = ["--model-path", "/m/target", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
            "/m/draft", *shlex.split(answer["line"])]
    got = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(DOUBLES), "PATH": "/usr/bin:/bin"})
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [str(setting.steps), str(setting.topk), str(setting.effective_draft_tokens)]
    assert sglang.serve_command("/m/my draft", setting, host="loc").split(" serve ", 1)[1].startswith(
        "--draft '/m/my draft' --steps")


# --- `invoke tune` on an SGLang host, end to end through the double ------------------------------------

@pytest.fixture
def sglang_demo(tmp_path: Path, no_inventory_env) -> Path:
    """A project whose default host `loc` (local) serves the demo's target with the SGLang double, the
    demo generated in the host's state; each verification round of the double takes 4 ms whatever it
    verifies (as a GPU below compute-bound), so the round's cost is flat in the draft tokens."""
    from tests.support.drafter_support import task_project
    root = tmp_path / "locroot"
    entry = profile(tmp_path, {"DRAFTOPS_SGLANG_DOUBLE_ROUND_MS": "4,0"}, target=str(root / "state/demo/target"))
    yield task_project(tmp_path, {"loc": {"transport": "local", "root": str(root), "serve": {"default": entry}}},
                       "loc", demo_roots=(root,))
    stop_processes(processes_of_runs_under(tmp_path))


def _tune_doc(project: Path) -> dict:
    import json
    (folder,) = [p for p in (project / "runs").glob("*-tune-*") if (p / "tune.json").is_file()]
    return dict(json.loads((folder / "tune.json").read_text()))


def _setting(row: dict) -> tuple[int, int, int]:
    return (row["k"], row["topk"], row["draft_tokens"])


def test_tune_on_an_sglang_host_predicts_every_tree_confirms_the_best_and_answers_with_sglangs_flags(
        sglang_demo: Path, tmp_path: Path) -> None:
    project = sglang_demo
    # SGLang reads a draft's aux ids only from a flat config: a flat copy of the demo's draft, so
    # test-drafter scores the layout SGLang feeds it (ids all in the dumps; not its trained -1,1,3,
    # whose embedding output unpatched SGLang cannot capture: serve refuses it before starting)
    demo = tmp_path / "locroot" / "state" / "demo"
    flat = str(tmp_path / "locroot" / "flat")
    ok(invoke(project, "draft-flat", "--ckpt", "demo", "--layer-ids=1,3,4", "--out", flat))
    done = invoke(project, "tune", "--draft", flat, "--data", str(demo / "data"), "--concurrency", "1,2",
                  "--max-steps", "3", "--budget-s", "3600", timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    doc = _tune_doc(project)
    assert (doc["engine"], doc["status"], doc["left_running"]) == ("sglang", "done", [])
    assert processes_of_runs_under(tmp_path) == []                  # every server it started is gone
    # the profile carries the per-depth top-k rows the trees are predicted from
    prof = doc["profile"]
    assert len(prof["topk"]) >= 3 and all(len(row) == 4 for row in prof["topk"])
    # every SGLang setting of the grid (steps 1..3, topk 1/2/4, the draft tokens each tree can fill) at
    # every concurrency, with the tree prediction of tune/trees.py from that profile
    from draftops.tune.profile import AcceptanceProfile
    grid = trees.settings(3)
    profile_ = AcceptanceProfile(conditional=tuple(prof["conditional"]), topk=tuple(map(tuple, prof["topk"])))
    for c in (1, 2):
        here = {_setting(p): p for p in doc["points"] if p["concurrency"] == c}
        assert set(here) == {(0, 1, 0)} | {(s.steps, s.topk, s.effective_draft_tokens) for s in grid}
        for s in grid:
            assert here[(s.steps, s.topk, s.effective_draft_tokens)]["accept_length_predicted"] == pytest.approx(
                trees.accept_length(profile_, s))
        assert any(k > 1 and topk > 1 for k, topk, _ in here)
    # the measuring servers were the baseline and two chains (steps 1 and 3: topk 1, steps + 1 tokens),
    # keyed by what the server reported; their points carry SGLang's per-request accept figures
    fitted = {(_setting(p), p["concurrency"]) for p in doc["points"] if p["role"] == "fit"}
    assert fitted == {(s, c) for s in [(0, 1, 0), (1, 1, 2), (3, 1, 4)] for c in (1, 2)}
    for p in doc["points"]:
        if p["role"] == "fit" and p["k"]:
            assert 1.0 < p["accept_length_measured"] <= p["k"] + 1 and p["measured_tok_s"] > 0
    # the best per concurrency is the fastest predicted (or a measured one the comparison rule says is
    # faster), and each best not measured by the measuring servers was served and benched where it is best
    confirms = [s for s in doc["steps"] if s["name"].startswith("confirm-")]
    assert confirms and all(s["state"] == "done" for s in confirms)
    for best in doc["best"]:
        here = [p for p in doc["points"] if p["concurrency"] == best["concurrency"]]
        top = max(here, key=lambda p: p["predicted_tok_s"])
        assert _setting(best) == _setting(top) or "measured faster" in best["why"]
        mine = next(p for p in here if _setting(p) == _setting(best))
        assert mine["measured_tok_s"] and mine["role"] in ("fit", "check")
    for s in confirms:
        name = f"confirm-{s['k']}" if s["topk"] == 1 else f"confirm-{s['k']}.{s['topk']}.{s['draft_tokens']}"
        assert s["name"] == name
        for c in s["concurrencies"]:
            point = next(p for p in doc["points"] if p["concurrency"] == c and _setting(p) == (
                s["k"], s["topk"], s["draft_tokens"]))
            assert point["role"] == "check" and point["measured_tok_s"] and point["error"] is not None
    # the answer: SGLang's three flags, one pasteable line SGLang's parser takes, and the serve command
    args = doc["engine_args"]
    chosen = [_setting(b) for b in doc["best"] if b["k"]]
    assert args["engine"] == "sglang" and chosen
    most = max(chosen, key=chosen.count)
    assert args["args"] == ["--speculative-num-steps", str(most[0]), "--speculative-eagle-topk", str(most[1]),
                            "--speculative-num-draft-tokens", str(most[2])]
    assert shlex.split(args["line"]) == args["args"]
    words = shlex.split(args["serve"])
    assert words[words.index("serve"):] == ["serve", "--draft", flat, "--steps", str(most[0]), "--topk",
                                            str(most[1]), "--draft-tokens", str(most[2])]
    page = " ".join((project / "runs" / doc["tune_id"] / "tune.md").read_text().split())
    assert args["line"] in page and f"{most[0]}/{most[1]}/{most[2]}" in page
    assert (project / "runs" / doc["tune_id"] / "tune.png").stat().st_size > 0
    # the printed serve command, run as printed (with --force: test-drafter's verdict on this copy is
    # MISMATCH, which serve holds against it), serves what the answer says (SGLang's own read-back)
    ok(invoke(project, *words[words.index("serve"):], "--force"))
    try:
        out = ok(invoke(project, "bench", "--prompts", "4", "--repeats", "1", "--output-len", "16",
                        "--concurrency", "1", "--dataset", prompts_file(tmp_path)))
    finally:
        ok(invoke(project, "serve.stop", "--all"))
    spec = result.load(bench_folder(project, out)).speculative
    assert spec is not None and (spec.num_steps, spec.topk, spec.num_draft_tokens) == most
