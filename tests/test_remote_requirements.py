"""The CPU-only ml-env (issue 35, item 20): remote/requirements-cpu.txt is remote/requirements.txt with
torch taken from PyTorch's CPU index, so a host without a GPU gets the same packages, not the CUDA build."""
from __future__ import annotations

from pathlib import Path

REMOTE = Path(__file__).resolve().parent.parent / "remote"


def _lines(name: str) -> list[str]:
    text = (REMOTE / name).read_text()
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def test_the_cpu_requirements_are_the_same_packages_from_the_cpu_index() -> None:
    cpu, full = _lines("requirements-cpu.txt"), _lines("requirements.txt")
    options = [line for line in cpu if line.startswith("-")]
    assert options == ["--extra-index-url https://download.pytorch.org/whl/cpu"]
    assert [line for line in cpu if not line.startswith("-")] == full


def test_the_docs_say_where_it_goes() -> None:
    docs = (REMOTE.parent / "docs" / "drafter.md").read_text()
    assert "requirements: remote/requirements-cpu.txt" in docs
