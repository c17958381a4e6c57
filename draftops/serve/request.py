"""What the user asked `invoke serve` for, resolved against the serve profile into launch settings."""
from __future__ import annotations

from dataclasses import dataclass, field

from draftops.errors import ServeRefused
from draftops.serve import engines
from draftops.serve.profiles import Profile

DEMO = "demo"
#: inside the host's demo folder (<root>/state/demo): the target, and the demo draft as it is
#: configured: the seed's wrong layer ids until `invoke draft-config --ckpt demo --from-report RUN`
#: rewrites them, so serving it measures what the drafter report predicts for the ids it holds
DEMO_TARGET, DEMO_DRAFT = "target", "draft"
#: SGLang's own value for speculative runs; set for baseline runs too so both are comparable
DEFAULT_MAX_RUNNING = 48
VLLM_DEFAULT_STEPS = 3


def demo_dir(state_dir: str) -> str:
    """Where the host keeps its generated demo (the cache `invoke test-drafter` also uses)."""
    return f"{state_dir}/{DEMO}"


@dataclass(frozen=True)
class Request:
    """The options of `invoke serve`."""

    draft: str | None = None
    baseline: bool = False
    profile: str | None = None
    target: str | None = None
    steps: int | None = None
    topk: int | None = None
    draft_tokens: int | None = None
    port: int | None = None
    allow_override: bool = False
    force: bool = False
    replace: bool = False

    @property
    def demo(self) -> bool:
        return self.draft == DEMO or self.target == DEMO


@dataclass
class Plan:
    """A request resolved against a profile: the engine and every asked-for launch setting."""

    request: Request
    profile: Profile
    engine: engines.Engine
    launch: engines.Launch
    notes: list[str] = field(default_factory=list)
    demo: bool = False          # it serves the generated demo's target (made first when missing)


def resolve(request: Request, profile: Profile, demo_dir: str, demo_baseline: bool = False) -> Plan:
    """Fill the launch settings from the request, then the profile, then draftops' defaults.

    ``demo_baseline``: a --baseline with no target anywhere serves the demo's target (the built-in
    `local` host, whose only model is the demo: the baseline to hold `--draft demo` against)."""
    settings = profile.settings
    if request.baseline == bool(request.draft):
        raise ServeRefused(
            "Say what to serve: --draft CKPT (a draft checkpoint folder on the host), --draft demo (the "
            "generated demo's target and draft), or --baseline (the profile's target with no draft, "
            "for comparison runs)." if not request.baseline else
            "--baseline serves the target with no draft, so it cannot be combined with --draft; run "
            "them one after the other on the same profile (same max running requests) to compare.")
    notes = []
    demo_target = f"{demo_dir}/{DEMO_TARGET}"
    draft = f"{demo_dir}/{DEMO_DRAFT}" if request.draft == DEMO else request.draft
    target = demo_target if request.demo else (request.target or settings.target)
    demo = request.demo
    if not target and request.baseline and demo_baseline:
        target, demo = demo_target, True
        notes.append(f"no target given and serve profile {profile.name!r} of host {profile.host!r} has none: "
                     "serving the generated demo's target, the baseline for `--draft demo` (--target PATH "
                     "serves another model)")
    if request.draft == DEMO and request.target not in (None, DEMO):
        raise ServeRefused(f"The demo draft was trained for the demo target only; drop --target "
                            f"{request.target} (or serve your own draft with --draft CKPT).")
    if not target:
        raise ServeRefused(
            f"No target model: serve profile {profile.name!r} of host {profile.host!r} has no `target:`. "
            "Add `target: /path/to/model` to the profile in hosts.yaml, or pass --target PATH "
            "(`--baseline --target demo` for the generated demo's target, the baseline for `--draft demo`).")
    port = profile.port if request.port is None else request.port     # --port 0 is refused, not the default
    if not 1 <= port <= 65535:
        raise ServeRefused(f"--port {port} is not a TCP port (1-65535).")
    steps, topk, draft_tokens = request.steps, request.topk, request.draft_tokens
    if profile.engine == "vllm" and draft and steps is None:
        steps = VLLM_DEFAULT_STEPS
        notes.append(f"num_speculative_tokens {steps} (draftops' default; choose with --steps)")
    max_running = settings.max_running_requests
    if max_running is None:
        max_running = DEFAULT_MAX_RUNNING
        notes.append(f"max running requests {max_running}, set explicitly so baseline and speculative "
                     f"runs compare (set `max_running_requests` in serve profile {profile.name!r})")
    launch = engines.Launch(
        python=profile.python, target=target, draft=draft, port=port,
        listen=settings.listen, tp=settings.tp, max_running_requests=max_running,
        mem_fraction=settings.mem_fraction, context_length=settings.context_length,
        steps=steps, topk=topk, draft_tokens=draft_tokens, extra_args=tuple(settings.extra_args))
    return Plan(request, profile, engines.get(profile.engine), launch, notes, demo)
