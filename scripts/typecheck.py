"""The type checker over the library, as CI runs it (tests/test_house.py):

    python scripts/typecheck.py [mypy options]

mypy over roll_lite/, pipelines/ and workers/ with the settings of pyproject.toml's [tool.mypy]
(CONTRIBUTING.md: the tiers, and why mypy). pipelines/ and workers/ install as roll_lite.pipelines and
roll_lite.workers ([tool.setuptools.package-dir]), a mapping mypy's command line cannot express: given
the folders, it names their modules `pipelines.*` and `workers.*`, so every `from roll_lite.workers...`
import in them would go unresolved, and the per-module settings would not find them. This names each of
their files by the module it installs as, then runs mypy's own build and prints what `mypy` prints.
mypy.main's functions are not mypy's stable API: mypy is pinned in the dev extra.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.util import count_stats

REPO = Path(__file__).resolve().parents[1]
INSTALLED_AS = {"pipelines": "roll_lite.pipelines", "workers": "roll_lite.workers"}  # folder -> package


def main(argv: list[str]) -> int:
    os.chdir(REPO)  # pyproject.toml's settings, the cache, and messages that name files from the root
    fscache = FileSystemCache()
    sources, options = process_options([*argv, "roll_lite", *INSTALLED_AS], fscache=fscache)
    for source in sources:
        top, dot, rest = (source.module or "").partition(".")
        if top in INSTALLED_AS:
            source.module = INSTALLED_AS[top] + dot + rest
    _, messages, blockers = run_build(sources, options, fscache, time.time(), sys.stdout, sys.stderr)
    errors, _, files = count_stats(messages)
    if errors:
        print(
            f"Found {errors} error{'s' * (errors != 1)} in {files} file{'s' * (files != 1)} "
            f"(checked {len(sources)} source files)"
        )
        return 2 if blockers else 1
    print(f"Success: no issues found in {len(sources)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
