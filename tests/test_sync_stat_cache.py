"""Both sides of a sync skip hashing files whose stat is unchanged (size, mtime, ctime, inode):
proven by planting a wrong hash under a file's current stat key (a scan that hashed the file would
report the true one), and that any change of the key brings the true hash back, including a same-size
edit whose mtime was put back (as `cp -p` or an unpacked archive do: only ctime tells)."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from draftops.onhost import agent as hostagent
from draftops.runs.sync import local_manifest

PLANTED = "0" * 64


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plant(cache_file: Path, rel: str) -> None:
    """Put a wrong hash under ``rel``'s stored stat key, as if the file had hashed to it."""
    cache = json.loads(cache_file.read_text())
    cache[rel][1] = PLANTED
    cache_file.write_text(json.dumps(cache))


def touch(path: Path) -> bytes:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000))
    return path.read_bytes()


def same_size_mtime_restored(path: Path) -> bytes:
    st = path.stat()
    path.write_bytes(b"B" * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    return path.read_bytes()


def replaced_by_rename(path: Path) -> bytes:
    st = path.stat()
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(path.read_bytes())
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)
    assert path.stat().st_ino != st.st_ino
    return path.read_bytes()


def grown(path: Path) -> bytes:
    with path.open("ab") as fh:
        fh.write(b"+")
    return path.read_bytes()


CHANGES: dict[str, Callable[[Path], bytes]] = {
    "mtime": touch, "ctime (same size, mtime put back)": same_size_mtime_restored,
    "inode (replaced by a copy)": replaced_by_rename, "size": grown}


@pytest.fixture
def local(tmp_path: Path) -> tuple[Path, Path, Callable[[], dict]]:
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "x.py").write_bytes(b"A" * 10)
    cache = tmp_path / "sync-manifest.json"
    return tmp_path / "remote" / "x.py", cache, lambda: local_manifest(tmp_path, ["remote"], cache)


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Callable[[], dict]]:
    """The host agent's scan of <root>/code, in-process, with its cache in state/ (as on a host)."""
    root = tmp_path / "root"
    (root / "state").mkdir(parents=True)
    monkeypatch.chdir(root)
    hostagent._create_code("code")
    (root / "code" / "x.py").write_bytes(b"A" * 10)
    state = root / "state" / "code-manifest.json"

    def scan() -> dict:
        fd = hostagent._open_code("code")
        try:
            return {rel: tuple(entry) for rel, entry in hostagent._scan_and_store(fd, str(state)).items()}
        finally:
            os.close(fd)
    return root / "code" / "x.py", state, scan


@pytest.mark.parametrize("side", ["local", "host"])
def test_an_unchanged_stat_reuses_the_stored_hash(side: str, request: pytest.FixtureRequest) -> None:
    path, cache, scan = request.getfixturevalue(side)
    rel = "remote/x.py" if side == "local" else "x.py"
    assert scan()[rel][1] == sha(b"A" * 10)
    assert json.loads(cache.read_text())[rel][1] == sha(b"A" * 10)
    plant(cache, rel)
    assert scan()[rel][1] == PLANTED, "the file was hashed again although its stat had not changed"
    assert scan()[rel][1] == PLANTED


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("side", ["local", "host"])
def test_any_change_of_the_stat_key_hashes_the_file_again(side: str, change: str,
                                                          request: pytest.FixtureRequest) -> None:
    path, cache, scan = request.getfixturevalue(side)
    rel = "remote/x.py" if side == "local" else "x.py"
    scan()
    plant(cache, rel)
    content = CHANGES[change](path)
    assert scan()[rel][1] == sha(content)
    assert json.loads(cache.read_text())[rel][1] == sha(content)        # the cache learnt it too


def test_a_file_the_apply_wrote_is_cached_under_its_stat_only_while_it_is_the_one_written(
        host: tuple[Path, Path, Callable[[], dict]]) -> None:
    """The apply hashes each file as it writes it and seeds the cache (hostagent._seed), so the scan
    after it reads nothing back; a file changed in between (other inode, size or mtime, or no longer a
    file) is not seeded, and is hashed by the scan as usual."""
    path, _cache, scan = host
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for change in (None, touch, replaced_by_rename, grown):
            path.write_bytes(b"A" * 10)
            st = path.stat()
            written = (PLANTED, st.st_ino, st.st_size, st.st_mtime_ns)
            if change is not None:
                change(path)
            seeds: dict = {}
            hostagent._seed(seeds, parent, path.name, "x.py", written)
            if change is None:
                st = path.stat()
                assert seeds == {"x.py": [[st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino], PLANTED]}
            else:
                assert seeds == {}, f"seeded after {change.__name__}"
        st = path.stat()
        path.unlink()
        path.symlink_to("elsewhere")
        seeds = {}
        hostagent._seed(seeds, parent, path.name, "x.py", (PLANTED, st.st_ino, st.st_size, st.st_mtime_ns))
        assert seeds == {}
    finally:
        os.close(parent)
    assert scan()["x.py"][0] == "l"


@pytest.mark.parametrize("entry", [5, "x", None, [], {"a": 1}, "key, int hash", "key, short hash",
                                   "key, no hash"])
@pytest.mark.parametrize("side", ["local", "host"])
def test_a_corrupt_cache_entry_means_hashing_again_not_a_crash_or_a_wrong_hash(
        side: str, entry: object, request: pytest.FixtureRequest) -> None:
    """The cache is a file on disk (ours, written atomically, but a disk error or an edit can leave
    anything in it): an entry of another shape crashed the scan with a TypeError (a traceback from
    `invoke sync`, or the host agent's), and a hash that is not one was taken as the file's."""
    path, cache, scan = request.getfixturevalue(side)
    rel = "remote/x.py" if side == "local" else "x.py"
    scan()
    stored = json.loads(cache.read_text())
    key = stored[rel][0]
    stored[rel] = {"key, int hash": [key, 7], "key, short hash": [key, "abc"],
                   "key, no hash": [key]}.get(entry, entry) if isinstance(entry, str) else entry
    cache.write_text(json.dumps(stored))
    assert scan()[rel][1] == sha(b"A" * 10)
