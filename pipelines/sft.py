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
from pathlib import Path

import torch

from roll_lite.config import ConfigError, RunConfig
from roll_lite.data import DataProto
from roll_lite.data.sampler import PromptSampler
from roll_lite.loss import sft_loss_func
from roll_lite.runtime.progress import progress_bar, seconds_in_all
from roll_lite.data.sequences import build_target_batch
from roll_lite.model.tokenizer import load_tokenizer

from .session import RunSession

logger = logging.getLogger("roll_lite")
EVAL_CHUNK = 256  # eval sequences per forward call


class SFTPipeline:
    def __init__(self, config: RunConfig, tokenizer=None):
        self.config, self.sft = config, config.sft
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.model.tokenizer_path, config.model.chat_template)
        self.train_data = self.eval_data = self.sampler = None  # prepare_data(): in the driver only
        self.actor = None
        self.train_loss = "policy"  # the actor workers' name for this pipeline's loss_func; "sft" in a warm start
        self._loss = sft_loss_func("response_mask")
        self.stage = "start-up"  # where run() is: named by a worker failure and by a stop on a signal

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
        prepared = prepare_sft_datasets(self.sft, self.tokenizer)
        self.train_data, self.eval_data = prepared.train, prepared.eval
        seed = self.config.seed if self.config.data.seed is None else self.config.data.seed
        self.sampler = PromptSampler(len(self.train_data), seed, self.sft.shuffle, self.sft.epochs)
        for note in prepared.notes:
            logger.info(note)

    def longest_sequences(self) -> tuple[int, int]:
        """(1: no prompts are generated from, tokens of the longest SFT sequence): for the position check."""
        self.prepare_data()
        parts = [self.train_data] + ([self.eval_data] if self.eval_data is not None else [])
        return 1, max(len(ids) for data in parts for ids in data.input_ids)

    def start_workers(self) -> None:
        from roll_lite.workers.group import ModelGroup
        from roll_lite.workers.placement import Placement

        placement = Placement(self.config, roles_on_a_gpu=1)
        self.actor = ModelGroup("actor", self.config.workers.actor_dp, placement, self.config).wait_ready()

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        rows = self.train_data.select(self.sampler.draw(self.sft.batch_size))
        batch = build_target_batch(rows.input_ids, rows.target_masks, self.tokenizer.pad_token_id)
        batch.meta_info["loss_mask_keys"] = ["response_mask"]
        metrics = self.actor.train_step(batch, self.train_loss)
        elapsed = time.perf_counter() - start
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
        total, tokens = 0.0, 0
        for start in range(0, len(self.eval_data), EVAL_CHUNK):
            chunk = self.eval_data.select(range(start, min(start + EVAL_CHUNK, len(self.eval_data))))
            batch = build_target_batch(chunk.input_ids, chunk.target_masks, self.tokenizer.pad_token_id)
            mask = batch["response_mask"].bool()
            log_probs = self.actor.compute_log_probs(batch)["log_probs"]
            total -= torch.where(mask, log_probs, 0.0).double().sum().item()
            tokens += int(mask.sum())
        return {"eval/sft_loss": total / tokens}

    def train(self, first_step: int = 1, end_step=None) -> dict[str, float]:
        """Steps first_step..sft.steps at sft.lr (fewer when sft.epochs runs out), eval every
        sft.eval_every; `end_step(step, metrics, last)` gets each step's metrics. A fresh optimizer at
        sft.lr when starting at step 1; a resumed run keeps the one its checkpoint restored.
        Returns the last step's metrics."""
        sft, metrics, start = self.sft, {}, time.perf_counter()
        if first_step == 1:
            self.actor.reset_optimizer(sft.lr)
        bar = progress_bar(sft.steps - first_step + 1, "warm start" if self.train_loss == "sft" else "SFT")
        for step in range(first_step, sft.steps + 1):
            if self.data_used_up:
                logger.info("sft: the training rows are used up (sft.epochs=%d) after step %d", sft.epochs, step - 1)
                break
            self.stage = f"sft step {step}"
            metrics = self.step(step)
            bar.update()
            last = step == sft.steps or self.data_used_up
            evaluated = step % sft.eval_every == 0 or last
            if evaluated:
                metrics.update(self.evaluate())
            if evaluated or step % 100 == 0:
                held_out = f" | held-out loss {metrics['eval/sft_loss']:.3f}" if "eval/sft_loss" in metrics else ""
                logger.info("sft step %d/%d | loss %.3f%s | %.1f s", step, sft.steps, metrics.get("sft/loss", float("nan")), held_out,
                            time.perf_counter() - start)
            if end_step is not None:
                end_step(step, metrics, last=last)
        bar.close()
        return metrics

    def save_final(self, path: Path) -> None:
        """The model as a HF folder (+ tokenizer, generation_config); an RL config starts from it."""
        self.actor.save_pretrained(str(path.resolve()))
        self.tokenizer.save_pretrained(path)
        logger.info("saved the model and tokenizer to %s", path)

    def run(self) -> list[dict]:
        """Workers, step-0 eval, sft.steps steps (checkpoints as configured; resumed as `resume` says),
        final/. Returns the metrics history."""
        from roll_lite.workers.placement import reservation

        c, start = self.config, time.monotonic()
        self.prepare_data()  # before the run directory and Ray: a bad file stops here
        with RunSession(self, reservation(c, with_rollout=False)) as session:
            self.stage = "the start of the workers"
            self.start_workers()
            resumed_step = session.begin()
            if not resumed_step:
                self.stage = "step 0 (evaluation)"
                initial = self.evaluate()
                if initial:
                    session.log(0, initial)
            self.train(first_step=resumed_step + 1, end_step=session.end_step)
            if c.save_model:
                self.stage = "saving the final model"
                self.save_final(session.run_dir / "final")
        logger.info("sft: %.1f s in all; run dir %s", seconds_in_all(start), session.run_dir)
        return session.tracker.history

    # -- checkpoints (pipelines/session.py, roll_lite/checkpoint/) -----------------------------------

    checkpoint_kind = "sft"
    # Besides the model's: the keys that decide which rows the sampler's saved position refers to.
    checkpoint_compat_keys = ("sft.train_files", "sft.shuffle", "sft.prompt_key", "sft.response_key",
                              "sft.apply_chat_template", "sft.max_length")

    total_steps_key = "sft.steps"

    @property
    def total_steps(self) -> int:
        return self.sft.steps

    @property
    def data_used_up(self) -> bool:
        """sft.epochs ended: no rows left to draw."""
        return self.sampler.exhausted

    def checkpoint_groups(self) -> dict:
        return {"actor": self.actor}

    def save_driver_state(self, folder: Path) -> None:
        """Nothing: the driver draws no random numbers (the sampler's position is in the manifest)."""

    def load_driver_state(self, folder: Path, step: int) -> None:
        """Nothing (see save_driver_state)."""
