"""The host agent's sync steps in-process, for races no end-to-end sync can time: a symlink that
appears under <root>/code after the plan was checked is refused, never followed."""
from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from draftops.onhost import agent as hostagent
from draftops.onhost.wire import OWNER_MARK, SYNC_META

Refusal = hostagent.Refusal


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """A host root with a draftops-made code folder, and the agent's cwd there (as on a host)."""
    (tmp_path / "root" / "state").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "root")
    hostagent._create_code("code")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "victim.txt").write_text("precious")
    return tmp_path / "root"


def plan(files: dict[str, bytes], delete: list[str] = ()) -> hostagent._Plan:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        meta = json.dumps({"delete": list(delete)}).encode()
        info = tarfile.TarInfo(SYNC_META)
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return hostagent._Plan(tarfile.open(fileobj=buf, mode="r:"))


def test_code_is_created_with_its_ownership_marker(root):
    assert (root / "code" / OWNER_MARK).is_file()
    fd = hostagent._open_code("code")
    try:
        assert hostagent._scan(fd, {})[0] == {}, "the marker is not part of the mirrored tree"
    finally:
        os.close(fd)


def test_symlink_that_appears_after_the_check_is_not_written_through(root):
    """Checked against a tree where d/ is a real folder; by the time of writing, d is a symlink."""
    outside = root.parent / "outside"
    (root / "code" / "d").mkdir()
    fd = hostagent._open_code("code")
    try:
        checked = plan({"d/x.py": b"x = 1\n", "e/y.py": b"y = 1\n"})
        checked.check_against(hostagent._scan(fd, {})[0])
        (root / "code" / "d").rmdir()
        os.symlink(outside, root / "code" / "d")             # the race
        with pytest.raises(Refusal, match="not a real folder"):
            hostagent._write(fd, checked)
    finally:
        os.close(fd)
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert not list((root / "code").rglob("*draftops-tmp*")), "the temp files of a failed apply are removed"
    assert not (root / "code" / "e").exists(), "folders made for a failed apply are removed"


def test_delete_never_goes_through_a_symlinked_folder(root):
    outside = root.parent / "outside"
    os.symlink(outside, root / "code" / "d")
    fd = hostagent._open_code("code")
    try:
        with pytest.raises(Refusal, match="not a real folder"):
            hostagent._delete(fd, ["d/victim.txt"])
        os.symlink(outside / "victim.txt", root / "code" / "link")
        assert hostagent._delete(fd, ["link"]) == 1           # the link goes, its target stays
    finally:
        os.close(fd)
    assert (outside / "victim.txt").read_text() == "precious"
    assert not os.path.lexists(root / "code" / "link")


def test_deep_tree_scans_without_recursion_limits(root):
    deep = root / "code"
    for _ in range(400):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "leaf.py").write_text("leaf\n")
    fd = hostagent._open_code("code")
    try:
        manifest = hostagent._scan(fd, {})[0]
    finally:
        os.close(fd)
    assert list(manifest) == ["d/" * 400 + "leaf.py"]


def test_unmarked_folder_with_a_marker_that_is_not_a_file_is_refused(root):
    (root / "code" / OWNER_MARK).unlink()
    (root / "code" / OWNER_MARK).mkdir()
    with pytest.raises(Refusal, match="did not put there"):
        hostagent._open_code("code")


def cache(folder: Path, *names: str) -> Path:
    """The host python's bytecode cache in ``folder`` holding ``names``."""
    (folder / "__pycache__").mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / "__pycache__" / name).write_bytes(b"bytecode")
    return folder / "__pycache__"


def test_bytecode_is_not_part_of_the_tree_and_goes_with_its_module(root):
    code = root / "code"
    (code / "pkg").mkdir()
    for name in ("m.py", "m.tool.py", "n.py"):
        (code / "pkg" / name).write_text("x = 1\n")
    pycache = cache(code / "pkg", "m.cpython-311.pyc", "m.cpython-312.opt-1.pyc", "m.cpython-311-pytest-8.2.0.pyc",
                    "m.tool.cpython-311.pyc", "n.cpython-311.pyc")
    fd = hostagent._open_code("code")
    try:
        assert sorted(hostagent._scan(fd, {})[0]) == ["pkg/m.py", "pkg/m.tool.py", "pkg/n.py"]
        assert hostagent._delete(fd, ["pkg/m.py"]) == 1
        assert sorted(p.name for p in pycache.iterdir()) == ["m.tool.cpython-311.pyc", "n.cpython-311.pyc"]
        hostagent._write(fd, plan({"pkg/m.tool.py": b"x = 2\n"}))      # a rewritten module: its cache goes
        assert sorted(p.name for p in pycache.iterdir()) == ["n.cpython-311.pyc"]
    finally:
        os.close(fd)


def test_a_folder_left_with_only_its_cache_goes_even_with_a_half_written_pyc(root):
    """A python killed while writing bytecode leaves a temp file (NAME.pyc.NNN) in the cache."""
    code = root / "code"
    (code / "gone" / "sub").mkdir(parents=True)
    (code / "gone" / "sub" / "m.py").write_text("x = 1\n")
    cache(code / "gone" / "sub", "m.cpython-311.pyc", "other.cpython-311.pyc.140234")
    cache(code / "gone", "__init__.cpython-311.pyc")
    (code / "kept").mkdir()
    (code / "kept" / "k.py").write_text("k = 1\n")
    cache(code / "kept", "k.cpython-311.pyc")
    fd = hostagent._open_code("code")
    try:
        hostagent._delete(fd, ["gone/sub/m.py", "kept/nothing.py"])
    finally:
        os.close(fd)
    assert not (code / "gone").exists()
    assert (code / "kept" / "__pycache__" / "k.cpython-311.pyc").exists()


def test_a_file_replaces_a_folder_that_holds_only_its_cache(root):
    code = root / "code"
    cache(code / "pkg", "m.cpython-311.pyc", "m.cpython-311.pyc.99")
    fd = hostagent._open_code("code")
    try:
        checked = plan({"pkg": b"now a file\n"})
        checked.check_against(hostagent._scan(fd, {})[0])
        hostagent._write(fd, checked)
    finally:
        os.close(fd)
    assert (code / "pkg").read_text() == "now a file\n"


def test_a_cache_that_is_a_link_is_neither_followed_nor_emptied(root):
    outside = root.parent / "outside"
    (outside / "m.cpython-311.pyc").write_bytes(b"not ours")
    code = root / "code"
    (code / "pkg").mkdir()
    (code / "pkg" / "m.py").write_text("x = 1\n")
    os.symlink(outside, code / "pkg" / "__pycache__")
    fd = hostagent._open_code("code")
    try:
        assert sorted(hostagent._scan(fd, {})[0]) == ["pkg/__pycache__", "pkg/m.py"], "a link is an entry"
        hostagent._delete(fd, ["pkg/m.py", "pkg/__pycache__"])
    finally:
        os.close(fd)
    assert (outside / "m.cpython-311.pyc").read_bytes() == b"not ours"
    assert not os.path.lexists(code / "pkg")
