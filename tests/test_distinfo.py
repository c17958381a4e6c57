"""remote.distinfo gives the version importlib.metadata gives, without importing it where it can:
for every distribution installed in this venv, and for the layouts it leaves to importlib itself."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from remote import distinfo

REPO = Path(__file__).resolve().parent.parent


def test_every_installed_distribution_has_the_version_importlib_metadata_reports():
    names = {d.metadata["Name"] for d in importlib.metadata.distributions() if d.metadata["Name"]}
    assert len(names) > 30                               # torch, fabric, pydantic, rich, ... and their deps
    for name in sorted(names):
        assert distinfo.version(name) == importlib.metadata.version(name), name
    for spelled in ("PyYAML", "pyyaml", "typing-extensions", "typing.extensions", "Typing_Extensions"):
        assert distinfo.version(spelled) == importlib.metadata.version(spelled), spelled
    assert distinfo.version("no-such-distribution-anywhere") is None


def dist_info(folder: Path, name: str, version: str, *, kind: str = "dist-info", header: str | None = None) -> None:
    info = folder / f"{name}-{version}.{kind}"
    info.mkdir(parents=True)
    text = header if header is not None else f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n"
    (info / ("METADATA" if kind == "dist-info" else "PKG-INFO")).write_text(text)


@pytest.mark.parametrize("layout", ["plain", "later-entry", "escaped-name", "two-copies", "egg-info",
                                    "no-version-header", "version-in-body", "unreadable"])
def test_each_layout_gives_what_importlib_metadata_gives(tmp_path, layout):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    name = "demo_pkg"
    if layout == "plain":
        dist_info(first, name, "1.2.3")
    elif layout == "later-entry":                        # the first entry that has it wins
        dist_info(second, name, "2.0")
        dist_info(tmp_path / "c", name, "3.0")
    elif layout == "escaped-name":
        name = "Demo.Pkg-CPU"
        dist_info(first, "demo_pkg_cpu", "0.32.0")
    elif layout == "two-copies":                         # a stale copy beside the real one
        dist_info(first, name, "1.0")
        dist_info(first, name, "1.1")
    elif layout == "egg-info":
        dist_info(first, name, "0.9", kind="egg-info")
    elif layout == "no-version-header":
        dist_info(first, name, "4.0", header=f"Metadata-Version: 2.1\nName: {name}\n")
    elif layout == "version-in-body":
        dist_info(first, name, "5.0", header=f"Name: {name}\n\nVersion: 9.9\n")
    else:
        dist_info(first, name, "6.0")
        (first / f"{name}-6.0.dist-info" / "METADATA").chmod(0)
    path = [str(first), str(second), str(tmp_path / "c"), str(tmp_path / "missing")]
    expected = next((d.version for d in importlib.metadata.distributions(name=name, path=path)), None)
    assert distinfo.version(name, path) == expected


def test_the_quick_tools_no_longer_import_importlib_metadata_for_a_vllm_host(tmp_path):
    """`remote.serve inspect --engine vllm` and `remote.bench.probe vllm`: what the module saves."""
    for argv in (["-m", "remote.bench.probe", "vllm"],
                 ["-m", "remote.serve", "inspect", "--engine", "vllm", "--target", str(tmp_path)]):
        done = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=REPO, capture_output=True,
                              text=True, check=False)
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
        assert "remote.distinfo" in imported and "importlib.metadata" not in imported, done.stderr[-2000:]
