"""Token texts for roll-view: the run's tokenizer (config.yaml's model.tokenizer_path; none: the built-in
character tokenizer), loaded once, on the first trajectory opened. Where it cannot be loaded (a hub id
with no network, a folder since removed) the page shows token ids and says why."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import yaml


class TokenTexts:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self._tokenizer: Any = None
        self.problem: str | None = None
        self._loaded = False
        self._lock = threading.Lock()

    def _load(self) -> None:
        config_path = self.run_dir / "config.yaml"
        if not config_path.exists():
            self.problem = "the run has no config.yaml, so no tokenizer: tokens are shown as ids"
            return
        try:
            config = yaml.safe_load(config_path.read_text())
            model = (config or {}).get("model") or {}
            from roll_lite.model.tokenizer import load_tokenizer  # transformers: seconds to import, only here

            self._tokenizer = load_tokenizer(model.get("tokenizer_path"))
        except Exception as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            self.problem = f"the run's tokenizer does not load ({reason}): tokens are shown as ids"

    def texts(self, ids: list[int]) -> list[str] | None:
        """Each id's text, or None (self.problem says why)."""
        with self._lock:
            if not self._loaded:
                self._load()
                self._loaded = True
        if self._tokenizer is None:
            return None
        return [self._tokenizer.decode([token]) for token in ids]
