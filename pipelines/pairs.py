"""PairPipeline: what the reward-model and the DPO pipelines share on top of SupervisedPipeline
(pipelines/supervised.py): steps over preference pairs (roll_lite/data/pairs.py), and held-out metrics
that are the loss's own, computed over all of preference.eval_files.

A subclass names its loss (`loss_func`), the actor's head (`actor_head`), its metric prefix and
headline, what a batch needs besides the pairs (`complete_batch`) and the actor's outputs the loss
reads (`outputs`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from roll_lite.config import RunConfig
from roll_lite.data import DataProto
from roll_lite.data.pairs import PairData, build_pair_batch
from roll_lite.data.sampler import PromptSampler
from roll_lite.loss.preference import PAIR_MASK
from roll_lite.model.vision_run import run_tokenizer
from roll_lite.runtime.metrics import reduce_metrics

from .supervised import SupervisedPipeline, image_column
from .traces import pair_trace

logger = logging.getLogger("roll_lite")
EVAL_PAIRS = 128  # held-out pairs per forward call


class PairPipeline(SupervisedPipeline):
    section = "preference"
    actor_head = "log_probs"

    def __init__(self, config: RunConfig, tokenizer: Any = None) -> None:
        super().__init__(config, config.preference)
        self.preference = config.preference
        self.tokenizer = tokenizer if tokenizer is not None else run_tokenizer(config.model)

    def loss_func(
        self, batch: DataProto, output: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def outputs(self, batch: DataProto) -> dict[str, torch.Tensor]:
        """The actor's forward outputs over `batch` (no grad), as the loss reads them."""
        assert self.actor is not None  # start_workers() set it
        return dict(self.actor.compute_log_probs(batch).batch)

    def complete_batch(self, batch: DataProto, rows: list[int], split: str) -> DataProto:
        """What the loss reads besides the pairs (DPO: the reference's log-probs); rows of `split`."""
        return batch

    # -- data -------------------------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Load, validate and tokenize preference.train_files / eval_files (in the driver, before Ray;
        DataError on a bad file). Idempotent."""
        if self.train_data is not None:
            return
        from roll_lite.data.pairs import prepare_pair_datasets

        self.check_config()
        prepared = prepare_pair_datasets(self.preference, self.tokenizer, image_column(self.config))
        self.train_data, self.eval_data = prepared.train, prepared.eval
        seed = self.config.seed if self.config.data.seed is None else self.config.data.seed
        self.sampler = PromptSampler(len(self.train_data), seed, self.preference.shuffle, self.preference.epochs)
        for note in prepared.notes:
            logger.info(note)

    def check_config(self) -> None:
        """ConfigError on settings this pipeline cannot run (before the data is read)."""

    def longest_sequences(self) -> tuple[int, int]:
        """(1: nothing is generated, tokens of the longest side of any pair): for the position check."""
        self.prepare_data()
        parts = [self.train_data] + ([self.eval_data] if self.eval_data is not None else [])
        return 1, max(max(data.lengths()) for data in parts)

    def pair_batch(self, pairs: PairData, rows: list[int], split: str) -> DataProto:
        return self.complete_batch(build_pair_batch(pairs, self.tokenizer.pad_token_id), rows, split)

    # -- the loop ---------------------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        assert self.sampler is not None and self.actor is not None  # prepare_data() and start_workers() made them
        rows = self.sampler.draw(self.preference.batch_size)
        pairs = self.train_data.select(rows)
        batch = self.pair_batch(pairs, rows, "train")
        metrics = self.actor.train_step(batch, "policy")
        elapsed = time.perf_counter() - start
        self.step_trace = pair_trace(self.config, self.tokenizer, pairs)  # docs/traces.md
        return {
            **{f"{self.metric_prefix}/{name}": value for name, value in metrics.items()},
            f"{self.metric_prefix}/pairs": float(len(rows)),
            "perf/step_s": elapsed,
            "perf/tokens_per_s": float(batch["attention_mask"].sum()) / elapsed,
        }

    def evaluate(self) -> dict[str, float]:
        """The loss's metrics over all held-out pairs, computed as in training (one forward, no grad)."""
        if self.eval_data is None:
            return {}
        # the denominators of the whole held-out set: each chunk's metrics are its share of the mean
        whole = {
            "global_valid_samples": {PAIR_MASK: torch.tensor(float(len(self.eval_data)), dtype=torch.float64)},
            "batch_num_tokens": {
                PAIR_MASK: torch.tensor(float(sum(sum(mask) for _, mask in self.eval_data.chosen)), dtype=torch.float64)
            },
        }
        records = []
        for start in range(0, len(self.eval_data), EVAL_PAIRS):
            rows = list(range(start, min(start + EVAL_PAIRS, len(self.eval_data))))
            batch = self.pair_batch(self.eval_data.select(rows), rows, "eval")
            batch.meta_info.update(whole)
            loss, metrics = self.loss_func(batch, self.outputs(batch))
            records.append({name: float(value) for name, value in {"loss@sum": loss, **metrics}.items()})
        return {f"eval/{self.metric_prefix}/{name}": value for name, value in reduce_metrics(records).items()}

    # Besides the model's: the keys that decide which pairs the sampler's saved position refers to.
    checkpoint_compat_keys: tuple[str, ...] = (
        "preference.train_files",
        "preference.shuffle",
        "preference.prompt_key",
        "preference.chosen_key",
        "preference.rejected_key",
        "preference.apply_chat_template",
        "preference.max_length",
    )
    total_steps_key = "preference.steps"
