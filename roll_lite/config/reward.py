"""The reward section of the run configuration (reward.*): its sources, routing by domain and the sandbox.

Every field's comment is the documentation of its key (roll_lite/config/reference.py renders it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class DomainRewardConfig:
    """The reward sources of one domain (reward.domains.<name>): the same keys as the reward section's own."""

    functions: dict[str, float] = field(default_factory=dict)  # name or import path -> weight
    models: dict[str, float] = field(default_factory=dict)  # reward-model folder -> weight
    judges: dict[str, float] = field(default_factory=dict)  # judge folder -> weight
    code: float = 0.0  # weight of the code source (0: not used)


@dataclass
class SandboxConfig:
    """Where the code source runs programs (roll_lite/sandbox/, docs/sandbox.md)."""

    # bwrap (namespaces: no network, its own processes, an empty file system but /usr; needs Debian's
    # bubblewrap) | rlimits (weaker, only if you choose it: limits and a timeout, no isolation)
    isolation: str = "bwrap"
    workers: Optional[int] = None  # programs at once; null: one per CPU core
    wall_s: float = 5.0  # per run, from start to exit: then the whole sandbox is killed (timed_out)
    cpu_s: int = 5  # CPU seconds per run (timed_out)
    memory_mb: int = 1024  # address space: an allocation past it fails (memory_limit)
    file_mb: int = 16  # the largest file a program may write
    disk_mb: int = 32  # its working directory and /tmp, each a tmpfs of this size (bwrap)
    open_files: int = 64  # file descriptors a program may hold open
    processes: int = 16  # processes and threads: a fork bomb stops here
    output_kb: int = 1024  # stdout + stderr per run: past it the sandbox is killed (output_limit)
    python: Optional[str] = None  # the interpreter that runs programs; null: the run's own


@dataclass
class RewardConfig:
    # name -> weight: registered names or package.module:function import paths (roll_lite/rewards/).
    # A YAML file's or a `reward.functions={...}` override's dict replaces this one (no merging).
    functions: dict[str, float] = field(default_factory=lambda: {"exact_answer": 1.0})
    # seconds for each call of code run in a guarded process, past which that row is timed_out and the
    # process is killed and restarted: a reward function's (math, the user's; one call after another, so N
    # rows that hang cost N times this) and a judge's judge_parser or Jinja judge_template of your own (a
    # batch's rows at once, sharing one deadline: at most this per batch, however many rows hang)
    timeout_s: float = 5.0
    # a response some function did not score (it raised, returned no finite number, crashed or timed out:
    # reward/<name>/failed, /timed_out; reward/unscored): zero = that function adds 0 and the response
    # trains on the rest; drop = the response leaves the loss and its group's baseline (GRPO, RLOO, ...
    # use the group's other responses; a group left with one has no advantage)
    on_failure: str = "zero"
    # reward models: local folder -> weight. Each is a transformers sequence-classification model with
    # one label, scoring every response in the reward worker's process with its own tokenizer and chat
    # template (roll_lite/rewards/reward_model.py); metrics reward/model:<folder name>
    models: dict[str, float] = field(default_factory=dict)
    model_max_tokens: int = 4096  # padded tokens per reward-model batch (rows sorted by length)
    model_normalize: bool = False  # standardise each model's scores over the step's responses it scored
    model_clip: Optional[float] = None  # after normalising, scores clipped to [-clip, clip]; null: no clip
    # each reward model's scoring per call: batches not started within model_timeout_s are `timed_out` (the
    # batch under way finishes; reward.on_failure decides for the rest); null: no limit
    model_timeout_s: Optional[float] = None
    # LLM judges: local folder -> weight. Each is a generative model (AutoModelForCausalLM) that reads
    # every (prompt, response) through judge_template and answers greedily; a strict parser takes its
    # last verdict, and a reply without one is `unparseable` (roll_lite/rewards/judge.py); metrics
    # reward/judge:<folder name>
    judges: dict[str, float] = field(default_factory=dict)
    # pointwise (0-10 against a rubric, scored N/10) | correctness (against the row's answer: 1 or 0) |
    # Jinja of your own with the fields prompt, response, answer, extra, rendered in the judge's guarded
    # process (bounded by timeout_s; raised, e.g. a field a row lacks: failed)
    judge_template: str = "pointwise"
    # package.module:function, reply -> float or None, called in the judge's guarded process (bounded by
    # timeout_s; raised or no finite number: failed; None: unparseable); null: the template's own parser
    judge_parser: Optional[str] = None
    judge_max_new_tokens: int = 32  # the judge's reply, at most
    # each judge's generation per scoring call stops after this many seconds: rows whose reply it cut
    # are timed_out (reward.on_failure decides), the rest are scored; null: no limit. The generation
    # only: a judge_parser or judge_template of your own is bounded by timeout_s
    judge_timeout_s: Optional[float] = None
    # what generates a judge's replies, in the reward worker: hf (transformers' generate) | vllm (a vLLM
    # engine, on the reward worker's GPU or with vLLM's CPU build; judge_timeout_s must then be null)
    judge_engine: str = "hf"
    judge_gpu_memory_utilization: float = 0.2  # judge_engine=vllm on a GPU: the engine's share of that GPU's memory
    # routing by domain: name -> {functions, models, judges}. Each row's domain (its data.domain_key
    # field) picks its sources; a row's domain that is not here stops the run before it starts. Set, it
    # replaces functions / models / judges above (metrics reward/<domain>/...); empty: no routing
    domains: dict[str, DomainRewardConfig] = field(default_factory=dict)
    # the code source: each response's program run against its row's tests in the sandbox
    # (roll_lite/rewards/code.py; metrics reward/code, reward/code/programs/<verdict>). Weight; 0: not used
    code: float = 0.0
    code_tests_key: str = "tests"  # the row field with the tests: stdin/stdout or function cases (docs/sandbox.md)
    code_extract: str = "fenced"  # fenced (the last ``` block) | whole (the whole response is the program)
    code_score: str = "fraction"  # fraction (of the cases passed) | all (1 if every case passed, else 0)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    # Where the scoring runs. null: in the driver when every function is a cheap built-in string rule
    # and there is no reward model or judge (a Ray round trip to a reward worker would cost more than the
    # scoring), else a reward worker of its own; true: the driver (only for cheap built-ins); false:
    # always a reward worker.
    in_driver: Optional[bool] = None
