"""A relative path typed for the host means one folder in every task: the host's home over SSH (as
`scp host:P` reads it), the project folder on `local`; `~/` is the host's home. test-drafter's
`--ckpt` was relative to <root>/code (the jobs' folder, which sync rewrites) while serve's `--draft`
was relative to the home. Checked through what each task handed the host: test-drafter's run as its history row records
it, serve's refusal naming the draft folder it looked in."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftops.history import History
from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.serving import profile
from tests.support.sshd import start_sshd
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh


@pytest.fixture
def project(make_project, client_key, tmp_path, no_inventory_env):
    """Hosts `box` (an sshd whose user's home is tmp/home) and `loc`; returns (project, home)."""
    home = tmp_path / "home"
    home.mkdir()
    server = start_sshd(tmp_path / "sshd", client_key, extra_config=f"SetEnv HOME={home}\n")
    serve = {"default": profile(tmp_path)}
    hosts = {"box": ssh_entry(server, tmp_path, serve=serve),
             "loc": {"transport": "local", "root": str(tmp_path / "locroot"), "serve": serve}}
    root = make_project(hosts, default="box")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    yield root, home
    server.stop()


def _words(done) -> str:
    return " ".join((done.stdout + done.stderr).split())


@pytest.mark.parametrize("where", ["box", "loc"])
def test_test_drafter_and_serve_read_a_relative_host_path_from_the_same_folder(project, where: str) -> None:
    root, home = project
    base = home if where == "box" else root          # where a login shell starts on that host
    done = invoke(root, "test-drafter", "--ckpt", "drafts/mine", "--data", "~/dumps", "--host", where)
    assert done.returncode == 1 and "Traceback" not in done.stderr, _words(done)
    row = History(root / "runs" / "history.sqlite").query(kind="test-drafter")[0]
    assert row.settings["ckpt"] == str(base / "drafts" / "mine"), row.settings
    home_there = home if where == "box" else Path.home()
    assert row.settings["data"] == str(home_there / "dumps"), row.settings

    served = invoke(root, "serve", "--draft", "drafts/mine", "--host", where)
    assert served.returncode == 1 and "Traceback" not in served.stderr
    assert f"{base}/drafts/mine" in _words(served), _words(served)
