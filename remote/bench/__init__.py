"""Benchmark-side parsers and helpers that run on the host next to the server's files (stdlib only).

``decode_log``      SGLang decode log lines (0.4.x "Decode batch." to 0.5.x "Decode batch,")
``client_output``   the engines' own benchmark clients: SGLang bench_serving JSONL, vLLM bench serve JSON
``server_metrics``  vLLM /metrics spec-decode counters, SGLang /get_server_info
``crosscheck``      two accept-length sources held against each other
``digest``          the draft-config digest that ties a benchmark to a test-drafter prediction
``datasets``        prompt files converted to the format each client reads
"""
