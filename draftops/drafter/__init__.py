"""The main job, `invoke test-drafter`, as a library flow the task and the doctor share: the evaluator's
options (one definition with the host's evaluator, ``remote.drafter.options.EvalOptions``) → the
capture-check that measured these dumps → the evaluator run (one process or torchrun) → its report read
once → the history row. docs/architecture.md § One call, hop by hop."""
