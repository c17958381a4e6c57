"""`invoke test-drafter`: evaluate a draft on its hidden-state dumps on the host, outside any server."""
from __future__ import annotations

from typing import TYPE_CHECKING

from invoke import Context
from invoke.exceptions import Exit

from draftops import cmdline
from draftops.cli.common import HOST_HELP, connect_each, friendly, live, warn
from draftops.cli.jsonout import JSON_HELP, answer, json_output
from draftops.cli.options import MAX_PENDING, MAX_PENDING_HELP, NUMBER, WHOLE, task
from draftops.console import console, escape
from draftops.drafter import flow
from draftops.drafter.asked import Asked
from draftops.runs.tools import ToolResult

if TYPE_CHECKING:
    from rich.console import Console

    from draftops.documents.drafter_report import DrafterReport
    from draftops.link.host import Host


#: said when Ctrl-C leaves the job running: the command that shows its verdict and records it later
COLLECT_HINT = "When it has ended, `invoke collect {run_id} --host {host}` shows its verdict and records it."


@task(help={"ckpt": "draft checkpoint folder on the host (default: the generated demo)",
            "data": "hidden-state dump folder on the host (default: the demo's)",
            "verifier": "target model folder on the host: verifier-argmax targets, missing embed_tokens",
            "config": "config file to use instead of <ckpt>/config.json",
            "steps": "TTT steps = the num_steps you will serve with (default 3)",
            "limit": "evaluate at most N samples", "expected_acc": "training-reported step-0 accuracy",
            "expected_accept_length": "an accept length reported by training or a server, held against the "
                                      "prediction after conversion (see --expected-from)",
            "expected_from": "whose definition --expected-accept-length follows: vllm (1 + accepted/drafts, "
                             "default), speculators, sglang, or specforge (simulated_acc_len: no +1, so 1 is added)",
            "full": "score every sample (the complete metrics) instead of stopping once the verdict is decided",
            "seed": "seed of the random order the sequential verdict scores samples in (default 0)",
            "temperature": "also predict the accept length at these sampling temperatures (0.7, or 0.7,1), for a "
                           "greedy and a probabilistic draft (needs the target: --verifier, or the demo's)",
            "device": "auto, cpu or cuda", "host": HOST_HELP, "max_pending": MAX_PENDING_HELP,
            "gpus": "run under torchrun with one rank per GPU of each host (gloo ranks on a CPU host); implies --full",
            "hosts": "with --gpus: spread over these hosts of hosts.yaml (comma-separated; the first one's address "
                     "holds the rendezvous and its run the report)",
            "port": "with --hosts or --nodes: the rendezvous port on the first node (default 29517, docs/drafter.md)",
            "nodes": "with --gpus on a Slurm host: one job of this many nodes, srun starting the ranks on each",
            "json": JSON_HELP,
            "strict": "exit 3 when the verdict is MISMATCH or a finding is ✗ (for scripts; without it a finished "
                      "evaluation exits 0 whatever it found)"},
      options={"steps": WHOLE, "limit": WHOLE, "expected_acc": NUMBER, "expected_accept_length": NUMBER,
               "seed": WHOLE, "max_pending": MAX_PENDING, "gpus": WHOLE, "port": WHOLE, "nodes": WHOLE})
@json_output("test-drafter")
@friendly
def test_drafter(c: Context, ckpt: str | None = None, data: str | None = None, verifier: str | None = None,
                 config: str | None = None, steps: int = 3, limit: int | None = None,
                 expected_acc: float | None = None, expected_accept_length: float | None = None,
                 expected_from: str | None = None, full: bool = False, seed: int | None = None,
                 device: str = "auto", host: str | None = None, max_pending: float | None = None,
                 gpus: int | None = None, hosts: str | None = None, port: int | None = None,
                 nodes: int | None = None, strict: bool = False, json: bool = False,
                 temperature: str | None = None) -> None:
    """Check that the features the server will feed the draft are the ones it was trained on.

    Exit 0 when the evaluation finished, whatever its verdict (a MISMATCH is a result, shown with its
    fix); 1 when it could not run. With --strict, 3 when the verdict is MISMATCH or a finding is ✗."""
    if bool(ckpt) != bool(data):
        raise Exit("error: give both --ckpt and --data (paths on the host), or neither for the demo.", code=1)
    names = _spread_names(gpus, hosts, port, host, nodes)
    temperatures = parse_temperatures(temperature)
    from remote.eagle import acceptlength  # not at import: `invoke --list` loads no remote/ module
    if expected_from is not None and (expected_from not in acceptlength.SOURCES or expected_accept_length is None):
        raise Exit(f"error: --expected-from {expected_from!r} names whose definition --expected-accept-length follows: "
                   f"give --expected-accept-length X with one of {', '.join(acceptlength.SOURCES)}.", code=1)
    spread = connect_each(c, names or [host], max_pending=max_pending,
                          check=lambda first: _slurm_or_hosts(first, names, nodes))
    asked = Asked(ckpt=ckpt, data=data, verifier=verifier, config=config, steps=steps, limit=limit,
                  expected_acc=expected_acc, expected_accept_length=expected_accept_length,
                  expected_from=expected_from, full=full, seed=seed, device=device, gpus=gpus, hosts=tuple(names),
                  nodes=nodes, port=port,
                  temperatures=tuple(float(t) for t in temperatures.split(",")) if temperatures else ())
    # The demo is generated once per host and kept next to the runs, outside the synced code tree.
    # The log shows in a window while the job runs and goes when it ends: the report below is the
    # result, shown once (a failure shows the log's end instead).
    found = flow.test_drafter(spread, asked, live("window", on_detach=COLLECT_HINT), warn)
    finish(found.done, found.report, found.given.get("ckpt"), strict)


