"""Bounded host inputs of `invoke bench`: a prompt file that is no regular file, too large or with an
endless line is refused naming it (never read without end or blocked on), and every numeric option
has limits, including the server's own context."""
from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest

from draftops.bench import plan as planning
from draftops.errors import BenchError
from remote.bench import datasets
from remote.bench.errors import BenchParseError
from remote.bench.runner import Runner
from tests.support.serving import ok, project, refused  # noqa: F401
from tests.support.tasks import invoke


def convert(tmp_path: Path, src: Path | str) -> tuple[int | None, str]:
    """The plan's conversion step as the runner runs it (its failure reason is what the user sees)."""
    runner = Runner({"server": {}}, tmp_path)
    return runner.prepare(["/no/such/python", "-m", "remote.bench.datasets", str(src), str(tmp_path / "out.json")])


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.fifo"
    os.mkfifo(path)
    return path


def test_a_device_a_fifo_a_socket_or_a_folder_is_refused_naming_it(tmp_path) -> None:
    link = tmp_path / "prompts.jsonl"
    link.symlink_to("/dev/zero")                    # a link is followed: what counts is what it leads to
    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        cases = {"/dev/zero": "a character device", str(link): "a character device (it leads to /dev/zero)",
                 str(fifo(tmp_path)): "a FIFO", str(sock_path): "a socket", str(tmp_path): "a folder"}
        for src, kind in cases.items():
            # a FIFO nobody writes to would block a plain open forever: the test would hang, not fail
            done: list[tuple[int | None, str]] = []
            worker = threading.Thread(target=lambda s=src, d=done: d.append(convert(tmp_path, s)), daemon=True)
            worker.start()
            worker.join(30)
            assert done, f"converting {src} blocked"
            code, why = done[0]
            assert code == 1 and f"the dataset {src} is {kind}" in why and "not a regular file" in why, why
    assert not (tmp_path / "out.json").exists()


def test_a_file_over_the_size_cap_is_refused_before_it_is_read(tmp_path) -> None:
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as fh:
        fh.truncate(datasets.MAX_BYTES + 1)         # sparse: no disk, but reading it would take the memory
    with pytest.raises(BenchParseError, match=f"the dataset {big} holds {datasets.MAX_BYTES + 1} bytes"):
        datasets.read_prompts(big)


def test_an_endless_line_is_refused_naming_file_and_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(datasets, "MAX_LINE", 1000)
    src = tmp_path / "long.jsonl"
    src.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"prompt": "x" * 5000}) + "\n")
    with pytest.raises(BenchParseError, match=rf"{src}:2: the line is longer than"):
        datasets.read_prompts(src)
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(BenchParseError, match=rf"{bad}:2: not UTF-8"):
        datasets.read_prompts(bad)


def test_a_prompt_holding_a_line_separator_stays_one_prompt(tmp_path) -> None:
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "a\u2028b\u0085c"}\r\n{"prompt": "d"}\n', encoding="utf-8")
    assert datasets.read_prompts(src) == ["a\u2028b\u0085c", "d"]


@pytest.mark.parametrize("field,value", [("prompts", 10**7), ("concurrency", 10**6), ("input_len", 99999999999999),
                                         ("output_len", 10**8), ("repeats", 10**4), ("seed", 2**64), ("seed", -1)])
def test_every_numeric_option_is_bounded(field: str, value: int) -> None:
    flag = "--" + field.replace("_", "-")
    with pytest.raises(BenchError, match=f"{flag} {value}"):
        planning.BenchSettings(**{field: value}).validate()


def test_lengths_must_fit_the_servers_context() -> None:
    limits = planning.ServerLimits(context=4096, max_input=4095, source="SGLang's /get_server_info")
    with pytest.raises(BenchError, match="max_req_input_len 4095") as err:
        planning.BenchSettings(input_len=5000).check_fits(limits)
    assert "SGLang's /get_server_info" in str(err.value)
    with pytest.raises(BenchError, match="context of 4096 tokens"):
        planning.BenchSettings(input_len=4000, output_len=128).check_fits(limits)
    with pytest.raises(BenchError, match="context of 4096 tokens"):
        planning.BenchSettings(dataset="/p.jsonl", output_len=4096).check_fits(limits)
    planning.BenchSettings(input_len=3968, output_len=128).check_fits(limits)
    planning.BenchSettings(input_len=10**6).check_fits(planning.ServerLimits(None, None, "nothing"))


@pytest.mark.ssh
def test_bench_refuses_lengths_the_server_cannot_take_and_a_device_as_dataset(project, tmp_path):  # noqa: F811
    """Against the SGLang double (max_req_input_len 4095 of a 4096 context, as SGLang reports it)."""
    root = project("loc")
    ok(invoke(root, "serve", "--baseline"))
    text = refused(invoke(root, "bench", "--input-len", "99999999999999"))
    assert "--input-len 99999999999999 must be a whole number from 1 to" in text
    text = refused(invoke(root, "bench", "--input-len", "5000", "--output-len", "8"))
    assert "--input-len 5000 is longer than the server takes: max_req_input_len 4095" in text
    text = refused(invoke(root, "bench", "--input-len", "4000", "--output-len", "200"))
    assert "do not fit the server's context of 4096 tokens" in text
    assert not [p for p in (root / "runs").iterdir() if "-bench-" in p.name]     # nothing was started
    text = refused(invoke(root, "bench", "--dataset", "/dev/zero", "--prompts", "1", "--repeats", "1"))
    assert "the dataset /dev/zero is a character device" in text and "not a regular file" in text
    ok(invoke(root, "serve.stop", "--all"))


@pytest.mark.parametrize("flag,field,value", [("--steps", "steps", 10**12), ("--topk", "topk", 65),
                                              ("--draft-tokens", "draft_tokens", 10**6)])
def test_serve_speculative_counts_are_bounded(flag: str, field: str, value: int) -> None:
    from tests.support.serve_plans import plan_for, refusals
    given = {"steps": 3, "topk": 2, "draft_tokens": 8, field: value}
    found = refusals(plan_for("sglang", draft="/d", **given)).refusals
    assert found and f"{flag} {value} is not a count from 1 to" in found[0]
