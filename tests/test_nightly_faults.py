"""Faults around a night on the local host (cheap steps only): a night on a host another night holds, a history
that cannot be written, a host the inventory does not know, a task that does not exist."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.support.tasks import invoke

pytestmark = pytest.mark.slow


@pytest.fixture
def project(make_project, tmp_path, no_inventory_env) -> Path:
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot")}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    (root / "playbooks").mkdir()
    return root


def playbook(root: Path, **book) -> str:
    book.setdefault("hosts", ["loc"])
    book.setdefault("steps", [{"name": "sync", "task": "sync"}])
    (root / "playbooks" / "p.yaml").write_text(yaml.safe_dump(book))
    return "playbooks/p.yaml"


def keys(root: Path, *hosts: str) -> dict[str, str]:
    """The lock keys `invoke nightly` takes for ``hosts``, from the project's real hosts.yaml."""
    from draftops.inventory import load_inventory
    from draftops.nightly import hostlock
    inventory = load_inventory(root / "hosts.yaml", root)
    return hostlock.lock_keys({h: inventory.hosts[h] for h in hosts})


def test_a_night_on_a_host_another_night_holds_is_refused_and_runs_once_it_ended(project, tmp_path):
    from draftops.errors import NightBusy
    from draftops.nightly import hostlock
    runs = project / "runs"
    other = {"other": "local:" + str(tmp_path / "elsewhere")}
    with hostlock.hold(runs, keys(project, "loc"), "playbooks/p.yaml"):
        with hostlock.hold(runs, other, "playbooks/q.yaml"):      # another machine or root: no wait
            pass
        with pytest.raises(NightBusy, match=r"host 'loc' is in use .*pid \d+, playbook playbooks/p.yaml"):
            with hostlock.hold(runs, {**other, **keys(project, "loc")}, "playbooks/q.yaml"):
                pass
        with hostlock.hold(runs, other, "playbooks/q.yaml"):      # the refused night let go of 'other'
            pass
        busy = invoke(project, "nightly", "--playbook", playbook(project))
        assert busy.returncode == 75 and "in use by another night" in busy.stderr, busy.stdout + busy.stderr
        assert not list(runs.glob("nightly-*"))
    done = invoke(project, "nightly", "--playbook", playbook(project))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def twins(make_project, tmp_path, no_inventory_env) -> Path:
    """Two inventory names for one machine and root (and a third name with a root of its own)."""
    box = {"transport": "local", "root": str(tmp_path / "locroot")}
    root = make_project({"loc": box, "alias": {**box, "root": str(tmp_path / "locroot") + "/"},
                         "apart": {**box, "root": str(tmp_path / "apartroot")}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    (root / "playbooks").mkdir()
    return root


def test_two_names_for_one_machine_and_root_never_run_nights_at_once(twins):
    from draftops.nightly import hostlock
    path = playbook(twins, hosts=["loc", "alias", "apart"])
    with hostlock.hold(twins / "runs", keys(twins, "loc"), "playbooks/p.yaml"):
        busy = invoke(twins, "nightly", "--playbook", path, "--hosts", "alias")
        assert busy.returncode == 75, busy.stdout + busy.stderr
        assert "host 'alias' is in use by another night" in busy.stderr and "as host 'loc'" in busy.stderr
        apart = invoke(twins, "nightly", "--playbook", path, "--hosts", "apart")
        assert apart.returncode == 0, apart.stdout + apart.stderr            # its own root: no wait
    both = invoke(twins, "nightly", "--playbook", path, "--hosts", "loc,alias")
    assert both.returncode == 1 and "'loc' and 'alias' are the same machine and root" in both.stderr, both.stderr
    assert len(list((twins / "runs").glob("nightly-*"))) == 1


def test_hosts_given_twice_run_once_and_an_empty_name_is_refused(project):
    path = playbook(project)
    empty = invoke(project, "nightly", "--playbook", path, "--hosts", "loc,,loc")
    assert empty.returncode == 1 and "empty host name" in empty.stderr, empty.stdout + empty.stderr
    assert "another night" not in empty.stderr and not list((project / "runs").glob("nightly-*"))
    twice = invoke(project, "nightly", "--playbook", path, "--hosts", "loc, loc")
    assert twice.returncode == 0, twice.stdout + twice.stderr
    assert twice.stdout.count("loc: healthy") == 1


def test_a_history_that_cannot_be_written_still_gives_a_report(project):
    path = playbook(project)
    (project / "runs" / "history.sqlite").mkdir(parents=True)           # not a database: a folder
    done = invoke(project, "nightly", "--playbook", path)
    assert done.returncode == 1, done.stdout + done.stderr
    (folder,) = (project / "runs").glob("nightly-*")
    md = (folder / "report.md").read_text()
    assert "loc: ERROR — 1 steps: 1 ok" in md and "could not be read from the history" in md, md
    assert "[exit 0]" in (folder / "loc" / "01-sync.log").read_text()


def test_unknown_host_and_unknown_task_are_refused_before_anything_runs(project):
    done = invoke(project, "nightly", "--playbook", playbook(project, hosts=["loc", "ghost"]))
    assert done.returncode == 1 and "ghost" in done.stderr and "hosts.yaml" in done.stderr, done.stderr
    done = invoke(project, "nightly", "--playbook", playbook(project, steps=[{"name": "s", "task": "snyc"}]))
    assert done.returncode == 1 and "unknown task `snyc`" in done.stderr and "`sync`" in done.stderr, done.stderr
    # an argument the task does not take, or a flag given text (it would run `serve.stop` as a task)
    bad = playbook(project, steps=[{"name": "s", "task": "runs", "args": {"local": "serve.stop"}}])
    for args in (("nightly", "--playbook", bad), ("nightly.schedule", "--at", "02:00", "--playbook", bad)):
        done = invoke(project, *args)
        assert done.returncode == 1 and "playbooks/p.yaml:" in done.stderr, done.stderr
        assert "step 1 ('s'), argument `local`" in done.stderr and "on/off flag" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert not list((project / "runs").glob("nightly-*")) and not list((project / "runs").glob("*-runs-*"))


def test_a_night_id_reused_the_same_day_does_not_overwrite_the_earlier_nights_row(project, tmp_path):
    import shutil

    from draftops import history
    path = playbook(project)
    first = invoke(project, "nightly", "--playbook", path)
    assert first.returncode == 0, first.stdout + first.stderr
    (folder,) = (project / "runs").glob("nightly-*")
    shutil.move(folder, tmp_path / "moved-away")             # the report folder is moved away, its row stays
    second = invoke(project, "nightly", "--playbook", path)
    assert second.returncode == 0, second.stdout + second.stderr
    rows = history.for_project(project).query(kind="nightly")
    assert len(rows) == 2 and len({r.run_id for r in rows}) == 2, [r.run_id for r in rows]
    assert f"{folder.name}-loc" in {r.run_id for r in rows}
    (again,) = (project / "runs").glob("nightly-*")
    assert again.name != folder.name and f"{again.name}-loc" in {r.run_id for r in rows}


def test_a_nights_row_is_never_replaced(tmp_path):
    from draftops import history
    from draftops.errors import HistoryError
    hist = history.History(tmp_path / "history.sqlite")
    hist.insert(history.RunRecord(run_id="nightly-2026-12-01-loc", kind="nightly", host="loc", verdict="ok"))
    with pytest.raises(HistoryError, match="already in"):
        hist.insert(history.RunRecord(run_id="nightly-2026-12-01-loc", kind="nightly", host="loc", verdict="failed"))
    row = hist.get("nightly-2026-12-01-loc")
    assert row is not None and row.verdict == "ok"


def test_hosts_points_a_playbook_at_a_host_outside_its_list(make_project, tmp_path, no_inventory_env):
    """Issue 35, item 20: a playbook written for `loc` runs on `gpu` without a copy (`--hosts gpu`), its
    steps filled in for that host; a name hosts.yaml does not know is still refused, naming the known ones."""
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot")},
                         "gpu": {"transport": "local", "root": str(tmp_path / "gpuroot")}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    (root / "playbooks").mkdir()
    path = playbook(root, hosts=["loc", "ghost"])            # a placeholder host the inventory lacks, too
    done = invoke(root, "nightly", "--playbook", path, "--hosts", "gpu")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu: healthy" in done.stdout and "loc: healthy" not in done.stdout
    assert (tmp_path / "gpuroot" / "code").is_dir() and not (tmp_path / "locroot").exists()
    nope = invoke(root, "nightly", "--playbook", path, "--hosts", "gpux")
    said = " ".join(nope.stderr.split())
    assert nope.returncode == 1 and "gpux not in the inventory (known hosts:" in said and "gpu" in said, said
