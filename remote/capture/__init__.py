"""``python -m remote.capture``: ask the serving engine itself which layer each dumped slot holds.

A short-lived instance of the engine the profile serves with (same target, tensor parallel size,
dtype) returns the target's hidden states at every layer boundary for the token ids of a few dump
samples; each dumped slot is matched against every boundary. The answer (``capture-check.json``)
names the layer each slot holds, which slot is the final state, what the engine will feed a draft
as configured, and the fix, or, when no boundary matches, how the dumps differ from this target.
Runs with the host's ml-env python (torch + safetensors); the engine runs in its own venv.
"""
