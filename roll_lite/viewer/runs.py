"""roll-view's reading of a run directory's traces (docs/traces.md): which steps are readable, each
sample's summary (what the list shows and filters on), one sample's whole row.

The run may be training: the step files are listed again on each request, and each is read once per
version (its size and modification time). A file that does not read (half-written, truncated by a
kill) is reported and skipped until it changes; a file from an older roll_lite that lacks columns is
read with what it has, and the missing columns are reported.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from roll_lite.runtime.traces import TRACE_FILE, trace_path

# the columns an RL step writes whatever its config (the log-prob columns depend on it)
RL_COLUMNS = (
    "group",
    "prompt",
    "response",
    "reward",
    "reward_sources",  # not multi-turn's: its reward is the environment's
    "advantage",
    "loss_mask",
    "token_advantages",
    "weight_versions",
)
# a sample's summary needs these of the row (the token columns are reduced to one number each)
SUMMARY_COLUMNS = (
    "step",
    "sample",
    "group",
    "prompt",
    "response",
    "text",
    "chosen",
    "reward",
    "advantage",
    "scored",
    "reward_sources",
    "weight_versions",
    "log_prob_gap",
    "loss_mask",
    "end",
    "fault",
    "turns",
    "margin",
)
EXCERPT = 120
LOCK = ".lock"  # roll_lite/checkpoint/run_dir.py's LOCK (importing it would import torch: a second)


class NotARunDirectory(ValueError):
    pass


def check_run_directory(path: Path) -> None:
    """A run directory is what roll-train writes under output_dir/run_name: its traces/ folder, or
    (a run that has written no trace yet) its metrics.jsonl, checkpoints or the lock a starting run
    takes first (roll_lite/checkpoint/run_dir.py)."""
    if not path.exists():
        raise NotARunDirectory(f"{path} does not exist")
    if not path.is_dir():
        raise NotARunDirectory(f"{path} is not a directory (give a run directory, e.g. outputs/<run_name>)")
    if path.name == "traces" and any(TRACE_FILE.fullmatch(p.name) for p in path.iterdir()):
        raise NotARunDirectory(f"{path} is a traces folder: give the run directory above it, {path.parent}")
    if not any((path / name).exists() for name in ("traces", "metrics.jsonl", "checkpoints", "config.yaml", LOCK)):
        raise NotARunDirectory(
            f"{path} is not a run directory: it has no traces/, metrics.jsonl, checkpoints/ or .lock "
            "(roll-train writes them under output_dir/run_name)"
        )


@dataclass
class StepFile:
    step: int
    version: tuple[int, int]  # size, modification time (ns)
    summaries: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # RL columns an older roll_lite did not write
    error: str | None = None


class TraceFolder:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / "traces"
        self._files: dict[int, StepFile] = {}
        self._lock = threading.Lock()

    def scan(self) -> list[StepFile]:
        """Every step file as it is now, read where it changed since the last scan."""
        found = {}
        if self.folder.is_dir():
            for path in self.folder.iterdir():
                match = TRACE_FILE.fullmatch(path.name)
                if match:
                    found[int(match[1])] = path
        with self._lock:
            for step in list(self._files):
                if step not in found:  # a resume removed it
                    del self._files[step]
            for step, path in sorted(found.items()):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                version = (stat.st_size, stat.st_mtime_ns)
                known = self._files.get(step)
                if known is None or known.version != version:
                    self._files[step] = read_step(path, step, version)
            return [self._files[step] for step in sorted(self._files)]

    def row(self, step: int, sample: int) -> dict[str, Any]:
        """One sample's whole row, as its step file holds it."""
        path = trace_path(self.folder, step)
        try:
            table = pq.read_table(path)
        except FileNotFoundError:
            raise LookupError(f"step {step} has no trace file ({path.name})") from None
        except Exception as error:
            raise LookupError(f"{path.name} does not read: {first_line(error)}") from None
        samples = table.column("sample").to_pylist() if "sample" in table.column_names else range(table.num_rows)
        for index, number in enumerate(samples):
            if number == sample:
                return table.slice(index, 1).to_pylist()[0]
        raise LookupError(f"step {step} traced no sample {sample}")


