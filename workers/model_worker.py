"""One rank of a FSDP2 model group on Ray: the actor (trains, log-probs), the reference (log-probs, no
optimizer) or the critic (values, value loss). Plain class; `ModelGroup` wraps it with ray.remote and
forms the D ranks into one torch.distributed group (or with workers.backend=local holds its one rank
in the driver's process: workers/local.py)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import resource
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from roll_lite.config import RunConfig
from roll_lite.data import DataProto
from roll_lite.lora.adapters import (
    adapted_modules,
    adapted_parameters,
    adapter_state,
    adapters_disabled,
    add_adapters,
    has_adapters,
    merged_for,
    to_adapted_names,
)
from roll_lite.lora.export import save_lora_final
from roll_lite.loss import sft_loss_func
from roll_lite.model.compiling import compile_decoder_layers
from roll_lite.model.modeling import enable_gradient_checkpointing, sequence_classifier_state
from roll_lite.model.vision_run import load_run_lm, run_tokenizer
from roll_lite.model.weights import FlatWeights, flatten_state_dict, unflatten_state_dict
from roll_lite.runtime.importing import enter_import_root, load_object
from roll_lite.runtime.reproducibility import check_kernels
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.distributed import (
    init_distributed,
    init_one_process_group,
    join_group_store,
    open_group_store,
)

if TYPE_CHECKING:
    from roll_lite.strategy.fsdp2 import FSDP2Strategy

# role -> (head, trainable); a teacher (pipelines/teachers.py) is a reference built from its own folder
ROLES = {
    "actor": ("log_probs", True),
    "reference": ("log_probs", False),
    "critic": ("value", True),
    "teacher": ("log_probs", False),
}


def strategy_config(config: RunConfig, role: str) -> StrategyConfig:
    """The role's strategy settings; the actor's with the batch-invariant kernels under rollout.exact;
    under reproducible=portable with AdamW's fused kernel, whose sqrt is exact on every CPU
    (roll_lite/runtime/reproducibility.py)."""
    chosen = config.critic if role == "critic" else config.actor
    if role in ("reference", "teacher"):  # they route on their own: the engine's routing is the policy's
        # and hold every expert (FSDP2-sharded over their own ranks): actor.expert_parallel is the actor's
        chosen = dataclasses.replace(chosen, router_replay=None, expert_parallel=1)
    if role == "actor" and config.rollout.exact:  # the engine's batch-invariant kernels (docs/on-policy.md)
        chosen = dataclasses.replace(chosen, batch_invariant=True)
    if config.reproducible == "portable":
        chosen = dataclasses.replace(chosen, adamw_fused=True)
    return chosen


def bind_gloo_to_the_node_address() -> None:
    """gloo listens on the address this machine's hostname resolves to, often a loopback one (Debian's
    127.0.1.1, a container's 127.0.0.1) that the ranks on other hosts cannot reach: their group then
    fails to form ("connectFullMesh failed ... 127.0.0.1"). Use the interface that holds Ray's address
    of this node instead, unless GLOO_SOCKET_IFNAME already names one."""
    import psutil  # a dependency of peft and accelerate
    import ray

    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    node_ip = ray.util.get_node_ip_address()
    for interface, addresses in psutil.net_if_addrs().items():
        if any(address.address == node_ip for address in addresses):
            os.environ["GLOO_SOCKET_IFNAME"] = interface
            return


class ModelWorker:
    def __init__(
        self, role: str, rank: int, world_size: int, config: RunConfig, pipeline_root: str | None, driver_roll_lite: str
    ):
        if role not in ROLES:
            raise ValueError(f"unknown worker role '{role}'")
        self.role, self.rank, self.world_size, self.config = role, rank, world_size, config
        # Where the driver imported the pipeline class from, after the installed packages; never a
        # second roll_lite tree.
        enter_import_root(pipeline_root, driver_roll_lite)
        self.import_roots = (pipeline_root, driver_roll_lite)
        self.strategy: FSDP2Strategy | None = None  # setup()
        self.group_store: Any = None  # rank 0's rendezvous store, a torch.distributed.TCPStore (address())
        self.hosted: dict[str, ModelWorker] = {}  # workers.one_process_per_rank: other roles' ranks (host_role)

    def __repr__(self) -> str:  # Ray names the worker by it in tracebacks and log prefixes
        return f"ModelWorker({self.role} rank {self.rank})"

    def address(self) -> tuple[str, int]:
        """Rank 0: where the group meets, a store this process listens on from now until it ends."""
        import ray

        host = ray.util.get_node_ip_address()
        self.group_store = open_group_store(host, self.world_size)
        return host, self.group_store.port

    def where(self) -> dict:
        from .placement import where_am_i  # Ray's: imported on Ray only (workers.backend=local imports no Ray)

        return where_am_i()

    def setup(self, master_addr: str, master_port: int) -> tuple[int, int]:
        from .placement import local_gpu_index

        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(local_gpu_index(self.config.workers.gpus_per_rank)),
        )
        torch.set_num_threads(self.config.workers.torch_threads)
        check_kernels(self.config.reproducible)  # the kernels' variables reached this process
        bind_gloo_to_the_node_address()
        store = self.group_store if self.rank == 0 else join_group_store(master_addr, master_port, self.world_size)
        init_distributed(store=store)
        return self.build()

    def setup_alone(self) -> tuple[int, int]:
        """workers.backend=local: the only rank, in the driver's process, on CPU, in the one-process group
        that every model worker there shares (workers/local.py destroys it when the run ends)."""
        torch.set_num_threads(self.config.workers.torch_threads)
        check_kernels(self.config.reproducible)
        init_one_process_group(torch.device("cpu"))
        return self.build()

    def build(self) -> tuple[int, int]:
        """The role's model and strategy, in a process whose torch.distributed group is formed: by
        setup(), or by the actor rank that hosts this role (host_role). Returns the strategy's (D, S)."""
        from roll_lite.strategy import FSDP2Strategy

        head, trainable = ROLES[self.role]
        # The pipeline class owns the loss functions; a light instance (no workers) serves them here.
        self.pipeline = load_object(self.config.pipeline)(self.config)
        if self.role == "actor":  # a reward model in training has a score head (pipelines/reward_model.py)
            head = getattr(self.pipeline, "actor_head", head)
        self.head = head
        self.tokenizer = run_tokenizer(self.config.model)
        lm = load_run_lm(self.config.model, len(self.tokenizer), seed=self.config.seed)
        self.lora = strategy_config(self.config, self.role).lora if trainable else None
        self.base_is_source = True  # the frozen base is still model.pretrained_path's (or the seeded build)
        if self.lora is not None and self.lora.rank:
            add_adapters(lm, self.lora, seed=self.config.seed, key=f"{self.role}.lora")
        if trainable and self.config.model.gradient_checkpointing:
            enable_gradient_checkpointing(lm)
        if self.config.model.compile_layers:
            compile_decoder_layers(lm)
        # workers.backend=local: on CPU, as a Ray worker without a GPU, also where the driver sees CUDA
        device = torch.device("cpu") if self.config.workers.backend == "local" else None
        self.strategy = FSDP2Strategy(
            lm,
            strategy_config(self.config, self.role),
            head=head,
            trainable=trainable,
            device=device,
            head_seed=self.config.seed,
        )
        if self.config.workers.offload:
            self.strategy.offload()
        sequence_parallel = self.strategy.sequence_parallel
        return self.strategy.dp_size, sequence_parallel.degree if sequence_parallel else 1

    def host_role(self, role: str) -> tuple[int, int]:
        """workers.one_process_per_rank: `role`'s rank of the same number lives in this (the actor's)
        process, with a model of its own on this process's group; its calls come through role_call."""
        self.hosted[role] = ModelWorker(role, self.rank, self.world_size, self.config, *self.import_roots)
        return self.hosted[role].build()

    def role_call(self, role: str, method: str, *args, **kwargs):
        """A ModelWorker method of a role this process hosts (workers/group.py ModelGroup)."""
        return getattr(self.hosted[role], method)(*args, **kwargs)

    @contextmanager
    def on_device(self):
        """The model (and optimizer) on the GPU for one call; back on CPU after it with workers.offload."""
        self.strategy.onload()
        try:
            yield
        finally:
            if self.config.workers.offload:
                self.strategy.offload()

    def compute_log_probs(self, data: DataProto, with_entropy: bool = False) -> DataProto:
        assert self.strategy is not None  # setup() made it
        with self.on_device():
            return self.strategy.compute_log_probs(data, with_entropy)

    def peak_memory_gib(self) -> float:
        """The most memory this rank has held: on a GPU torch's peak allocation, on CPU the process's
        peak resident set (its libraries included)."""
        assert self.strategy is not None  # setup() made it
        if torch.cuda.is_available() and self.strategy.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.strategy.device) / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux

    def compute_reference_log_probs(self, data: DataProto) -> DataProto:
        """With LoRA: the reference's log-probs, those of the base model (the adapters off)."""
        assert self.strategy is not None  # setup() made it
        own_routing = {name: t for name, t in data.batch.items() if name != "routed_experts"}  # as a reference's
        with self.on_device(), adapters_disabled(self.strategy.model):
            return self.strategy.compute_log_probs(DataProto(own_routing, data.non_tensor_batch, data.meta_info))

    def compute_values(self, data: DataProto) -> DataProto:
        assert self.strategy is not None  # setup() made it
        with self.on_device():
            return self.strategy.compute_values(data)

    def train_step(self, data: DataProto, loss: str) -> dict[str, float]:
        assert self.strategy is not None  # setup() made it
        loss_funcs = {"policy": "loss_func", "critic": "critic_loss_func"}  # methods of the pipeline class
        loss_func = getattr(self.pipeline, loss_funcs[loss]) if loss in loss_funcs else sft_loss_func()
        c = self.strategy.config
        if c.moe_aux_loss_coef > 0 or c.moe_z_loss_coef > 0:  # the actor's, over the step's expert counts (docs/moe.md)
            from roll_lite.loss.aux import moe_aux_loss_func
            from roll_lite.strategy.micro_batches import call_loss_func

            data.meta_info["moe_aux_losses"] = True  # the strategy counts them (roll_lite/strategy/moe_stats.py)
            checked = functools.partial(call_loss_func, loss_func)  # a loss_func's errors name its contract
            loss_func = moe_aux_loss_func(checked, c.moe_aux_loss_coef, c.moe_z_loss_coef)
        with self.on_device():
            return self.strategy.train_step(data, loss_func)

    def state_dict(self, dtype: str | None = None, part: str = "full"):
        """Rank 0: a ref to its full state dict as FlatWeights in the object store, floating-point
        tensors cast to `dtype` if given (the rollout engine's); other ranks: None. With LoRA, `part`
        picks: full (base_layer and adapter tensors, the model's own names), adapters (only them) or
        merged (a plain HF state dict of base + adapters); trainable: the parameters that train (a VLM's
        without its frozen vision tower)."""
        assert self.strategy is not None  # setup() made it
        with self.on_device():
            state = self.strategy.full_state_dict(
                trainable_only=part in ("adapters", "trainable")
            )  # a collective: every rank calls it
        if self.rank != 0:
            return None
        if part == "merged" and has_adapters(self.strategy.model):
            assert self.lora is not None  # adapters: a trained role's, with its LoRA settings
            state = merged_for(state, self.lora, self.strategy.model.lm)
        if dtype is not None:
            cast = getattr(torch, dtype)
            state = {name: value.to(cast) if value.is_floating_point() else value for name, value in state.items()}
        if self.config.workers.backend == "local":  # in the caller's process already: the weights themselves
            return flatten_state_dict(state)
        import ray

        return ray.put(flatten_state_dict(state))

    def start_rollout(self) -> str:
        """rollout.in_actor (the only rank of the actor): a rollout engine in this process whose model is
        made of this rank's own parameters; returns how it runs."""
        assert self.strategy is not None  # setup() made it
        from .rollout_worker import RolloutWorker

        self.rollout = RolloutWorker(self.config, actor_weights=self.strategy.own_parameters)
        return self.rollout.describe()

    def rollout_call(self, method: str, *args):
        """A RolloutWorker method, on the engine start_rollout made (workers/group.py RolloutClient)."""
        return getattr(self.rollout, method)(*args)

    def load_state_dict(self, weights: FlatWeights) -> None:
        """A plain HF state dict (the actor's, merged) into this model; with LoRA into the frozen base."""
        assert self.strategy is not None  # setup() made it
        state = unflatten_state_dict(weights)
        if has_adapters(self.strategy.model):
            state = to_adapted_names(state, self.strategy.model.lm)
        with self.on_device():
            self.strategy.load_full_state_dict(state)

    def save_pretrained(self, path: str) -> None:
        """Write the model as a HF folder (config.json and generation_config.json with the tokenizer's
        bos / eos / pad ids, safetensors) from rank 0; every rank takes part in gathering the weights.
        Written to a temporary folder first, then renamed."""
        assert self.strategy is not None  # setup() made it
        with self.on_device():
            state = self.strategy.full_state_dict()
        if self.rank != 0:
            return
        if has_adapters(self.strategy.model):
            assert self.lora is not None  # adapters: a trained role's, with its LoRA settings
            source = self.config.model.pretrained_path if self.base_is_source else None
            save_lora_final(Path(path), state, self.lora, self.strategy.model.lm, self._save_hf, source)
            return
        self._save_hf(Path(path), state)

    def _save_hf(self, target: Path, state: dict) -> None:
        """A causal LM folder; with a score head a one-label sequence classifier (a reward model)."""
        assert self.strategy is not None  # setup() made it
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        trained = self.strategy.model.lm
        if self.head == "score":
            lm, state = sequence_classifier_state(trained, state)
        else:  # a vision-language model (docs/vision.md): its image-text-to-text class
            auto = AutoModelForImageTextToText if hasattr(trained.config, "vision_config") else AutoModelForCausalLM
            lm = auto.from_config(
                trained.config,
                dtype=next(iter(state.values())).dtype,
                trust_remote_code=self.config.model.trust_remote_code,
            )
        lm.load_state_dict(state)
        special_ids = {
            f"{name}_token_id": getattr(self.tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad")
        }
        lm.config.update(special_ids)  # config.json too: not only generate() reads them (pipelines, vLLM, exporters)
        if self.head != "score":
            lm.generation_config = copy.deepcopy(trained.generation_config)
            lm.generation_config.update(**special_ids)
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        lm.save_pretrained(partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)

    def save_checkpoint(self, path: str) -> None:
        """This rank's shards (a collective over the group) and its random generators."""
        assert self.strategy is not None  # setup() made it
        from roll_lite.checkpoint.rng import save_rng

        with self.on_device():
            self.strategy.save_checkpoint(path)
        save_rng(Path(path) / f"rng_rank{self.rank}.pkl")

    def load_checkpoint(self, path: str) -> None:
        """From a checkpoint written by any number of ranks; a rank the writer did not have keeps its
        seeded generators (training draws no random numbers in the workers today: no dropout)."""
        assert self.strategy is not None  # setup() made it
        from roll_lite.checkpoint.rng import load_rng

        with self.on_device():
            self.strategy.load_checkpoint(path)
        self.base_is_source = not self.strategy.frozen_in_checkpoint
        rng_file = Path(path) / f"rng_rank{self.rank}.pkl"
        if rng_file.exists():
            load_rng(rng_file)

    def describe_lora(self) -> str:
        assert self.lora is not None  # called for a trained role with adapters
        assert self.strategy is not None  # setup() made it
        model = self.strategy.model
        total = sum(p.numel() for p in model.parameters())  # a DTensor counts its whole tensor
        trained = sum(p.numel() for p in self.strategy.trainable_parameters())
        targets = adapted_modules(model) + adapted_parameters(model)  # the Linear layers', the experts' weights
        return (
            f"{self.role}: LoRA r={self.lora.rank}, alpha={self.lora.alpha:g} on {targets}: "
            f"{trained:,} of {total:,} parameters train ({100 * trained / total:.2f} %)"
        )

    def merge_adapters(self) -> None:
        """LoRA after a warm start: the trained adapters go into the base (which becomes the reference,
        as the warm-started model is without LoRA) and lora_B starts again from zero."""
        assert self.lora is not None  # called for a trained role with adapters
        assert self.strategy is not None  # setup() made it
        with self.on_device():
            state = self.strategy.full_state_dict()
            merged = to_adapted_names(merged_for(state, self.lora, self.strategy.model.lm), self.strategy.model.lm)
            adapters = {
                name: torch.zeros_like(t) if ".lora_B." in name else t.clone()
                for name, t in adapter_state(state).items()
            }
            self.strategy.load_full_state_dict({**merged, **adapters})
        # the base is no longer model.pretrained_path's: checkpoints and final/ hold it from now on
        self.base_is_source = False
        self.strategy.frozen_in_checkpoint = True

    def reset_optimizer(self, lr: float | None = None) -> None:
        assert self.strategy is not None  # setup() made it
        with self.on_device():
            self.strategy.reset_optimizer(lr)
