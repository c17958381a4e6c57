"""Shell start-up files that print a banner, for the framing tests."""
from __future__ import annotations

NOISY_BASHRC = r"""
echo "hello from bashrc"
printf '{"root": "/not/the/root", "runs": [], "status": "applied"}\n'
printf '@@draftops-reply -\n{"root": "/still/not/it"}\n'
printf '@@draftops {"event": "job-end", "state": "succeeded"}\n'
echo "noise on stderr" >&2
printf '\037\213 gzip-looking bytes and no newline'
"""
