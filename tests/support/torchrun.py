"""What two torchrun reports share when they are the same evaluation."""
from __future__ import annotations

import json
from typing import Any


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """The report without what differs between any two runs (the wall time)."""
    report = json.loads(json.dumps(report))
    report["run"].pop("seconds")
    return report
