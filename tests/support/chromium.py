"""A page as a browser draws it: headless Chromium's screenshot of an html report, as pixels."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")


def screenshot(page: Path, shot: Path, height: int) -> np.ndarray:
    """``page`` drawn 1200 pixels wide and ``height`` high into ``shot``; its RGB pixels (0 to 1)."""
    from matplotlib.image import imread

    assert CHROMIUM is not None
    done = subprocess.run([CHROMIUM, "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={shot}",
                           f"--window-size=1200,{height}", "--allow-file-access-from-files", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.exists(), done.stdout + done.stderr
    return imread(str(shot))[..., :3]
