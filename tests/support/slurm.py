"""A real one-node Slurm cluster on this machine for the Slurm tests (munged, slurmctld, slurmd).

Everything lives in a scratch folder the tests own: its own munge key and socket, its own slurm.conf
(``SLURM_CONF`` points the client commands at it), state, spool, logs and free ports, so an existing
``/etc/slurm`` or a system munged is never touched. Slurm runs as root here (``SlurmUser=root``), and
jobs are submitted through a real sshd as its login user (root, tests/support/sshd.py): the login node of the
cluster host is that sshd, whose sessions get ``SLURM_CONF`` (``SetEnv``).

Facts measured on this machine (Debian 12, Slurm 22.05.8): install 42 packages in about 2 minutes;
the cluster answers ``sinfo`` about 2 s after slurmd starts; a 3 s job is gone from ``squeue`` about
5 s after submission.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.sshd import free_port

SBIN = "/usr/sbin"
DAEMONS = ("munged", "slurmctld", "slurmd")
#: a job's SIGTERM-to-SIGKILL grace at its time limit or scancel (Slurm's default is 30 s)
KILL_WAIT_S = 5

CONF = """\
ClusterName=draftopstest
SlurmctldHost={node}({addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
KillWait={kill_wait}
MinJobAge=300
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.log
SlurmctldTimeout=10
SlurmdTimeout=30
MessageTimeout=5
NodeName={node} NodeAddr={addr} CPUs={cpus} RealMemory={mem} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def available() -> bool:
    """Whether Slurm and munge are installed (scripts/setup.sh --test installs them)."""
    return all(os.path.exists(f"{SBIN}/{d}") for d in DAEMONS) and shutil.which("sbatch") is not None


@dataclass
class Slurm:
    """A running one-node cluster: its conf file, node name and the daemons' processes."""

    folder: Path
    conf: Path
    node: str
    cpus: int
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 30, cwd: Path | None = None) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (sinfo, squeue, scontrol, scancel, sbatch), run in
        the cluster's folder unless ``cwd``: an sbatch without --output writes slurm-<id>.out there."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False, cwd=cwd or self.folder)

    def start_daemon(self, name: str) -> None:
        argv = {"munged": [f"{SBIN}/munged", "-F", "--force", f"--socket={self.folder}/munge/munge.socket",
                           f"--key-file={self.folder}/munge/munge.key",
                           f"--pid-file={self.folder}/munge/munged.pid",
                           f"--seed-file={self.folder}/munge/munged.seed",
                           f"--log-file={self.folder}/munge/munged.log"],
                "slurmctld": [f"{SBIN}/slurmctld", "-D", "-f", str(self.conf)],
                "slurmd": [f"{SBIN}/slurmd", "-D", "-N", self.node, "-f", str(self.conf)]}[name]
        log = open(self.folder / f"{name}.out", "ab")      # noqa: SIM115 - the daemon keeps its own copy
        with log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True, cwd=self.folder)

    def stop_daemon(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_controller(self) -> None:
        """slurmctld down (the fault tests): client commands then fail to reach the controller."""
        self.stop_daemon("slurmctld")

    def start_controller(self) -> None:
        self.start_daemon("slurmctld")
        self.wait_idle()

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Wait until the partition answers and the node takes jobs."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}): {self._log_tail(name)}")
            out = self.run("sinfo", "-h", "-o", "%t", timeout=15)
            last = (out.stdout + out.stderr).strip()
            if out.returncode == 0 and last and all(s in ("idle", "mix", "alloc") for s in last.split()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"Slurm did not come up in {timeout:.0f} s (sinfo: {last!r}); "
                           f"slurmctld: {self._log_tail('slurmctld')} slurmd: {self._log_tail('slurmd')}")

    def _log_tail(self, name: str) -> str:
        for path in (self.folder / f"{name}.log", self.folder / f"{name}.out"):
            if path.is_file():
                return path.read_text(errors="replace")[-1500:]
        return "(no log)"

    def wait_empty(self, timeout: float = 30.0) -> None:
        """Wait (bounded) until the queue holds no job, so every job's end is in the completion log."""
        deadline = time.monotonic() + timeout
        while self.run("squeue", "-h", "-o", "%i", timeout=15).stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.5)

    def cancel_all(self) -> None:
        """Cancel every job left by a test, so the next one finds the node idle."""
        self.run("scancel", "--user=root", timeout=15)

    def strays(self, inside: Path, repo: Path) -> list[str]:
        """What the cluster's jobs wrote outside the tests' folders: each ended job whose working folder
        (Slurm's WorkDir, where a job without --output writes slurm-<id>.out and a relative path lands)
        is not under ``inside``, from the job completion log (jobcomp/filetxt: every job that ended, also
        those Slurm's queue forgot after MinJobAge), and any slurm-<id>.out in ``repo``."""
        log = self.folder / "jobcomp.log"
        found = []
        for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
            fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
            work = Path(fields.get("WorkDir", "/"))
            if not work.is_relative_to(inside):
                found.append(f"job {fields.get('JobId')} ({fields.get('Name')}) ran in {work}")
        found += [f"{path} in the repository" for path in sorted(repo.glob("slurm-*.out"))]
        return found

    def stop(self) -> None:
        self.cancel_all()
        for name in ("slurmd", "slurmctld", "munged"):
            self.stop_daemon(name)


def start(folder: Path) -> Slurm:
    """Write the conf and a munge key into ``folder`` and start munged, slurmctld and slurmd."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    for sub in ("munge", "state", "spool"):
        (folder / sub).mkdir(mode=0o700, exist_ok=True)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    conf = folder / "slurm.conf"
    conf.write_text(CONF.format(d=folder, node=node, addr="127.0.0.1", ctld_port=free_port(),
                                slurmd_port=free_port(), cpus=cpus, mem=1000, kill_wait=KILL_WAIT_S))
    cluster = Slurm(folder, conf, node, cpus)
    try:
        cluster.start_daemon("munged")
        _wait_for(folder / "munge" / "munge.socket", cluster)
        cluster.start_daemon("slurmctld")
        cluster.start_daemon("slurmd")
        cluster.wait_idle()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for(path: Path, cluster: Slurm, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear: {cluster._log_tail('munged')}")
        time.sleep(0.05)
