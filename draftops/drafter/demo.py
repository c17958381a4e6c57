"""The generated demo on a host: built once, the cache every task given `demo` uses (test-drafter,
capture-check, serve, draft-config, draft-flat and the doctor)."""
from __future__ import annotations

from draftops.link.host import Host
from draftops.runs.tools import JobView, ask_tool, run_tool
from draftops.serve.request import demo_dir


def ensure_demo(host: Host, view: JobView | None = None) -> None:
    """Generate the demo on the host once, so a task given `--ckpt demo` / `--draft demo` works as a
    first command; ``view`` shows the build's job where one runs (None: nothing shown)."""
    folder = demo_dir(host.state_dir)
    # one quick stdlib-only look first: the builder's job imports torch (seconds) even to find it done
    known = ask_tool(host, "remote.drafter.demo_spec", [folder], timeout=60).data
    if isinstance(known, dict) and known.get("complete") is True:
        return
    run_tool(host, "remote.drafter", ["demo", "--out", folder], name="demo", pull=False, view=view).check()
