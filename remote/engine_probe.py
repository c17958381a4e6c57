"""What an engine's venv has installed, as that venv's own python sees it: ``python -m
remote.engine_probe DIST...`` prints one JSON line ``{"versions": {dist: version or null}}``, read
from package metadata (remote.distinfo: nothing is imported). Run by draftops.env.engine_env.probe
as a quick tool (draftops.runs.tools.call_tool) with the engine's python."""
from __future__ import annotations

import json
import sys

from . import distinfo


def main(argv: list[str]) -> int:
    print(json.dumps({"versions": {dist: distinfo.version(dist) for dist in argv}}))
    return 0


if __name__ == "__main__":
    from remote import exitcodes
    exitcodes.run("engine-probe", lambda: main(sys.argv[1:]))
