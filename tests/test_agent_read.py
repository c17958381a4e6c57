"""The agent's bounded read (``AgentClient.read``, docs/protocol.md § read): the one way the local side
reads a host file. Whole, head, tail and size read exactly what they say, within a byte cap; a folder,
a FIFO or a device, even behind a link, is refused at once (an open would wait forever, a read never
end), as is a whole read over the cap, each with one paragraph naming the file."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from draftops.errors import HostFileError
from draftops.link.host import open_host


@pytest.fixture
def host(make_project, tmp_path, no_inventory_env):
    project = make_project({"here": {"transport": "local", "root": str(tmp_path / "hostroot")}}, default="here")
    return open_host(None, project)


def test_whole_head_tail_and_size_read_what_they_say(host, tmp_path: Path):
    path = tmp_path / "server's \"log\""            # quotes and a space: no shell reads it
    path.write_bytes(b"one\ntwo\nthree\nfour\n\xff\x00binary\n")
    whole = host.agent.read(str(path))
    assert whole.data == path.read_bytes() and whole.size == len(whole.data) and whole.offset == 0
    assert not whole.executable
    assert host.agent.read(str(path), "head", cap=7).data == b"one\ntwo"
    tail = host.agent.read(str(path), "tail", lines=2)
    assert tail.data == b"four\n\xff\x00binary\n" and tail.offset == len(b"one\ntwo\nthree\n")
    assert host.agent.read(str(path), "tail", lines=50).data == path.read_bytes()
    sized = host.agent.read(str(path), "size")
    assert sized.data == b"" and sized.size == path.stat().st_size


def test_tail_counts_a_last_line_without_its_newline_and_never_shows_a_cut_line(host, tmp_path: Path):
    path = tmp_path / "log"
    path.write_bytes(b"a\nbb\nccc")
    assert host.agent.read(str(path), "tail", lines=1).data == b"ccc"
    assert host.agent.read(str(path), "tail", lines=2).data == b"bb\nccc"
    path.write_bytes(b"x" * 100 + b"\nlast line\n")
    capped = host.agent.read(str(path), "tail", cap=20, lines=5)      # the cap cuts the long first line
    assert capped.data == b"last line\n" and capped.offset == 101


def test_a_whole_read_over_its_cap_is_refused_naming_the_file(host, tmp_path: Path):
    path = tmp_path / "big.json"
    path.write_bytes(b"x" * 5000)
    with pytest.raises(HostFileError, match=rf"{path} is 5000 bytes, more than the 4096 this read takes"):
        host.agent.read(str(path), cap=4096)
    assert host.agent.read(str(path), "head", cap=4096).data == b"x" * 4096


@pytest.mark.parametrize("kind", ["missing", "folder", "fifo", "link to /dev/zero", "link to a fifo"])
def test_what_is_not_a_regular_file_is_refused_at_once(host, tmp_path: Path, kind: str):
    path = tmp_path / "thing"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "link to a fifo":
        os.mkfifo(tmp_path / "fifo")
        path.symlink_to(tmp_path / "fifo")
    for how in ("whole", "head", "tail", "size"):
        with pytest.raises(HostFileError) as err:
            host.agent.read(str(path), how)
        message = str(err.value)
        assert message.startswith("Host 'here'") and str(path) in message and "\n" not in message
        assert ("No such file" if kind == "missing" else "not a regular file") in message


def test_a_link_to_a_file_is_read_and_home_is_expanded(host, tmp_path: Path, monkeypatch):
    (tmp_path / "blob").write_text('{"a": 1}')
    (tmp_path / "config.json").symlink_to(tmp_path / "blob")     # a model cache's snapshot link
    assert host.agent.read(str(tmp_path / "config.json")).data == b'{"a": 1}'
    home = tmp_path / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "venv" / "bin" / "python").symlink_to(os.path.realpath("/bin/sh"))
    monkeypatch.setenv("HOME", str(home))
    assert host.agent.read("~/venv/bin/python", "size").executable
