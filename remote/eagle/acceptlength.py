"""What each accept length means, and the conversions that make them comparable (failure-modes.md #12).

Every figure draftops shows is tokens per verify with the verified (bonus) token included: vLLM's
``1 + accepted / drafts`` and speculators' ``1 + sum_k full_acc_k``. SpecForge's
``simulated_acc_len`` (``a0 + a0*a1 + ...``) leaves the bonus token out, so 1 is added; SGLang's
``avg_spec_accept_length`` counts it, but is cumulative since the server started or since the last
``/flush_cache``: it describes one run only when the run began with a flush.
"""
from __future__ import annotations

PREDICTED = ("1 + sum over the K TTT steps of full_acc_k (the share of positions whose draft tokens 0..k are all "
             "right): tokens per verify, the bonus token included, as vLLM's 1 + accepted/drafts")
WALK = "1 + accepted/rounds of a greedy server decoding the dump text: tokens per verify, the bonus token included"
VLLM = "1 + accepted/drafts (vLLM: tokens per verify, the bonus token included)"
SGLANG = ("(accepted + bonus tokens)/verify passes (SGLang avg_spec_accept_length or the decode log's accept len), "
          "over this run only: the server's counters are flushed before each repeat or read from its decode-log lines")
SGLANG_CUMULATIVE = ("SGLang avg_spec_accept_length cumulative since the server started (no /flush_cache before the "
                     "run): not this run's figure")

#: the figure a user may hand in (``--expected-from``), its definition and what is added to make it 1 + accepted/drafts
SOURCES: dict[str, tuple[str, float]] = {
    "vllm": (VLLM, 0.0),
    "speculators": ("1 + sum_k full_acc_k (speculators: the bonus token included)", 0.0),
    "specforge": ("simulated_acc_len = a0 + a0*a1 + a0*a1*a2 + ... (SpecForge: no +1 for the bonus token)", 1.0),
    "sglang": ("avg_spec_accept_length since a /flush_cache (SGLang: the bonus token included)", 0.0),
}


def normalize(value: float, source: str) -> float:
    """``value`` as draftops states accept lengths (1 + accepted/drafts)."""
    return value + SOURCES[source][1]
