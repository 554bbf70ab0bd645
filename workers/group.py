"""Ray actors for the controller: a D-rank FSDP2 model group, and single rollout / reward workers (under
workers.backend=local the same workers as objects in the driver's process, called alike: workers/local.py).

The controller calls plain methods; dispatch (token-balanced shares per rank) and reassembly in the
original row order happen here, waiting for the results in workers/calls.py (a worker that raises or
dies: WorkerError naming its role and rank).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, cast

import torch

from roll_lite.config import RunConfig
from roll_lite.data import DataProto, undo_permutation
from roll_lite.model.weights import unflatten_state_dict
from roll_lite.rollout import Completions, SamplingParams
from roll_lite.runtime.importing import import_root, roll_lite_dir
from roll_lite.strategy.micro_batches import data_parallel_groups

from .calls import WorkerCalls
from .local import is_local, start_worker
from .model_worker import ModelWorker, strategy_config
from .reward_worker import RewardWorker
from .rollout_worker import RolloutWorker

if TYPE_CHECKING:
    import ray

    from .placement import Placement, Reservation

logger = logging.getLogger("roll_lite")


def reservation(config: RunConfig, with_rollout: bool = True) -> Reservation | None:
    """What the workers ask Ray for (workers/placement.py reservation); None under workers.backend=local,
    which imports no Ray (importing it costs ~0.5 s of CPU)."""
    if is_local(config):
        return None
    from .placement import reservation as on_ray

    return on_ray(config, with_rollout)


def make_placement(config: RunConfig, roles_on_a_gpu: int) -> Placement | None:
    """Where the workers run on Ray (workers/placement.py); None under workers.backend=local: in this process."""
    if is_local(config):
        return None
    from .placement import Placement

    return Placement(config, roles_on_a_gpu)


class ModelGroup:
    """The ranks of one role (actor, reference, critic) forming one torch.distributed group: D data-parallel
    groups of S (the role's sequence_parallel, 1 by default) consecutive ranks, world_size = D·S. The S ranks
    of data-parallel rank d (ranks d·S .. d·S + S - 1) get the same rows and return the same results, which are
    taken once, from rank d·S (docs/sequence-parallel.md). With `host` (workers.one_process_per_rank) the role's
    rank i lives in the host group's rank-i process, with a model of its own on that process's group: no
    processes of its own."""

    def __init__(
        self,
        role: str,
        world_size: int,
        placement: Placement | None,
        config: RunConfig,
        host: "ModelGroup | None" = None,
    ):
        self.role, self.world_size, self.hosted = role, world_size, host is not None
        self.in_process = is_local(config)  # its one rank in this process (workers/local.py)
        self.workers: list[Any]  # Ray actor handles of ModelWorker (or LocalActors), rank order
        self.calls = WorkerCalls(role, config.workers)  # its failures name their node (where_the_roles_run)
        self._get = self.calls.get
        self.balance_tokens = (config.critic if role == "critic" else config.actor).use_packing
        self.degree = strategy_config(config, role).sequence_parallel  # S (validated: it divides world_size)
        if host is not None:
            assert host.world_size == world_size, "validated: workers.one_process_per_rank needs equal dp"
            self.workers = host.workers
            return
        # a local worker imports as the driver does: its sys.path is the driver's
        pipeline_root, driver_roll_lite = None if self.in_process else import_root(config.pipeline), roll_lite_dir()

        def options(rank: int) -> Callable[[], dict]:  # on Ray: where rank `rank` runs
            return lambda: cast("Placement", placement).model_rank(role, rank)

        self.workers = [
            start_worker(
                config, ModelWorker, options(rank), *(role, rank, world_size, config, pipeline_root, driver_roll_lite)
            )
            for rank in range(world_size)
        ]
        if not self.in_process:
            self._address = self.workers[0].address.remote()  # worker processes start in the background

    def wait_ready(self) -> "ModelGroup":
        """Form the torch.distributed group and build the models (blocks). A hosted role builds its
        model in its host's processes, after the host's setup (a process runs its calls in order)."""
        if self.hosted:
            layout = self._get([worker.host_role.remote(self.role) for worker in self.workers], "setup")[0]
            logger.info(
                "%s: in the actor's processes, a model of its own (workers.one_process_per_rank; false gives "
                "it processes of its own)",
                self.role,
            )
        elif self.in_process:
            layout = self._get([worker.setup_alone.remote() for worker in self.workers], "setup")[0]
        else:
            master_addr, master_port = self._get([self._address], "address")[0]
            layout = self._get([worker.setup.remote(master_addr, master_port) for worker in self.workers], "setup")[0]
        if self.role in ("reference", "critic") and self.in_process:
            logger.info("%s: a worker of its own in this process (workers.backend=local)", self.role)
        elif self.role in ("reference", "critic") and not self.hosted:
            logger.info(
                "%s: %d process%s of its own (workers.one_process_per_rank=false)",
                self.role,
                self.world_size,
                "es" if self.world_size > 1 else "",
            )
        if layout[1] > 1:  # what the strategy built (roll_lite/strategy/sequence_parallel.py)
            logger.info(
                "%s: %d ranks = %d data-parallel group(s) × %d sequence-parallel ranks (each sequence split %d ways)",
                self.role,
                self.world_size,
                *layout,
                layout[1],
            )
        return self

    def _call(self, worker, method: str, *args, **kwargs) -> ray.ObjectRef:
        """Start `method` on one rank: on its own process, or on the process that hosts it."""
        if self.hosted:
            return worker.role_call.remote(self.role, method, *args, **kwargs)
        return getattr(worker, method).remote(*args, **kwargs)

    def _scatter(self, data: DataProto) -> list[list[int]]:
        """Each rank's rows: data-parallel rank d's share for each of its S ranks."""
        shares = data_parallel_groups(data, self.world_size // self.degree, self.balance_tokens)
        return [shares[rank // self.degree] for rank in range(self.world_size)]

    def _forward(self, method: str, data: DataProto, **kwargs) -> DataProto:
        groups = self._scatter(data)
        parts = self._get(
            [self._call(w, method, data.index_select(g), **kwargs) for w, g in zip(self.workers, groups)], method
        )
        parts, groups = parts[:: self.degree], groups[:: self.degree]  # one answer per data-parallel group
        order = [i for group in groups for i in group]
        return undo_permutation(DataProto.concat([p for p in parts if len(p)]), order)

    def compute_log_probs(self, data: DataProto, with_entropy: bool = False) -> DataProto:
        return self._forward("compute_log_probs", data, with_entropy=with_entropy)

    def peak_memory_gib(self) -> float:
        """The largest rank's peak memory (ModelWorker.peak_memory_gib)."""
        return max(self._get([self._call(w, "peak_memory_gib") for w in self.workers], "peak_memory_gib"))

    def compute_reference_log_probs(self, data: DataProto) -> DataProto:
        """The actor with LoRA: the base model's log-probs (its adapters off)."""
        return self._forward("compute_reference_log_probs", data)

    def compute_values(self, data: DataProto) -> DataProto:
        return self._forward("compute_values", data)

    def compute_scores(self, data: DataProto) -> DataProto:
        """A reward model in training (the actor with a score head): token-aligned 'scores'."""
        return self._forward("compute_values", data)

    def train_step(self, data: DataProto, loss: str) -> dict[str, float]:
        """One optimizer step over `data` (the global batch of this step); metrics from rank 0 (reduced over
        the data-parallel groups by the strategy)."""
        groups = self._scatter(data)
        return self._get(
            [self._call(w, "train_step", data.index_select(g), loss) for w, g in zip(self.workers, groups)],
            "train_step",
        )[0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self.in_process:  # the weights themselves (workers/local.py)
            return unflatten_state_dict(self.state_dict_ref())
        import ray

        return unflatten_state_dict(ray.get(self.state_dict_ref()))

    def state_dict_ref(self, dtype: str | None = None, part: str = "full") -> ray.ObjectRef:
        """Rank 0's full state dict as FlatWeights (cast to `dtype` if given), left in the object
        store: a worker can take it from there without a hop through the controller (workers.backend=local:
        the FlatWeights themselves). Every rank takes part in the gather. With LoRA, `part`: full, adapters
        or merged (ModelWorker.state_dict)."""
        # Rank 0 puts the weights into the object store and returns the small ref to them, so a
        # failed gather is reported here, naming its rank, without fetching the weights.
        return self._get([self._call(w, "state_dict", dtype, part) for w in self.workers], "state_dict")[0]

    def save_pretrained(self, path: str) -> None:
        self._get([self._call(w, "save_pretrained", path) for w in self.workers], "save_pretrained")

    def save_checkpoint(self, path: str) -> None:
        """Every rank writes its shards into `path` (a folder all ranks see)."""
        self._get([self._call(w, "save_checkpoint", path) for w in self.workers], "save_checkpoint")

    def load_checkpoint(self, path: str) -> None:
        self._get([self._call(w, "load_checkpoint", path) for w in self.workers], "load_checkpoint")

    def reset_optimizer(self, lr: float | None = None) -> None:
        self._get([self._call(w, "reset_optimizer", lr) for w in self.workers], "reset_optimizer")

    def describe_lora(self) -> str:
        return self._get([self._call(self.workers[0], "describe_lora")], "describe_lora")[0]

    def merge_adapters(self) -> None:
        """LoRA: the adapters into the base, lora_B back to zero (ModelWorker.merge_adapters)."""
        self._get([self._call(w, "merge_adapters") for w in self.workers], "merge_adapters")

    def load_state_dict(self, weights: ray.ObjectRef) -> None:
        """Load FlatWeights (an object ref from `state_dict_ref`) on every rank."""
        self._get([self._call(w, "load_state_dict", weights) for w in self.workers], "load_state_dict")

    def where(self) -> list[dict]:
        """Each rank's node and assigned GPU ids (workers/placement.py), in rank order."""
        return self._get([self._call(w, "where") for w in self.workers], "where")


class RolloutClient:
    """The rollout engine's calls: on a RolloutWorker of its own, or (rollout.in_actor, `actor` given)
    on the actor's only rank, which generates with its own parameters."""

    def __init__(self, config: RunConfig, placement: Placement | None, actor: ModelGroup | None = None):
        self.calls = WorkerCalls("rollout", config.workers)  # its failures name their node (where_the_roles_run)
        self._get = self.calls.get
        # LoRA: the first sync (and the first after a resume) sends the base too, every later one only
        # the adapters
        self.adapters_only, self.base_synced = config.actor.lora.rank > 0, False
        # a frozen vision tower is never sent (the engine has it); with LoRA it is part of the base, sent once
        self.frozen_vision = config.model.freeze_vision and not self.adapters_only
        self.in_actor = actor is not None
        if self.in_actor:
            assert actor is not None  # in_actor says so
            self.worker = actor.workers[0]
            self._get(self.worker.start_rollout.remote(), "setup")
        else:
            self.worker = start_worker(config, RolloutWorker, lambda: cast("Placement", placement).rollout(), config)

    def _call(self, method: str, *args) -> ray.ObjectRef:
        if self.in_actor:
            return self.worker.rollout_call.remote(method, *args)
        return getattr(self.worker, method).remote(*args)

    def describe(self) -> str:
        return self._get(self._call("describe"), "describe")

    def where(self) -> dict:
        """The rollout worker's node and assigned GPU ids (workers/placement.py)."""
        return self._get(self._call("where"), "where")

    # The worker runs the calls of this client one at a time, in the order they were made: a
    # generation started before a weight update samples with the weights before it.

    def start_generate(
        self, prompts: list[list[int]], params: SamplingParams, images: list | None = None
    ) -> ray.ObjectRef:
        """Queue a generation on the worker; `wait(ref, "generate")` gives its Completions. `images`: per
        prompt its image inputs or None (roll_lite/data/image_prompts.py)."""
        return self._call("generate", prompts, params, *([] if images is None else [images]))

    def start_sync(self, actor: ModelGroup, dtype: str, version: int) -> ray.ObjectRef:
        """Queue the actor's current weights (cast to `dtype`) into the engine; `wait(ref, "update_weights")`.
        In the actor's process nothing travels: the engine's model already is the actor's parameters."""
        if self.in_actor:
            return self._call("use_actor_weights", version)
        part = "adapters" if self.adapters_only and self.base_synced else "trainable" if self.frozen_vision else "full"
        self.base_synced = True
        return self._call("update_weights", actor.state_dict_ref(dtype, part), version)

    def start_call(self, method: str, *args) -> ray.ObjectRef:
        """Queue any of the worker's methods (the partial rollouts': admit, advance, finish)."""
        return self._call(method, *args)

    def call(self, method: str, *args):
        return self.wait(self._call(method, *args), method)

    def wait(self, ref: ray.ObjectRef, method: str):
        """The answer of a started call (a failure raises WorkerError naming `method`)."""
        return self._get(ref, method)

    def generate(self, prompts: list[list[int]], params: SamplingParams, images: list | None = None) -> Completions:
        return self.wait(self.start_generate(prompts, params, images), "generate")

    def sync(self, actor: ModelGroup, dtype: str, version: int) -> None:
        self.wait(self.start_sync(actor, dtype, version), "update_weights")

    def save_checkpoint(self, path: str) -> None:
        self._get(self._call("save_checkpoint", path), "save_checkpoint")

    def load_checkpoint(self, path: str) -> None:
        self._get(self._call("load_checkpoint", path), "load_checkpoint")

    def weights(self):
        return self._get(self._call("weights"), "weights")


class RewardClient:
    """The reward functions' scores: in the driver's own process (reward.in_driver: cheap built-in
    string rules only, where the round trip would cost more than the scoring) or on a RewardWorker."""

    worker: Any  # the RewardWorker's Ray actor handle, or None
    local: RewardWorker | None  # or the RewardWorker itself, in the driver

    def __init__(self, config: RunConfig, placement: Placement | None = None):
        """`placement`: where a reward worker of its own runs (workers/placement.py); none: no GPU."""
        from roll_lite.rewards import is_import_path
        from roll_lite.rewards.routing import all_sources

        reward = config.reward
        self.calls = WorkerCalls("reward", config.workers)  # its failures name their node (where_the_roles_run)
        self._get = self.calls.get
        if reward.in_driver:
            self.worker, self.local = None, RewardWorker(reward, config.data.domain_key)
            return
        # The worker imports the user's reward modules from where the driver found them.
        specs = [*all_sources(reward, "functions"), *([reward.judge_parser] if reward.judge_parser else [])]
        roots = sorted(cast("set[str]", {import_root(spec) for spec in specs if is_import_path(spec)} - {None}))
        self.local = None
        options = placement.reward() if placement is not None else {"num_cpus": 0}
        policy_tokenizer = (config.model.tokenizer_path, config.model.chat_template)
        roots = [] if is_local(config) else roots  # a local worker imports as the driver does: its sys.path
        self.worker = start_worker(
            config,
            RewardWorker,
            lambda: options,
            *(reward, config.data.domain_key, policy_tokenizer, roots, roll_lite_dir(), "num_gpus" in options),
        )

    def where(self) -> dict:
        """The reward worker's node and assigned GPU ids (workers/placement.py)."""
        assert self.worker is not None, "scored in the driver: no reward worker"
        return self._get(self.worker.where.remote(), "where")

    def describe(self) -> str:
        if self.local is not None:
            return "; ".join(
                [
                    "rewards: scored in the driver (reward.in_driver: cheap built-in rules, no reward worker; "
                    "reward.in_driver=false gives them one)",
                    *self.local.describe(),
                ]
            )
        sources = self._get(self.worker.describe.remote(), "describe")
        return "; ".join(["rewards: scored by a reward worker of its own", *sources])

    def score(
        self,
        responses: list[str],
        answers: list[str],
        extras: list[dict] | None = None,
        prompts: list | None = None,
        sequences: list[list[int]] | None = None,
    ):
        """(scores, scored rows, metrics) (RewardWorker.score); `extras`: each row's extra dataset
        fields, None when there are none; `prompts` and `sequences` for the reward models."""
        if self.local is not None:
            return self.local.score(responses, answers, extras)
        return self._get(self.worker.score.remote(responses, answers, extras, prompts, sequences), "score")

    def outcomes(self) -> list[list[tuple[str, float, str, str | None]]]:
        """Each row's outcome from each source in the last score() (RewardWorker.outcomes)."""
        if self.local is not None:
            return self.local.outcomes()
        return self._get(self.worker.outcomes.remote(), "outcomes")
