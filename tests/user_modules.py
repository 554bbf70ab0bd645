"""A user's module written for a test: importable in the test's process and, through sys.path, in the
processes it starts (the environment runner's)."""

from __future__ import annotations

import sys
import textwrap
import uuid
from contextlib import contextmanager


@contextmanager
def user_module(tmp_path_factory, prefix: str, source: str):
    """Write `source` as a module with a fresh name; yields that name."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    folder = tmp_path_factory.mktemp(prefix)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(folder))
    try:
        yield name
    finally:
        sys.path.remove(str(folder))
