"""A virtual environment that sees this environment's installed packages (torch, transformers, Ray,
...) without reinstalling them, for benchmarks that need a second install next to this one."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def venv_sharing_packages(where: Path) -> Path:
    """Make a venv at `where` whose site-packages reads this one's; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # This environment's site-packages directory only, not its .pth files: its editable roll_lite stays out.
    Path(site, "shared_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python
