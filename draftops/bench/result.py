"""The bench result file, ``runs/<id>/bench-result.json``, schema ``draftops.bench-result/1``.

One file per ``invoke bench`` run holds everything ``bench compare`` needs without going back to
the host: the host facts, the engine and version, the target, the draft (path, config digest,
layer ids as written and in whose convention), the *effective* speculative settings the server
reported, the benchmark settings, every metric as median and spread over the repeats, and the
accept length measured two ways with their cross-check. Keys are only ever added within a
schema version; renaming or removing one bumps it (docs/bench.md has the full table).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from draftops.bench.stats import Stat, summarize
from draftops.documents import first_problem, non_finite, other_schema
from draftops.errors import BenchError
from draftops.history import RunRecord
from remote import jsonread
from remote.bench.client_output import ClientRecord
from remote.bench.crosscheck import TOLERANCE, cross_check
from remote.bench.server_metrics import WindowAccept
from remote.eagle import acceptlength
from remote.fileio import atomic_write_bytes

SCHEMA = "draftops.bench-result/1"
RESULT_NAME = "bench-result.json"


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class HostFacts(_Model):
    name: str
    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    cpu: str | None = None


class EngineInfo(_Model):
    name: Literal["sglang", "vllm"]
    version: str | None = None


class DraftInfo(_Model):
    path: str
    digest: str | None = None                                  # remote.bench.digest.config_digest
    format: str | None = None                                  # "flat" | "speculators"
    layer_ids: list[int] | None = None                         # as written in the config
    layer_id_convention: Literal["sglang", "vllm"] | None = None


class Speculative(_Model):
    """Effective settings, as the server reports them (SGLang may override what was asked)."""

    algorithm: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    asked: dict[str, Any] | None = None


class Settings(_Model):
    dataset: str                                               # "random", "random-ids" or the prompt file
    dataset_kind: Literal["random-ids", "text"]
    prompts: int
    repeats: int
    concurrency: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    seed: int | None = None
    temperature: float | None = None
    request_rate: float | None = None                          # None = all at once (inf)
    max_running_requests: int | None = None
    warmup: bool = True
    ignore_eos: bool | None = None
    chat_template: bool | None = None                          # added: prompts sent through the chat template


class Metrics(_Model):
    output_throughput: Stat = Stat()                           # tok/s
    request_throughput: Stat = Stat()
    ttft_median_ms: Stat = Stat()
    ttft_p99_ms: Stat = Stat()
    tpot_median_ms: Stat = Stat()
    tpot_p99_ms: Stat = Stat()
    itl_median_ms: Stat = Stat()
    itl_p99_ms: Stat = Stat()
    completed: int | None = None
    failed: int | None = None


class AcceptLength(_Model):
    client: Stat | None = None      # vLLM spec_decode_acceptance_length; SGLang accept_length
    server: Stat | None = None                                 # /metrics window, server info or decode log
    server_source: str | None = None
    value: float | None = None                                 # the one compared with predictions
    source: str | None = None
    cross_check: dict[str, Any] | None = None
    definition: str | None = None       # added: what the figures count (remote/eagle/acceptlength.py)


#: what the measured per-position figures mean, written into every result that has them
VLLM_DEFINITION = ("vLLM's per-position acceptance: accepted tokens at draft position k / drafts = the share of "
                   "drafts whose positions 0..k were all accepted (cumulative, per draft: the +1 bonus token is "
                   "not in it, accept length = 1 + their sum); conditional at k = cumulative[k] / "
                   "cumulative[k-1], at k = 0 cumulative[0]")
SGLANG_NOTE = ("not available: SGLang reports no per-position acceptance; its server info holds one average "
               "accept length, cumulative since the last /flush_cache (the +1 bonus token included), and its "
               "decode log one per interval")


class PerPosition(_Model):
    """The server's acceptance per draft position, normalised to what test-drafter predicts per TTT
    step (docs/bench.md § Per position): both sides as P(position k accepted | positions < k were)."""

    available: bool
    source: str | None = None              # "client" (spec_decode_per_position_acceptance_rates), "metrics window"
    drafts: float | None = None            # drafts the figures count, over all repeats
    cumulative: list[float] = []           # k: share of drafts whose positions 0..k were all accepted
    conditional: list[float | None] = []   # k: cumulative[k] / cumulative[k-1]; k = 0: cumulative[0]
    reached: list[float] = []              # k: drafts that got to position k (all of them at k = 0)
    definition: str | None = None
    note: str | None = None


class Repeat(_Model):
    index: int
    client_file: str | None = None
    record: dict[str, Any] | None = None
    server_accept: float | None = None
    server_per_position: list[float] | None = None             # the /metrics window's, per draft
    problems: list[dict[str, Any]] = []


class BenchResult(_Model):
    schema_: Literal["draftops.bench-result/1"] = Field("draftops.bench-result/1", alias="schema")
    run_id: str
    time: str
    status: Literal["succeeded", "failed"]
    failure: str | None = None
    host: HostFacts
    engine: EngineInfo
    target: str
    draft: DraftInfo | None = None
    speculative: Speculative | None = None
    patch_state: str | None = None
    settings: Settings
    metrics: Metrics
    accept_length: AcceptLength | None = None
    per_position: PerPosition | None = None                    # added: None for a baseline
    repeats: list[Repeat] = []
    warnings: list[str] = []
    files: dict[str, str] = {}                                 # role -> path inside the run folder

    @property
    def mode(self) -> str:
        return "speculative" if self.draft is not None else "baseline"

    @property
    def steps(self) -> int | None:
        return self.speculative.num_steps if self.speculative else None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


_METRIC_KEYS = {"output_throughput": "output_throughput", "request_throughput": "request_throughput",
                "ttft_median_ms": "median_ttft_ms", "ttft_p99_ms": "p99_ttft_ms",
                "tpot_median_ms": "median_tpot_ms", "tpot_p99_ms": "p99_tpot_ms",
                "itl_median_ms": "median_itl_ms", "itl_p99_ms": "p99_itl_ms"}


def build_metrics(records: Sequence[ClientRecord | None]) -> Metrics:
    """Median and spread of every metric over the repeats (a failed repeat is None)."""
    fields: dict[str, Any] = {name: summarize(getattr(r, key) if r else None for r in records)
                              for name, key in _METRIC_KEYS.items()}
    completed = [r.completed for r in records if r and r.completed is not None]
    failed = [r.failed for r in records if r and r.failed is not None]
    return Metrics(**fields, completed=int(sum(completed)) if completed else None,
                   failed=int(sum(failed)) if failed else None)


def build_accept(records: Sequence[ClientRecord | None], server: Sequence[float | None],
                 server_source: str | None, tolerance: float = TOLERANCE, engine: str | None = None
                 ) -> AcceptLength | None:
    """Accept length from the client and from the server, cross-checked; the client's median is the
    headline value when it has one (it covers exactly the measured requests)."""
    client = summarize(r.accept_length if r else None for r in records)
    server_stat = summarize(server)
    if client.median is None and server_stat.median is None:
        return None
    check = cross_check(client.median, server_stat.median, a_source="client",
                        b_source=server_source or "server", tolerance=tolerance)
    value, source = ((client.median, "client") if client.median is not None
                     else (server_stat.median, server_source or "server"))
    meaning = None if engine is None else acceptlength.VLLM if engine == "vllm" else acceptlength.SGLANG
    return AcceptLength(client=client if client.n else None, server=server_stat if server_stat.n else None,
                        server_source=server_source, value=value, source=source, cross_check=check.to_dict(),
                        definition=meaning)


def conditional(cumulative: Sequence[float]) -> list[float | None]:
    """P(position k accepted | positions < k accepted) from the cumulative shares: cumulative[k] /
    cumulative[k-1], cumulative[0] at k = 0; None where no draft got that far."""
    out: list[float | None] = []
    for k, share in enumerate(cumulative):
        before = cumulative[k - 1] if k else 1.0
        out.append(share / before if before > 0 else None)
    return out


def _repeat_positions(record: ClientRecord | None, window: WindowAccept | None
                      ) -> tuple[str, list[float], float] | None:
    """One repeat's (source, per-draft shares, drafts): the client's when it wrote them (it reads the
    same counters around exactly its own requests, as for the accept length), else the /metrics window's."""
    if record and record.per_position_acceptance and record.num_drafts:
        return "client", record.per_position_acceptance, record.num_drafts
    if window and window.per_position and window.drafts:
        return "metrics window", window.per_position, window.drafts
    return None


