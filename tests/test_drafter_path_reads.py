"""test-drafter's path reads each thing once where it lives (issue 37): the serve profiles give the
engine and its profiles in one read (serve/profiles.serving), the pulled capture-checks give the run
and whether it kept the engine's states in one read (serve/verdicts.capture_check), and the task
checks its first host before it opens the others (cli/common.connect_each)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit

from draftops.inventory import HostSpec, ServeProfile
from draftops.serve import profiles
from draftops.serve.verdicts import capture_check, kept_engine_states


def test_one_profiles_read_gives_the_engine_and_its_profiles() -> None:
    spec = HostSpec(name="gpu", address="g", serve={"a": ServeProfile(engine="vllm"),
                                                    "b": ServeProfile(engine="vllm", context_length=2048)})
    engine, chosen = profiles.serving(spec)
    assert engine == "vllm" and [p.name for p in chosen] == ["a", "b"]
    assert chosen[1].settings.context_length == 2048

    both = HostSpec(name="gpu", address="g", serve={"a": ServeProfile(engine="vllm"),
                                                    "b": ServeProfile(engine="sglang")})
    assert profiles.serving(both) == (None, [])       # no single engine: nothing to tell the evaluator

    engine, chosen = profiles.serving(HostSpec(name="local", transport="local"))
    assert engine == "vllm" and [(p.name, p.builtin) for p in chosen] == [("default", True)]


def _capture_doc(data: str, target: str, engine: str, status: str, states: str | None) -> dict:
    return {"schema": "draftops.capture-check/1", "status": status, "headline": "h", "lines": [],
            "engine": {"name": engine, "python": "/usr/bin/python3"},
            "target": {"path": target, "num_hidden_layers": 2, "hidden_size": 8, "config_sha256": "0" * 64,
                       "weights_listing_sha256": "0" * 64},
            "data": {"path": data, "samples": 1, "tokens": 4, "slots": 3}, "match_rule": "r", "slots": [],
            **({"engine_states": {"path": states}} if states is not None else {})}


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    docs = {"20260101-000000-capture-check": _capture_doc("/d", "/t", "vllm", "MATCHED", "states"),
            "20260101-000001-capture-check": _capture_doc("/d/", "/t", "vllm", "MATCHED", None),
            "20260101-000002-capture-check": _capture_doc("/d", "/t", "vllm", "MISMATCH", "states"),
            "20260101-000003-capture-check": _capture_doc("/d", "/t", "sglang", "MATCHED", None)}
    for run, doc in docs.items():
        (runs / run).mkdir(parents=True)
        (runs / run / "capture-check.json").write_text(json.dumps(doc))
    (runs / "20260101-000004-capture-check").mkdir()
    (runs / "20260101-000004-capture-check" / "capture-check.json").write_text("{not json")
    return runs


def test_one_capture_check_read_gives_the_newest_matched_run_and_its_kept_states(runs: Path) -> None:
    # the newest MATCHED of these dumps on this engine (a MISMATCH, another engine, a broken file passed over)
    assert capture_check(runs, dumps=("/d", "/t", "vllm")) == ("20260101-000001-capture-check", False)
    assert capture_check(runs, dumps=("/d", "/t", "sglang")) == ("20260101-000003-capture-check", False)
    assert capture_check(runs, dumps=("/other", "/t", "vllm")) is None
    # a run the caller names: its kept states, and not kept when its document is gone or broken
    assert capture_check(runs, "20260101-000000-capture-check") == ("20260101-000000-capture-check", True)
    assert capture_check(runs, "20260101-000004-capture-check") == ("20260101-000004-capture-check", False)
    assert capture_check(runs, "20260101-000009-capture-check") == ("20260101-000009-capture-check", False)
    assert kept_engine_states(runs, "20260101-000000-capture-check") is True
    assert capture_check(runs) is None


def test_connect_each_checks_the_first_host_before_it_opens_another(tmp_path: Path, no_inventory_env) -> None:
    """A refusal of the first host (a Slurm host given --hosts) comes before the next host is opened:
    the second name is in no hosts.yaml, so opening it would fail with another error. The first (the
    built-in ``local``) is connected and its code synced before it is checked."""
    from draftops.cli import common

    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "x.py").write_text("X = 1\n")
    c = Context()
    c.config.draftops = {"project_root": str(tmp_path)}
    seen: list[str] = []

    def check(first) -> None:
        seen.append(first.name)
        raise Exit("refused", code=1)

    with pytest.raises(Exit, match="refused"):
        common.connect_each(c, ["local", "no-such-host"], check=check)
    assert seen == ["local"]
    assert (tmp_path / ".draftops" / "code" / "remote" / "x.py").read_text() == "X = 1\n"
