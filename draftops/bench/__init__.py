"""Benchmarks: the plan of client command lines the runner executes on the host (``plan``), the
result file it writes (``result``, schema ``draftops.bench-result/1``), the statistics over
repeats (``stats``), and ``bench compare`` (``compare``, ``outputs``)."""
