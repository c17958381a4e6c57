"""`invoke test-drafter`: evaluate a draft on its hidden-state dumps on the host, outside any server."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from invoke import Context
from invoke.exceptions import Exit

from draftops import cmdline
from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, host_path, live
from draftops.cli.history import record_test_drafter
from draftops.cli.jsonout import JSON_HELP, answer, json_output
from draftops.cli.options import MAX_PENDING, MAX_PENDING_HELP, NUMBER, WHOLE, task
from draftops.console import console, escape
from draftops.runs import jobs
from draftops.runs.tools import ToolResult, run_tool
from draftops.serve.host_engine import host_engine
from draftops.serve.request import demo_dir

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
    host = connect(c, names[0] if names else host, max_pending=max_pending)
    ensure_code(host)
    _slurm_or_hosts(host, names, nodes)
    spread = [host, *(connect(c, name) for name in names[1:])]
    for other in spread[1:]:
        ensure_code(other)
    args = ["eval", "--out", jobs.RUN_DIR, "--steps", str(steps), "--device", device]
    served = host_engine(host)    # the engine, its installed version, a launch algorithm the profile sets
    engine = served.engine
    args += served.eval_args()
    ckpt, data, verifier, config = (host_path(host, p) for p in (ckpt, data, verifier, config))
    for flag, value in (("--ckpt", ckpt), ("--data", data), ("--verifier", verifier), ("--config", config),
                        ("--limit", limit), ("--expected-acc", expected_acc),
                        ("--expected-accept-length", expected_accept_length), ("--expected-from", expected_from),
                        ("--seed", seed), ("--temperature", temperatures)):
        if value is not None:
            args += [flag, str(value)]
    args += ["--full"] if full or gpus else []     # a torchrun scores every sample
    measured = _capture_check(c, host, data, verifier, engine) if len(spread) == 1 else None
    if measured:
        args += ["--measured", f"{host.runs_dir}/{measured}/capture-check.json"]
        if _kept_states(c, measured):
            args += ["--engine-states", f"{host.runs_dir}/{measured}/engine-states"]
    given = {"ckpt": ckpt, "data": data, "verifier": verifier, "config": config, "steps": steps,
             "limit": limit, "expected_acc": expected_acc, "expected_accept_length": expected_accept_length,
             "expected_from": expected_from, "device": device, "measured_by": measured,
             **({"full": True} if full or gpus else {}), **({"seed": seed} if seed is not None else {}),
             **({"gpus": gpus} if gpus else {}), **({"hosts": ",".join(names)} if len(names) > 1 else {}),
             **({"nodes": nodes} if nodes else {}), **({"temperature": temperatures} if temperatures else {})}
    # The demo is generated once per host and kept next to the runs, outside the synced code tree.
    # The log shows in a window while the job runs and goes when it ends: the report below is the
    # result, shown once (a failure shows the log's end instead).
    if gpus:
        from draftops.runs.spread import run_torchrun  # not at import: `invoke --list` loads no remote/ module

        done = run_torchrun(spread, gpus, args, nodes=nodes, port=port, name="test-drafter",
                            view=live("window", on_detach=COLLECT_HINT), task="test-drafter", given=given,
                            env=lambda h: {"DRAFTOPS_DEMO_DIR": demo_dir(h.state_dir)})
    else:
        done = run_tool(host, "remote.drafter", args, name="test-drafter", view=live("window", on_detach=COLLECT_HINT),
                        task="test-drafter", given=given, env={"DRAFTOPS_DEMO_DIR": demo_dir(host.state_dir)})
    _finish(host, done, given, ckpt, strict)


def _finish(host: Host, done: ToolResult, given: dict[str, Any], ckpt: str | None, strict: bool) -> None:
    """Show the report, record the run, answer --json; exit 1 on a failed run, 3 with --strict on a finding."""
    report = read_report(host, done, given)
    answer(done.data, done.run_id)
    if done.ok and report is not None:
        show_result(report, str(done.result_file), done.run_id, ckpt, console)
    record_test_drafter(host, done, given, report)
    done.check()
    if strict and report is not None:
        refuse_findings(report)


EXIT_FINDINGS = 3      # as the doctor and the nightly exit when a finding says something is wrong


def refuse_findings(report: DrafterReport) -> None:
    """--strict: a MISMATCH or a ✗ finding is exit 3, naming what was found (the report was shown)."""
    bad = [f.id for f in report.findings if f.severity == "bad"]
    if report.verdict.status == "MISMATCH" or bad:
        what = ", ".join([*(["MISMATCH"] if report.verdict.status == "MISMATCH" else []), *bad])
        raise Exit(f"test-drafter --strict: {what} (see above); exit {EXIT_FINDINGS}", code=EXIT_FINDINGS)


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


def _capture_check(c: Context, host: Host, data: str | None, verifier: str | None, engine: str | None) -> str | None:
    """The newest capture-check of these dumps and target on the engine the host serves with, whose run
    folder the host still holds; its measured slot layers replace data_config.json's claims, and the
    engine states it kept (vLLM) score the draft on every boundary too."""
    from draftops.cli.common import project_root
    from draftops.errors import JobError
    from draftops.serve.verdicts import capture_for_dumps

    root = demo_dir(host.state_dir)
    data, target = (data, verifier) if data else (f"{root}/data", verifier or f"{root}/target")
    if engine is None or target is None:
        return None
    run = capture_for_dumps(project_root(c) / "runs", data, target, engine)
    if run is None:
        return None
    try:
        jobs.status(host, run)
    except JobError:
        return None
    return run


def _kept_states(c: Context, run: str) -> bool:
    """Whether that capture-check kept the engine's states (its report names them)."""
    from draftops.cli.common import project_root
    from draftops.serve.verdicts import kept_engine_states

    return kept_engine_states(project_root(c) / "runs", run)


def read_report(host: Host, done: ToolResult, given: dict[str, Any]) -> DrafterReport | None:
    """The run's report as its model, read once here (None when it left none). A report that fails
    the model is recorded as a run without one, then refused in one paragraph naming the file (or,
    when the run failed, by the run's own reason)."""
    from draftops.documents import drafter_report  # pydantic: imported when a run has ended
    from draftops.errors import DocumentError, ToolFailed

    try:
        return done.document(drafter_report.DrafterReport)
    except (DocumentError, ToolFailed):
        record_test_drafter(host, done, given, None)
        raise


def show_result(data: DrafterReport, result_file: str, run_id: str, ckpt: str | None, out: Console) -> None:
    """The report's tables and verdict, where the report is, and the one command that applies its fix:
    on its own line, never wrapped, so it can be pasted whole at any terminal width."""
    from draftops import report  # rich panels: imported when there is a report to show

    report.show(data, out)
    out.print(f"[dim]report: {escape(result_file)}[/]", soft_wrap=True)
    if data.fixable:    # draft-config refuses a report without a fix
        out.print("fix it with:")
        out.print(escape("  " + cmdline.command(fix_task(data), "--ckpt", ckpt or "demo", "--from-report", run_id)),
                  soft_wrap=True)


def fix_task(data: DrafterReport) -> str:
    """The task that applies the report's fix where it was judged (``convention.fix_task``)."""
    from remote.eagle import convention
    return convention.fix_task(data.verdict.advice_engine, data.checkpoint.format)