def read_step(path: Path, step: int, version: tuple[int, int]) -> StepFile:
    try:
        schema = pq.read_schema(path)
        columns = [name for name in SUMMARY_COLUMNS if name in schema.names]
        rows = pq.read_table(path, columns=columns).to_pylist()
    except Exception as error:  # a half-written or damaged file: pyarrow's ArrowInvalid, OSError
        return StepFile(
            step, version, error=f"{path.name} does not read ({first_line(error)}): skipped until it changes"
        )
    missing = []
    if "response" in schema.names or "reward" in schema.names:  # an RL trace
        expected = [name for name in RL_COLUMNS if not (name == "reward_sources" and "turns" in schema.names)]
        missing = [name for name in expected if name not in schema.names]
    return StepFile(step, version, [summarize(step, i, row) for i, row in enumerate(rows)], missing)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def summarize(step: int, index: int, row: dict[str, Any]) -> dict[str, Any]:
    """What the list shows and filters on: the outcomes (each reward source's, a multi-turn row's end),
    the domains (of `<domain>/<name>` sources), staleness (how many weight versions behind the step's
    the oldest sampled token is), the largest |log-prob gap|."""
    sources = row.get("reward_sources") or []
    outcomes = sorted({s["outcome"] for s in sources if s.get("outcome")} | ({row["end"]} if row.get("end") else set()))
    domains = sorted({s["source"].split("/", 1)[0] for s in sources if "/" in (s.get("source") or "")})
    versions = [v for v in row.get("weight_versions") or [] if v is not None and v >= 0]
    gaps = [abs(g) for g in row.get("log_prob_gap") or [] if g is not None and math.isfinite(g)]
    prompt = row.get("prompt")
    text = row.get("response") or row.get("text") or row.get("chosen") or ""
    return {
        "step": row.get("step", step),
        "sample": row.get("sample", index),
        "group": row.get("group"),
        "prompt_key": prompt_key(prompt),
        "prompt": excerpt(prompt_text(prompt)),
        "response": excerpt(text),
        "reward": clean(row.get("reward", row.get("margin"))),
        "advantage": clean(row.get("advantage")),
        "scored": row.get("scored"),
        "outcomes": outcomes,
        "domains": domains,
        "staleness": step - 1 - min(versions) if versions else None,
        "gap": max(gaps) if gaps else None,
        "turns": len(row["turns"]) if row.get("turns") is not None else None,
        "end": row.get("end"),
        "fault": row.get("fault"),
    }


def prompt_key(prompt: str | None) -> str | None:
    """The same prompt's samples share it, across steps."""
    return hashlib.sha1(prompt.encode()).hexdigest()[:12] if prompt else None


def prompt_text(prompt: str | None) -> str:
    """The prompt column holds chat messages as JSON: their contents; plain text as it is."""
    if not prompt:
        return ""
    try:
        messages = json.loads(prompt)
    except ValueError:
        return prompt
    if isinstance(messages, list):
        return " | ".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in messages)
    return prompt


def clean(value: Any) -> Any:
    """JSON has no NaN or infinity: those are shown as missing (in lists and dicts too)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    return value


def excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT else text[: EXCERPT - 1] + "…"


@dataclass
class Filters:
    step: int | None = None  # None: every step
    outcome: str | None = None
    domain: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    staleness_min: int | None = None
    gap_min: float | None = None
    prompt_key: str | None = None

    @classmethod
    def from_query(cls, query: dict[str, str]) -> Filters:
        """From the page's query string; an empty value is no filter, a malformed one a ValueError naming it."""

        def number(key: str, kind: type) -> Any:
            value = query.get(key, "").strip()
            if not value:
                return None
            try:
                return kind(value)
            except ValueError:
                raise ValueError(f"{key}: not a number: {value!r}") from None

        step = query.get("step", "all").strip()
        return cls(
            step=None if step in ("", "all") else number("step", int),
            outcome=query.get("outcome") or None,
            domain=query.get("domain") or None,
            reward_min=number("reward_min", float),
            reward_max=number("reward_max", float),
            staleness_min=number("staleness_min", int),
            gap_min=number("gap_min", float),
            prompt_key=query.get("prompt_key") or None,
        )

    def keep(self, s: dict[str, Any]) -> bool:
        reward, staleness, gap = s["reward"], s["staleness"], s["gap"]
        return (
            (self.outcome is None or self.outcome in s["outcomes"])
            and (self.domain is None or self.domain in s["domains"])
            and (self.reward_min is None or (reward is not None and reward >= self.reward_min))
            and (self.reward_max is None or (reward is not None and reward <= self.reward_max))
            and (self.staleness_min is None or (staleness is not None and staleness >= self.staleness_min))
            and (self.gap_min is None or (gap is not None and gap >= self.gap_min))
            and (self.prompt_key is None or s["prompt_key"] == self.prompt_key)
        )
