"""A host whose shell start-up files print things (a banner, JSON-looking lines, text without a
newline, noise on stderr) must not break any agent reply, log, follow or pull: replies are framed
with a per-call marker and whatever comes before it is ignored. An answer without the marker is an
error, never an empty reply. The sshd here gives the SSH user a test HOME (SetEnv HOME=...), so its
~/.bashrc is ours to write and the machine's own is never touched."""
from __future__ import annotations

import json

import pytest

from draftops.errors import JobError, RemoteError
from draftops.link.host import open_host
from draftops.runs import jobs
from draftops.runs.sync import sync
from tests.conftest import ssh_entry
from tests.support.banners import NOISY_BASHRC
from tests.support.processes import wait_state
from tests.support.sshd import start_sshd

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def banner_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("banner-home")
    (home / ".bashrc").write_text(NOISY_BASHRC)
    return home


@pytest.fixture(scope="module")
def noisy_sshd(tmp_path_factory, client_key, banner_home):
    server = start_sshd(tmp_path_factory.mktemp("noisy-sshd"), client_key,
                        extra_config=f"SetEnv HOME={banner_home}\n")
    yield server
    server.stop()


@pytest.fixture
def noisy_project(make_project, noisy_sshd, tmp_path, no_inventory_env, banner_home):
    (banner_home / ".bashrc").write_text(NOISY_BASHRC)
    return make_project({"box": ssh_entry(noisy_sshd, tmp_path)}, default="box")


def test_the_banner_really_reaches_the_agent_channel(noisy_project):
    host = open_host(None, noisy_project)
    out = host.transport.run("true").stdout
    assert out.startswith(b"hello from bashrc\n")


def test_every_agent_reply_survives_a_banner(noisy_project, tmp_path):
    host = open_host(None, noisy_project)
    assert host.root == str(tmp_path / "hostroot")
    report = sync(host)                                   # manifest + apply through the agent
    assert report.upload and (tmp_path / "hostroot" / "code" / "remote" / "job.py").is_file()
    assert sync(host).noop
    job = jobs.start(host, "banner", "echo one; echo two; exit 4", task="banner", args={"n": 1})
    row = wait_state(noisy_project, job.id, {"failed", "succeeded", "dead"})
    assert row["state"] == "failed" and row["exit_code"] == 4 and row["task"] == "banner"
    assert [r["id"] for r in jobs.list_runs(host)] == [job.id]
    shown: list[str] = []
    header = jobs.read_log(host, job.id, shown.append)
    assert shown == ["one", "two"] and header["offset"] == 0
    followed: list[str] = []
    final = jobs.follow(host, job.id, followed.append)
    assert followed == ["one", "two"] and final["state"] == "failed"
    pulled = jobs.pull_run(host, job.id)
    assert (pulled.path / "log").read_text() == "one\ntwo\n" and pulled.skipped == []
    assert json.loads((pulled.path / "status.json").read_text())["exit_code"] == 4


def test_kill_and_errors_survive_a_banner(noisy_project):
    host = open_host(None, noisy_project)
    job = jobs.start(host, "sleeper", "sleep 300")
    wait_state(noisy_project, job.id, {"running"})
    assert jobs.kill(host, job.id, grace_s=2)["state"] == "killed"
    with pytest.raises(Exception, match="no run 'nope'"):
        jobs.status(host, "nope")
    with pytest.raises(Exception, match="no run 'nope'"):
        jobs.pull_run(host, "nope")


@pytest.mark.parametrize("swallow", ["exit 0", "exec true", 'exec sh -c \'echo "{}"\''])
def test_an_answer_without_the_marker_is_an_error_not_an_empty_reply(noisy_project, banner_home, swallow):
    (banner_home / ".bashrc").write_text(f"echo banner\n{swallow}\n")
    with pytest.raises(RemoteError, match="reply marker|could not start") as info:
        open_host(None, noisy_project, prepare=True)
    assert "start-up files" in str(info.value) or "python3" in str(info.value)


def test_an_unframed_answer_to_a_later_command_is_an_error(noisy_project, banner_home):
    host = open_host(None, noisy_project, prepare=True)
    (banner_home / ".bashrc").write_text("echo '{\"runs\": []}'\nexit 0\n")
    with pytest.raises(RemoteError, match="reply marker"):
        jobs.list_runs(host)
    with pytest.raises(RemoteError, match="reply marker"):
        jobs.read_log(host, "some-run", lambda line: None)
    with pytest.raises(JobError, match="reply marker.*was left as it was") as err:
        jobs.pull_run(host, "some-run")
    assert isinstance(err.value.__cause__, RemoteError) and err.value.__cause__.result.command == "pack runs/some-run"
    runs = host.project_root / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []      # no partial pull left behind


def test_the_engine_probe_of_env_check_survives_a_banner(noisy_project):
    """env.check's engine rows read one JSON line per engine from a plain command: the banner's lines
    came first and env.check ended in a JSONDecodeError."""
    from draftops.env import engine_env
    rows = engine_env.probe(open_host(None, noisy_project))
    assert [r["engine"] for r in rows] == list(engine_env.ENGINES)
    assert all(r["version"] is None and r["current"] is False for r in rows)


def test_env_setup_sees_a_current_ml_env_through_a_banner(make_project, noisy_sshd, tmp_path, no_inventory_env,
                                                            banner_home):
    """The stored hash is read with a plain command: the banner came with it, so the ml-env never read
    as current and every env.setup reinstalled it."""
    import sys

    from draftops.env import mlenv
    (banner_home / ".bashrc").write_text(NOISY_BASHRC)
    (tmp_path / "reqs.txt").write_text("# nothing\n")
    venv = tmp_path / "ml env"
    entry = ssh_entry(noisy_sshd, tmp_path, env={"venv": str(venv), "requirements": str(tmp_path / "reqs.txt")})
    host = open_host(None, make_project({"box": entry}, default="box"))
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / mlenv.HASH_FILE).write_text(mlenv.plan(host).digest)
    assert mlenv.plan(host).up_to_date


def test_env_setup_engine_sees_a_current_engine_venv_through_a_banner(noisy_project, tmp_path):
    from draftops.env import engine_env
    host = open_host(None, noisy_project)
    venv = tmp_path / "engine venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/bin/true")
    (venv / engine_env.HASH_FILE).write_text(engine_env.plan(host, "vllm", str(venv)).digest)
    assert engine_env.plan(host, "vllm", str(venv)).up_to_date
