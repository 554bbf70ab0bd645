"""DPOPipeline: a policy trained directly on preference pairs with DPO, IPO or SimPO.

`roll-train --config configs/dpo.yaml` trains the run's causal LM on `preference.train_files` with
`preference.loss` (roll_lite/loss/preference.py: dpo | ipo | simpo, cDPO's label smoothing, an NLL
term on the chosen side), reports TRL's metrics (rewards/chosen, rewards/rejected,
rewards/accuracies, rewards/margins, logps/chosen, logps/rejected) on the training and the held-out
pairs, and writes <output_dir>/<run_name>/final/, a causal LM folder like the SFT pipeline's.

The reference (dpo, ipo; SimPO has none) is the model the run starts from:
- preference.reference = worker: a reference worker's log-probs for each step's pairs; with LoRA the
  actor's own with its adapters off (no second model);
- precomputed: one pass of the actor over every pair before step 1 (the actor then is the
  reference), kept in the driver and in every checkpoint, so no reference model stays in memory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from roll_lite.config import ConfigError
from roll_lite.data import DataProto
from roll_lite.data.pairs import build_pair_batch
from roll_lite.loss import dpo_loss_func

from .pairs import EVAL_PAIRS, PairPipeline

if TYPE_CHECKING:
    from roll_lite.workers.group import ModelGroup

    from roll_lite.config import RunConfig

logger = logging.getLogger("roll_lite")
REFERENCE_FILE = "reference_logps.pt"


class DPOPipeline(PairPipeline):
    metric_prefix = "dpo"
    headline = ("dpo/rewards/accuracies", "eval/dpo/rewards/accuracies")
    checkpoint_kind = "dpo"
    checkpoint_compat_keys = PairPipeline.checkpoint_compat_keys + ("preference.reference",)

    def __init__(self, config: RunConfig, tokenizer: Any = None) -> None:
        super().__init__(config, tokenizer)
        p = self.preference
        self._loss = dpo_loss_func(p.loss, p.beta, p.label_smoothing, p.nll_coef, p.simpo_gamma)
        self.reference: ModelGroup | None = None  # start_workers(), with preference.reference = worker
        self.precomputed: dict[
            str, torch.Tensor
        ] = {}  # split -> [pairs, 2] summed response log-probs (chosen, rejected)

    def loss_func(self, batch: DataProto, output: dict) -> tuple[torch.Tensor, dict]:
        """preference.loss over the batch's pairs (mean over the step's pairs, whatever D, A and packing)."""
        return self._loss(batch, output)

    @property
    def uses_reference(self) -> bool:
        return self.preference.loss != "simpo"

    @property
    def reference_in_actor(self) -> bool:
        """LoRA: the reference is the actor with its adapters off."""
        return bool(self.config.actor.lora.rank)

    def check_config(self) -> None:
        if self.config.critic.lora.rank:
            raise ConfigError("critic.lora.rank: the DPO pipeline has no critic")

    def start_workers(self) -> None:
        from roll_lite.workers.group import ModelGroup, make_placement

        w = self.config.workers
        reference_worker = self.uses_reference and self.preference.reference == "worker" and not self.reference_in_actor
        placement = make_placement(self.config, roles_on_a_gpu=1 + (reference_worker and not w.one_process_per_rank))
        self.actor = ModelGroup("actor", w.actor_dp, placement, self.config)
        host = self.actor if w.one_process_per_rank else None  # or processes of their own
        # cast: load_config sets reference_dp (None in the dataclass: "as actor_dp on GPUs, else 1")
        self.reference = (
            ModelGroup("reference", cast(int, w.reference_dp), placement, self.config, host)
            if reference_worker
            else None
        )
        for group in (self.actor, self.reference):
            if group is not None:
                group.wait_ready()
        if self.reference_in_actor:
            logger.info(self.actor.describe_lora())

    def before_training(self, resumed_step: int) -> None:
        """preference.reference = precomputed: every pair's reference log-probs, from the actor before
        its first step (a resumed run has them from its checkpoint)."""
        if not self.uses_reference or self.preference.reference != "precomputed" or self.precomputed:
            return
        if resumed_step:
            raise RuntimeError(f"the checkpoint of step {resumed_step} holds no {REFERENCE_FILE}")
        self.stage = "the reference's pass over every pair"
        for split, pairs in (("train", self.train_data), ("eval", self.eval_data)):
            if pairs is None:
                continue
            sums = []
            for start in range(0, len(pairs), EVAL_PAIRS):
                chunk = pairs.select(range(start, min(start + EVAL_PAIRS, len(pairs))))
                sums.append(self.reference_logps(build_pair_batch(chunk, self.tokenizer.pad_token_id)).reshape(-1, 2))
            self.precomputed[split] = torch.cat(sums)
        logger.info(
            "reference log-probs precomputed for %d training and %d held-out pairs",
            len(self.train_data),
            0 if self.eval_data is None else len(self.eval_data),
        )

    def complete_batch(self, batch: DataProto, rows: list[int], split: str) -> DataProto:
        """reference_logps: [rows] each response's summed reference log-prob (not for SimPO)."""
        if not self.uses_reference:
            return batch
        if self.preference.reference == "precomputed":
            batch.batch["reference_logps"] = self.precomputed[split][rows].reshape(-1)
        else:
            batch.batch["reference_logps"] = self.reference_logps(batch)
        return batch

    def reference_logps(self, batch: DataProto) -> torch.Tensor:
        """[rows] float64: Σ of the reference's log-probs over each row's response tokens."""
        if self.reference is not None:
            log_probs = self.reference.compute_log_probs(batch)["log_probs"]
        elif self.reference_in_actor:
            assert self.actor is not None  # start_workers() set it
            log_probs = self.actor.compute_reference_log_probs(batch)["log_probs"]
        else:  # precomputed, before the first step: the actor is the reference
            assert self.actor is not None
            log_probs = self.actor.compute_log_probs(batch)["log_probs"]
        response = batch["chosen_mask"].bool() | batch["rejected_mask"].bool()
        return torch.where(response, log_probs.double(), 0.0).sum(-1)

    def save_driver_state(self, folder: Path) -> None:
        if self.precomputed:
            torch.save(self.precomputed, folder / REFERENCE_FILE)

    def load_driver_state(self, folder: Path, step: int) -> None:
        if (folder / REFERENCE_FILE).exists():
            self.precomputed = torch.load(folder / REFERENCE_FILE)
