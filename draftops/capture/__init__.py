"""`invoke capture-check` as a library flow the task and the doctor share: which dumps, target and draft
on the host → the short-lived engine instance's job (``python -m remote.capture check``) → its
capture-check.json read once. docs/capture-check.md."""
