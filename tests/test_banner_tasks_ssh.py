"""Every task that reads from the host, typed as a user types it, over a real sshd whose SSH user's
shell start-up files print (several lines on stdout, JSON-looking lines, a fake reply marker, noise
on stderr, bytes without a newline): each reads right, and no banner line reaches what it shows or
records (issue 23: one seam for host I/O). The serve tasks run the SGLang test double.

The history digest is the case that motivated it: serve digested the stdout of a `cat` of the
draft's config.json, so with a banner it hashed banner + JSON and its row matched neither the
digest the host computes for bench (remote/bench/runner.py) nor any test-drafter run."""
from __future__ import annotations

import json
import sys

import pytest

from draftops import history
from draftops.env import mlenv
from draftops.link.host import open_host
from remote.bench.digest import file_digest
from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.banners import NOISY_BASHRC
from tests.support.serving import (
    draft_config,
    ok,
    processes_of_runs_under,
    profile,
    serve_draft,
    stop_processes,
    write_model,
)
from tests.support.sshd import start_sshd
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh

PROFILE = 'echo "hello from profile"\nprintf \'{"runs": [], "digest": "sha256:0"}\\n\'\necho "profile: line three"\n'
BANNER = ("hello from bashrc", "hello from profile", "gzip-looking bytes", "/not/the/root", "profile: line three")


@pytest.fixture(scope="module")
def banner_home(tmp_path_factory):
    return tmp_path_factory.mktemp("banner-home")


@pytest.fixture(scope="module")
def noisy_sshd(tmp_path_factory, client_key, banner_home):
    server = start_sshd(tmp_path_factory.mktemp("noisy-sshd"), client_key, extra_config=f"SetEnv HOME={banner_home}\n")
    yield server
    server.stop()


@pytest.fixture
def project(make_project, noisy_sshd, tmp_path, no_inventory_env, banner_home):
    (banner_home / ".bashrc").write_text(NOISY_BASHRC)
    (banner_home / ".profile").write_text(PROFILE)
    (tmp_path / "reqs.txt").write_text("# nothing to install\n")
    venv = tmp_path / "ml env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    entry = ssh_entry(noisy_sshd, tmp_path, env={"venv": str(venv), "requirements": str(tmp_path / "reqs.txt")},
                      python=sys.executable, serve={"default": profile(tmp_path)})
    root = make_project({"box": entry}, default="box")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    yield root
    stop_processes(processes_of_runs_under(tmp_path))


def clean(out: str) -> str:
    """``out`` with no line of the banner in it."""
    assert not [mark for mark in BANNER if mark in out], out
    return out


def test_the_banner_is_real(project):
    assert open_host(None, project).transport.run("true").stdout.startswith(b"hello from bashrc\n")


def test_the_history_digest_of_a_host_config_is_the_hosts_own(project, tmp_path):
    from draftops.runs.hostfiles import config_digest_of as host_config_digest
    draft = write_model(tmp_path / "draft", draft_config([2, 8]))
    assert host_config_digest(open_host(None, project), f"{draft}/config.json") == file_digest(draft)


def test_every_task_that_reads_the_host_reads_right_through_a_banner(project, tmp_path):
    clean(ok(invoke(project, "sync")))
    clean(ok(invoke(project, "sync")))                    # the manifest read back: a no-op
    # env.setup's stored-hash read: a current ml-env is seen as current
    (tmp_path / "ml env" / mlenv.HASH_FILE).write_text(mlenv.plan(open_host(None, project)).digest)
    assert "is up to date" in clean(ok(invoke(project, "env.setup")))
    # env.check: the envcheck job, its pull, and the engine probe (not installed here)
    checked = clean(ok(invoke(project, "env.check")))
    assert "python" in checked and "vllm" in checked
    run_id = next((project / "runs").glob("*env-check*")).name
    # runs, logs, pull of that run
    assert run_id[:15] in clean(ok(invoke(project, "runs")))
    clean(ok(invoke(project, "logs", run_id, "--all")))
    (project / "runs" / run_id).rename(tmp_path / "moved")
    clean(ok(invoke(project, "pull", run_id)))
    assert json.loads((project / "runs" / run_id / "env.json").read_text())["python"]
    # serve, serve.status, serve.logs through the banner; the recorded digest is the host's own
    draft = write_model(tmp_path / "draft", draft_config([1, 15, 28]))
    served = clean(ok(invoke(project, "serve", "--draft", draft, "--steps", "3", "--topk", "1",
                             "--draft-tokens", "4")))
    assert "ready: SGLang" in served
    status = clean(ok(invoke(project, "serve.status")))
    assert "alive" in status and "num_draft_tokens=4" in status
    logs = clean(ok(invoke(project, "serve.logs", "--lines", "400")))
    assert "The server is fired up and ready to roll!" in logs
    (row,) = history.for_project(project).query(kind="serve")
    assert row.draft_digest == file_digest(draft)          # what remote/bench/runner.py computes there
    clean(ok(invoke(project, "serve.stop", "--all")))


def test_test_drafter_and_bench_read_right_through_a_banner(project, tmp_path):
    """The two tasks the test above leaves out: the evaluator's job, pull and report, and a bench
    with the engine client's output, the server's metrics and the history row."""
    import shutil

    from tests.support.drafter_support import demo
    shutil.copytree(demo().root, tmp_path / "hostroot" / "state" / "demo")   # the host's demo, seeded
    evaluated = clean(ok(invoke(project, "sync", "test-drafter", "--steps", "3")))
    assert "MISMATCH" in evaluated and "predicted accept length" in evaluated
    (drafted,) = history.for_project(project).query(kind="test-drafter")
    assert drafted.verdict == "MISMATCH"
    draft = serve_draft(project, tmp_path)
    benched = clean(ok(invoke(project, "bench", "--prompts", "3", "--repeats", "1", "--input-len", "8",
                              "--output-len", "8")))
    assert "accept length" in benched
    (row,) = history.for_project(project).query(kind="bench")
    assert row.draft_digest == file_digest(draft)
    run_dir = next((project / "runs").glob("*-bench-*"))
    assert json.loads((run_dir / "bench-result.json").read_text())["schema"].startswith("draftops.bench-result/")
    clean(ok(invoke(project, "serve.stop", "--all")))
