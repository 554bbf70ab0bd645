"""SFTPipeline: supervised fine-tuning through the same FSDP2 strategy and actor workers as RL.

`roll-train --config configs/sft.yaml` trains `sft.steps` steps on `sft.train_files` (roll_lite/data/sft.py:
prompt + response, or whole conversations with the loss on assistant turns), reports eval/sft_loss on
`sft.eval_files`, and writes <output_dir>/<run_name>/final/, a HF folder an RL config starts from
(`model.pretrained_path`). An RL config with `sft.steps > 0` runs the same loop on its actor first
(a warm start; PPOPipeline.warm_start).

The loss (`loss_func`, overridable like the RL pipeline's) is the token-mean negative log-likelihood
of the target tokens, normalised by the target-token count of the whole step's batch: the strategy
gathers it over ranks and micro-batches, so D, A and packing do not change the step.
"""

from __future__ import annotations

import logging
import time

import torch

from roll_lite.config import ConfigError, RunConfig
from roll_lite.data import DataProto
from roll_lite.data.sampler import PromptSampler
from roll_lite.data.sequences import build_target_batch
from roll_lite.loss import sft_loss_func
from roll_lite.model.vision_run import run_tokenizer

from .supervised import SupervisedPipeline, image_column
from .traces import sft_trace

logger = logging.getLogger("roll_lite")
EVAL_CHUNK = 256  # eval sequences per forward call


class SFTPipeline(SupervisedPipeline):
    section, metric_prefix, headline = "sft", "sft", ("sft/loss", "eval/sft_loss")
    checkpoint_kind = "sft"
    # Besides the model's: the keys that decide which rows the sampler's saved position refers to.
    checkpoint_compat_keys = (
        "sft.train_files",
        "sft.from_data_source",
        "sft.shuffle",
        "sft.prompt_key",
        "sft.response_key",
        "sft.apply_chat_template",
        "sft.max_length",
    )
    total_steps_key = "sft.steps"

    def __init__(self, config: RunConfig, tokenizer=None):
        super().__init__(config, config.sft)
        self.sft = config.sft
        self.tokenizer = tokenizer if tokenizer is not None else run_tokenizer(config.model)
        self.train_loss = "policy"  # the actor workers' name for this pipeline's loss_func; "sft" in a warm start
        self._loss = sft_loss_func("response_mask")

    def loss_func(self, batch: DataProto, output: dict) -> tuple[torch.Tensor, dict]:
        """Token-mean NLL of the batch's target tokens (response_mask), with the global token count."""
        return self._loss(batch, output)

    def prepare_data(self) -> None:
        """Load, validate and tokenize sft.train_files / sft.eval_files (in the driver, before Ray;
        DataError on a bad file). Idempotent."""
        if self.train_data is not None:
            return
        from roll_lite.data.sft import prepare_sft_datasets

        if self.sft.steps < 1:  # a warm start is built only with sft.steps > 0: this is the SFT pipeline itself
            raise ConfigError("sft.steps: the SFT pipeline trains sft.steps steps; set it >= 1")
        seed = self.config.seed if self.config.data.seed is None else self.config.data.seed
        prepared = prepare_sft_datasets(self.sft, self.tokenizer, self.config.data, seed, image_column(self.config))
        self.train_data, self.eval_data = prepared.train, prepared.eval
        self.sampler = PromptSampler(len(self.train_data), seed, self.sft.shuffle, self.sft.epochs)
        for note in prepared.notes:
            logger.info(note)

    def longest_sequences(self) -> tuple[int, int]:
        """(1: no prompts are generated from, tokens of the longest SFT sequence): for the position check."""
        self.prepare_data()
        parts = [self.train_data] + ([self.eval_data] if self.eval_data is not None else [])
        return 1, max(len(ids) for data in parts for ids in data.input_ids)

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        assert self.sampler is not None and self.actor is not None  # prepare_data() and start_workers() made them
        rows = self.train_data.select(self.sampler.draw(self.sft.batch_size))
        batch = build_target_batch(rows.input_ids, rows.target_masks, self.tokenizer.pad_token_id, rows.images)
        batch.meta_info["loss_mask_keys"] = ["response_mask"]
        metrics = self.actor.train_step(batch, self.train_loss)
        elapsed = time.perf_counter() - start
        if self.train_loss == "policy":  # the SFT pipeline's own steps, not a warm start's (docs/traces.md)
            self.step_trace = sft_trace(self.config, self.tokenizer, rows)
        return {
            **{f"sft/{'loss' if name == 'sft_loss' else name}": value for name, value in metrics.items()},
            "sft/target_tokens": float(batch["response_mask"].sum()),
            "perf/step_s": elapsed,
            "perf/tokens_per_s": float(batch["attention_mask"].sum()) / elapsed,
        }

    def evaluate(self) -> dict[str, float]:
        """eval/sft_loss: the NLL per target token over all of sft.eval_files (one forward, no grad)."""
        if self.eval_data is None:
            return {}
        assert self.actor is not None  # start_workers() set it
        total, tokens = 0.0, 0
        for start in range(0, len(self.eval_data), EVAL_CHUNK):
            chunk = self.eval_data.select(range(start, min(start + EVAL_CHUNK, len(self.eval_data))))
            batch = build_target_batch(chunk.input_ids, chunk.target_masks, self.tokenizer.pad_token_id, chunk.images)
            mask = batch["response_mask"].bool()
            log_probs = self.actor.compute_log_probs(batch)["log_probs"]
            total -= torch.where(mask, log_probs, 0.0).double().sum().item()
            tokens += int(mask.sum())
        return {"eval/sft_loss": total / tokens}

    @property
    def progress_label(self) -> str:
        return "warm start" if self.train_loss == "sft" else "SFT"
