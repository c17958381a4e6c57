"""tune's SGLang branch through the SGLang double (tests/doubles/sglang: SGLang 0.5.10's flags, its
topk=1 adjustment, `/get_server_info` and bench_serving's JSONL): a tree setting served with
`invoke serve`, benched with `invoke bench`, and read back as tune's measured point keyed by what the
server really ran; the answer's three flags as a pasteable line that SGLang's parser takes."""
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