def finish(done: ToolResult, report: DrafterReport | None, ckpt: str | None, strict: bool = False) -> None:
    """Answer --json, show the report (recorded by the flow); exit 1 on a failed run, 3 with --strict on
    a finding."""
    found = wrong(report) if strict and report is not None else []
    try:
        if done.ok and report is not None:
            show_result(report, str(done.result_file), done.run_id, ckpt, console)
    finally:
        answer(done.data, done.run_id)      # --json's document, whatever showing it did
    done.check()
    if found:       # --strict: a MISMATCH or a ✗ finding is exit 3, naming what was found (the report was shown)
        raise Exit(f"test-drafter --strict: {', '.join(found)} (see above); exit {EXIT_FINDINGS}", code=EXIT_FINDINGS)


EXIT_FINDINGS = 3      # as the doctor and the nightly exit when a finding says something is wrong


def wrong(report: DrafterReport) -> list[str]:
    """What --strict refuses: a MISMATCH verdict and the ✗ findings, by name."""
    bad = [f.id for f in report.findings if f.severity == "bad"]
    return [*(["MISMATCH"] if report.verdict.status == "MISMATCH" else []), *bad]


def _spread_names(gpus: int | None, hosts: str | None, port: int | None, host: str | None,
                  nodes: int | None) -> list[str]:
    """The hosts of a torchrun (``--hosts``, in order), after the flags' own checks."""
    if gpus is None and (hosts or port is not None or nodes is not None):
        raise Exit("error: --hosts, --nodes and --port spread a torchrun: give --gpus N (ranks per node) with them.",
                   code=1)
    if nodes is not None and nodes < 1:
        raise Exit(f"error: --nodes {nodes}: give the number of Slurm nodes, 1 or more.", code=1)
    if gpus is not None and gpus < 1:
        raise Exit(f"error: --gpus {gpus}: give the number of GPUs (ranks) per host, 1 or more.", code=1)
    names = [n.strip() for n in (hosts or "").split(",") if n.strip()]
    if hosts is not None and not names:
        raise Exit("error: --hosts names no host: give a comma-separated list of hosts.yaml entries.", code=1)
    if len(set(names)) != len(names):
        raise Exit(f"error: --hosts {hosts} names a host twice: each host is one node of the run.", code=1)
    if names and host and host != names[0]:
        raise Exit(f"error: --host {host} and --hosts {hosts}: the report comes from the first of --hosts; "
                   "give one of the two.", code=1)
    if port is not None and not 0 < port < 65536:
        raise Exit(f"error: --port {port} is not a TCP port (1-65535).", code=1)
    return names


#: the highest sampling temperature a prediction is made at (a server's temperature rarely exceeds 2)
MAX_TEMPERATURE = 100.0


def parse_temperatures(text: str | None) -> str | None:
    """``--temperature 0.7`` or ``0.7,1``: the values as the evaluator reads them, each finite and from 0
    to 100 (0 is greedy); anything else is one line naming the flag."""
    if text is None:
        return None
    parts = [p for p in str(text).replace(" ", "").split(",") if p]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if not values or len(values) > 8 or not all(0 <= v <= MAX_TEMPERATURE for v in values):  # NaN fails too
        raise Exit(f"error: --temperature {text!r}: give one to eight sampling temperatures from 0 to "
                   f"{MAX_TEMPERATURE:g}, comma-separated (e.g. --temperature 0.7 or --temperature 0.7,1).", code=1)
    return ",".join(repr(v) for v in dict.fromkeys(values))


def _slurm_or_hosts(host: Host, names: list[str], nodes: int | None) -> None:
    """``--nodes`` is for a Slurm host (one job, srun on each node); ``--hosts`` for the others."""
    slurm = host.spec.scheduler == "slurm"
    if nodes is not None and not slurm:
        raise Exit(f"error: --nodes is for a host with `scheduler: slurm`; {host.name!r} runs its jobs itself: "
                   "spread a torchrun over hosts with --hosts a,b.", code=1)
    if slurm and len(names) > 1:
        raise Exit(f"error: {host.name!r} is a Slurm host: ask for several nodes with --nodes M (one job, srun "
                   "starting the ranks on each), not --hosts.", code=1)


def show_result(data: DrafterReport, result_file: str, run_id: str, ckpt: str | None, out: Console) -> None:
    """The report's tables and verdict, where the report is, and the one command that applies its fix:
    on its own line, never wrapped, so it can be pasted whole at any terminal width."""
    from draftops import report  # rich panels: imported when there is a report to show

    # draft-config refuses a report without a fix
    task_ = fix_task(data) if data.fixable else None
    fix = cmdline.command(task_, "--ckpt", ckpt or "demo", "--from-report", run_id) if task_ else None
    report.show(data, out)
    out.print(f"[dim]report: {escape(result_file)}[/]", soft_wrap=True)
    if fix:
        out.print("fix it with:")
        out.print(escape("  " + fix), soft_wrap=True)


def fix_task(data: DrafterReport) -> str:
    """The task that applies the report's fix where it was judged (``convention.fix_task``)."""
    from remote.eagle import convention
    return convention.fix_task(data.verdict.advice_engine, data.checkpoint.format)
