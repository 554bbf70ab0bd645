"""WorkerError: a worker raised, died or ran out of memory. It names the role, the rank, the call and
(once the controller adds it) the stage of the run, and carries the worker's traceback or its exit
detail. roll-train prints it and exits with code 1.
"""

from __future__ import annotations

# What to lower when a worker of a role runs out of memory (the config keys, see config.py and
# strategy/config.py). The model workers also hold the rollout's batch: its size is the first lever.
ROLLOUT_SIZE = ("rollout.prompts_per_step", "rollout.num_samples", "rollout.max_new_tokens")
MEMORY_ADVICE = {
    "actor": ROLLOUT_SIZE + ("sft.batch_size (warm start)",),
    "critic": ROLLOUT_SIZE,
    "reference": ROLLOUT_SIZE,
    "rollout": ROLLOUT_SIZE,
}


def memory_advice(role: str) -> str:
    """One sentence naming the config keys that lower a role's peak memory."""
    lower = MEMORY_ADVICE.get(role, ROLLOUT_SIZE)
    advice = f"lower {', '.join(lower)}"
    if role in ("actor", "critic", "reference"):
        prefix = "actor" if role == "reference" else role  # the reference runs with the actor's micro-batching
        advice += (
            f"; use smaller micro-batches: raise {prefix}.grad_accum_steps, or with {prefix}.use_packing=true "
            f"lower {prefix}.max_tokens_per_micro_batch"
        )
        if role != "reference":
            advice += "; or set model.gradient_checkpointing=true"
    return advice


class WorkerError(RuntimeError):
    """A worker call that failed. `kind`: 'raised', 'died', 'out of memory', 'timed out', or 'stopped'
    (the worker stopped the run on purpose, e.g. too many nan steps: `detail` is its reason, one line)."""

    def __init__(self, role: str, rank: int | None, method: str, kind: str, detail: str):
        self.role, self.rank, self.method, self.kind, self.detail = role, rank, method, kind, detail
        self.stage: str | None = None  # where the run was, e.g. "step 3"; set by the controller
        # On a cluster of several nodes: the address of the worker's node, and the other workers that ran
        # there ("rollout", "reference rank 1"), which a lost node takes with it (workers/calls.py)
        self.node: str | None = None
        self.node_also: list[str] = []
        super().__init__(self.headline())

    @property
    def worker(self) -> str:
        return self.role if self.rank is None else f"{self.role} rank {self.rank}"

    def headline(self) -> str:
        where = f" at {self.stage}" if self.stage else ""
        verbs = {
            "raised": "raised an error in",
            "died": "died during",
            "out of memory": "ran out of memory in",
            "timed out": "did not answer",
            "stopped": "stopped the run in",
        }
        line = f"{self.worker} {verbs.get(self.kind, self.kind)} {self.method}{where}"
        if self.node:
            line += f" on node {self.node}" + (
                f" (which also held: {', '.join(self.node_also)})" if self.node_also else ""
            )
        if self.kind == "out of memory":
            line += f": {memory_advice(self.role)}"
        return line

    def __str__(self) -> str:
        """What roll-train prints: the headline, then the traceback or exit detail; a stop: one line."""
        return f"{self.headline()}{': ' if self.kind == 'stopped' else chr(10)}{self.detail}"
