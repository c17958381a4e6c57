"""`invoke serve`: start a checked EAGLE-3 server (SGLang or vLLM) on a host, and find, stop and tail it.

    profiles   which engine, python and settings a host's serve profile resolves to
    engines    the two engines behind one interface (launch, readiness, effective settings, logs)
    request    what the user asked for, resolved against the profile (draft, target, demo)
    checks     the pre-start checks: each failure is one paragraph saying what to change
    hosttool   runs remote/serve on the host (config reading, port and HTTP probes, registry)
    verdicts   the latest local test-drafter verdict for a draft
    lifecycle  start as a detached job, wait for readiness, read settings back, status, stop, logs
"""