def build_per_position(engine: str, records: Sequence[ClientRecord | None],
                       windows: Sequence[WindowAccept | None]) -> PerPosition:
    """The measured per-position acceptance over all repeats: each position's accepted drafts summed
    over the repeats, divided by all their drafts (a draft-weighted mean), then made conditional."""
    if engine != "vllm":
        return PerPosition(available=False, note=SGLANG_NOTE)
    pairs = list(zip(records, windows, strict=False))
    found = [got for got in (_repeat_positions(r, w) for r, w in pairs) if got is not None]
    if not found:
        return PerPosition(available=False, note="not available: neither the client's result nor the /metrics "
                           "windows had per-position counts (a vLLM without num_accepted_tokens_per_pos?)")
    width = min(len(shares) for _, shares, _ in found)
    drafts = sum(n for _, _, n in found)
    cumulative = [sum(shares[k] * n for _, shares, n in found) / drafts for k in range(width)]
    return PerPosition(available=True, source=" and ".join(sorted({s for s, _, _ in found})), drafts=drafts,
                       cumulative=cumulative, conditional=conditional(cumulative),
                       reached=[drafts * (cumulative[k - 1] if k else 1.0) for k in range(width)],
                       definition=VLLM_DEFINITION)


def load(path: Path) -> BenchResult:
    """Read and validate a bench result; the error names the file, the field and the fix. The checks
    are the shared reader's (``draftops.documents``: too deep, NaN, pydantic's first error); the
    messages are the bench's own, which say how to measure again."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULT_NAME
    try:
        doc = jsonread.load(path)                 # a regular file only (not a FIFO, not /dev/zero), bounded
    except FileNotFoundError:
        raise BenchError(f"no bench result at {path}: give a run id whose folder runs/<id>/ holds "
                         f"{RESULT_NAME} (`invoke runs --local --kind bench` lists them).") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BenchError(f"{path} is not readable JSON ({exc}); the run that wrote it may have been cut off. "
                         "Run the benchmark again.") from None
    found = other_schema(doc, SCHEMA)
    if found is not None:
        raise BenchError(f"{path} has schema {found!r}; this draftops reads {SCHEMA}. Use a draftops of the "
                         "same generation as the run, or run the benchmark again.")
    where = non_finite(doc)
    if where is not None:
        raise BenchError(f"{path}: field '{where}' is not a finite number (NaN or infinity); draftops writes "
                         "null for a value it did not measure, so the file was edited or is broken. Set it to "
                         "null or run the benchmark again.")
    try:
        return BenchResult.model_validate(doc)
    except ValidationError as exc:
        raise BenchError(f"{path}: {first_problem(exc)}. The file was edited or written by a broken run; run "
                         "the benchmark again.") from None


def write(result: BenchResult, run_dir: Path) -> Path:
    """Write ``bench-result.json`` atomically into ``run_dir``; a full disk is a BenchError, not a traceback."""
    path = run_dir / RESULT_NAME
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, (result.to_json() + "\n").encode())
    except OSError as exc:
        raise BenchError(f"cannot write {RESULT_NAME} into {run_dir}: {exc.strerror or exc}. The run's own files "
                         "(client results, server logs, runner.json) stay in that folder; free disk space there "
                         "and run the benchmark again.") from None
    return path


def bench_record(result: BenchResult, git_rev: str | None) -> RunRecord:
    """A bench run: engine, target, draft digest, settings and headline metrics; the verdict is its
    status (succeeded / failed)."""
    accept = result.accept_length.value if result.accept_length else None
    return RunRecord(
        run_id=result.run_id, kind="bench", host=result.host.name, time=result.time, git_rev=git_rev,
        engine=result.engine.name, engine_version=result.engine.version, target=result.target,
        draft=result.draft.path if result.draft else None,
        draft_digest=result.draft.digest if result.draft else None,
        settings={"mode": result.mode, **result.settings.model_dump(),
                  "speculative": result.speculative.model_dump() if result.speculative else None},
        metrics={"output_throughput": result.metrics.output_throughput.median,
                 "ttft_median_ms": result.metrics.ttft_median_ms.median,
                 "tpot_median_ms": result.metrics.tpot_median_ms.median, "accept_length": accept,
                 "steps": result.steps},
        verdict=result.status)
