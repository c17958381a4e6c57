"""The evaluator's flags are declared once (remote/drafter/options.py FLAGS): the host's parser is
built from them and the laptop's argument list is written by ``EvalOptions.to_argv``; every option
survives the trip laptop → argv → host."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from draftops.drafter.asked import Asked
from draftops.serve.host_engine import HostEngine
from remote.drafter.cli import build_parser, options_from_args
from remote.drafter.options import FLAGS, EvalOptions, temperatures

NOT_FLAGS = {"demo"}      # said by leaving out --ckpt and --data


def other_value(flag):
    """A value of the flag's type that is not its field's default."""
    if flag.choices:
        return next(c for c in reversed(flag.choices) if c != _default(flag.field))
    return {Path: Path("/host/some folder/x"), int: 7, float: 0.25, str: "0.5.13", bool: True,
            temperatures: (0.7, 1.0)}[flag.kind]


def _default(field):
    found = next(f for f in dataclasses.fields(EvalOptions) if f.name == field)
    return None if found.default is dataclasses.MISSING else found.default


def base(**kw):
    return EvalOptions(ckpt=Path("/host/draft"), data=Path("/host/dumps"), **kw)


def test_every_option_is_one_flag_and_every_flag_one_option():
    fields = {f.name for f in dataclasses.fields(EvalOptions)} - NOT_FLAGS
    assert [f.field for f in FLAGS if f.field not in fields] == []
    assert sorted(fields - {f.field for f in FLAGS}) == []
    assert len({f.name for f in FLAGS}) == len(FLAGS)


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.name)
def test_each_option_survives_the_trip(flag):
    opts = dataclasses.replace(base(), **{flag.field: other_value(flag)})
    argv = opts.to_argv()
    assert flag.name in " ".join(argv)
    assert EvalOptions.from_argv(argv) == opts


def test_all_options_at_once_and_the_defaults_left_out():
    every = dataclasses.replace(base(), **{f.field: other_value(f) for f in FLAGS})
    assert EvalOptions.from_argv(every.to_argv()) == every
    assert base().to_argv() == ["--ckpt", "/host/draft", "--data", "/host/dumps"]


def test_the_demo_travels_as_no_paths():
    demo = EvalOptions.of_demo(steps=5, demo_dir=Path("/state/demo"))
    assert "--ckpt" not in demo.to_argv() and "--data" not in demo.to_argv()
    assert EvalOptions.from_argv(demo.to_argv()) == demo


def test_a_value_that_reads_as_a_flag_is_still_a_value():
    opts = base(verifier=Path("-target"), limit=None)
    assert "--verifier=-target" in opts.to_argv()
    assert EvalOptions.from_argv(opts.to_argv()) == opts


def test_one_path_without_the_other_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        EvalOptions.from_argv(["--ckpt", "/x"])
    assert stop.value.code == 2 and "give both --ckpt and --data" in capsys.readouterr().err


def test_the_hosts_parser_reads_what_the_laptop_writes():
    every = dataclasses.replace(base(), **{f.field: other_value(f) for f in FLAGS})
    parser = build_parser()
    assert options_from_args(parser.parse_args(["eval", *every.to_argv()]), parser) == every


def test_the_task_builds_its_argument_list_through_the_options():
    served = HostEngine("vllm", "0.32.0", None)
    asked = Asked(ckpt="/d/draft", data="/d/dumps", steps=4, seed=0, measured="20261206-run")
    opts = asked.options(served, "/root/runs", kept_states=True)
    argv = opts.to_argv()
    assert EvalOptions.from_argv(argv) == opts
    assert opts.measured == Path("/root/runs/20261206-run/capture-check.json")
    assert opts.engine_states == Path("/root/runs/20261206-run/engine-states")
    assert (opts.engine, opts.engine_version, opts.steps, opts.out) == ("vllm", "0.32.0", 4, Path("$DRAFTOPS_RUN_DIR"))
    demo = Asked(gpus=2).options(HostEngine(None, None, None), "/root/runs", kept_states=False)
    assert demo.demo and demo.full and "--ckpt" not in demo.to_argv() and "--engine" not in demo.to_argv()


def test_the_laptop_writes_no_evaluator_flag_by_hand():
    """The laptop side spells none of the evaluator's flags itself: its argument lists come from
    EvalOptions (a flag renamed in FLAGS cannot leave a stale copy behind)."""
    repo = Path(__file__).resolve().parent.parent
    spelled = {f'"{flag.name}"' for flag in FLAGS} - {'"--out"', '"--ckpt"', '"--data"', '"--config"', '"--steps"',
                                                       '"--port"', '"--engine"', '"--seed"', '"--limit"',
                                                       '"--device"', '"--full"', '"--verifier"',
                                                       '"--temperature"'}   # the engines' bench clients' flag too
    found = [(str(path.relative_to(repo)), word) for path in sorted((repo / "draftops").rglob("*.py"))
             for word in spelled if word in path.read_text()]
    assert found == []
