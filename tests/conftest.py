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
from tests.support import engine_quiet, laptop_venv
from tests.support import slurm as slurm_cluster
from tests.support.sshd import Sshd, keygen, sshd_available, start_sshd

REPO = Path(__file__).resolve().parent.parent


#: engine tests that judge no speed, or only that a fixed draft is not slower than a wrong one (about x2
#: apart), and start their servers on this machine directly (their environment is this process's), by
#: file or ``file::test[param]``: their group runs on a second worker beside the speed-judging ``engine``
#: group, its servers' compute on the other core (``pytest_runtest_protocol`` below). Anything not named
#: here stays in ``engine``, one test at a time: servers started over SSH or Slurm among them, which
#: would bind core 0 whatever this process says.
ENGINE_CHECK = frozenset({"test_capture_check_engine.py", "test_vllm_engine.py", "test_temperature_engine.py",
                          "test_serve_vllm.py::test_invoke_serve_demo_runs_a_real_vllm_server[local]",
                          "test_bench_seed_engine.py::test_seed_story_measured_against_predicted[local]"})
ENGINE_CHECK_GROUP = "engine-check"
OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def engine_group(item: pytest.Item) -> str:
    """``engine`` (speed-judging: one server at a time, core 0) or ``engine-check`` (named in ENGINE_CHECK)."""
    named = {item.path.name, f"{item.path.name}::{item.name}"}
    return ENGINE_CHECK_GROUP if named & ENGINE_CHECK else "engine"


def _group(config: pytest.Config, item: pytest.Item, name: str) -> None:
    """Mark ``item`` for xdist group ``name`` and put the group into its node id, as ``--dist loadgroup``
    reads it (``path::test@name``). pytest-xdist 3.8 writes ``item._nodeid``, which pytest 9 no longer
    reads (its node id is ``item._id``): there, every test was a group of its own, and the engine tests
    ran beside each other on all workers."""
    item.add_marker(pytest.mark.xdist_group(name))
    if not config.getoption("loadgroup", False) or "@" in item.nodeid.rpartition("]")[2]:
        return
    if isinstance(getattr(item, "_id", None), str) or not hasattr(item, "_id"):
        item._nodeid = f"{item.nodeid}@{name}"  # type: ignore[attr-defined]   # pytest 8
    else:
        item._id = type(item._id).parse(f"{item.nodeid}@{name}")  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The suite runs on several xdist workers (pyproject's addopts): the tests that start a real vLLM-CPU
    server go to two groups, each on one worker, in turn: the engine tests that compare speeds
    (``engine``) never have a second server of their group beside them, and those that judge no speed
    (``engine-check``) run beside them with their servers' compute on the other core. The engine tests
    are the suite's critical path (about 47 min one after the other, about 32 vLLM starts of 45-70 s
    each); the check group takes about 16 min of it onto another worker."""
    for item in items:
        if item.get_closest_marker("engine") is not None:
            _group(config, item, engine_group(item))
        elif item.get_closest_marker("slurm") is not None:     # one cluster, started once, on one worker
            _group(config, item, "slurm")
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


@pytest.hookimpl(optionalhook=True)      # an xdist hook: the suite also runs with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` handing out the speed-judging engine group first, whatever the group sizes:
    it is the suite's critical path, and xdist hands out the groups with the most tests first (the
    Slurm and check groups have more), so with two workers it would wait for one of them to end."""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class EngineFirst(LoadGroupScheduling):
        def _assign_work_unit(self, node: Any) -> None:
            if "engine" in self.workqueue:
                self.workqueue.move_to_end("engine", last=False)
            super()._assign_work_unit(node)

    return EngineFirst(config, log)


def _beside_the_engine_group(item: pytest.Item) -> bool:
    group = item.get_closest_marker("xdist_group")
    return (group is not None and group.args[:1] == (ENGINE_CHECK_GROUP,)
            and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under xdist, the check group's vLLM servers bind their compute to the last core of this machine
    (``VLLM_CPU_OMP_THREADS_BIND``, inherited by every server the test starts here, module-scoped
    fixtures' too: hence a hook around the whole item, not a fixture): vLLM's default binds core 0, where
    the speed-judging group's server computes. And a speed judgment of small margin
    (tests/support/engine_quiet.py) runs with no check test beside it. Run alone (``-n 0``) nothing
    changes."""
    cpus = sorted(os.sched_getaffinity(0))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    check, quiet = _beside_the_engine_group(item), workers > 1 and item.path.name in engine_quiet.QUIET
    if not (check or quiet) or len(cpus) < 2:
        yield
        return
    before = os.environ.get(OMP_BIND)
    if check:
        os.environ[OMP_BIND] = str(cpus[-1])
    try:
        with engine_quiet.turn(_run_folder(item.config), exclusive=quiet):
            yield
    finally:
        if before is None:
            os.environ.pop(OMP_BIND, None)
        else:
            os.environ[OMP_BIND] = before


def _run_folder(config: pytest.Config) -> Path:
    """The temporary folder every xdist worker of this run shares (each has its own below it)."""
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return factory.getbasetemp().parent


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
