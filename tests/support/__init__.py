"""What the tests share and are not tests themselves, kept apart from them as Invoke and Fabric keep
theirs: real parts started for a test (``sshd``, ``slurm``, ``vllm_server``, ``mlflow_server``), the
builders of drafts, dumps and runs (``drafter_lab``, ``drafter_support``, ``trainer_dumps``,
``bench_runs`` ...), caches kept between runs (``cache_dir``, ``demo_cache``, ``laptop_venv``) and the
helpers several test files call (``tasks.invoke``: a task run as a user runs it). Fixtures stay in
tests/conftest.py (or in the test file that uses them); tests/README.md says how to find a module's
tests by its name."""
