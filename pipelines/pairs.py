"""PairPipeline: what the reward-model and the DPO pipelines share. Steps over preference pairs
(roll_lite/data/pairs.py) through the same FSDP2 strategy and actor workers as RL; held-out metrics
every `preference.eval_every` steps; checkpoints and resume through RunSession; final/ at the end.

A subclass names its loss (`loss_func`), the actor's head (`actor_head`), its metric prefix, what a
batch needs besides the pairs (`complete_batch`) and the actor's outputs the loss reads (`outputs`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from roll_lite.config import RunConfig
from roll_lite.data import DataProto
from roll_lite.data.pairs import PairData, build_pair_batch
from roll_lite.data.sampler import PromptSampler
from roll_lite.loss.preference import PAIR_MASK
from roll_lite.model.tokenizer import load_tokenizer
from roll_lite.runtime.metrics import reduce_metrics
from roll_lite.runtime.progress import progress_bar, seconds_in_all

from .session import RunSession

logger = logging.getLogger("roll_lite")
EVAL_PAIRS = 128  # held-out pairs per forward call


class PairPipeline:
    actor_head = "log_probs"
    metric_prefix = "pairs"
    headline = "loss"  # the metric the log line shows

    def __init__(self, config: RunConfig, tokenizer=None):
        self.config, self.preference = config, config.preference
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.model.tokenizer_path, config.model.chat_template)
        self.train_data = self.eval_data = self.sampler = None  # prepare_data(): in the driver only
        self.actor = None
        self.stage = "start-up"

    def loss_func(self, batch: DataProto, output: dict) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def outputs(self, batch: DataProto) -> dict[str, torch.Tensor]:
        """The actor's forward outputs over `batch` (no grad), as the loss reads them."""
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
        prepared = prepare_pair_datasets(self.preference, self.tokenizer)
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

    def start_workers(self) -> None:
        from roll_lite.workers.group import ModelGroup
        from roll_lite.workers.placement import Placement

        placement = Placement(self.config, roles_on_a_gpu=1)
        self.actor = ModelGroup("actor", self.config.workers.actor_dp, placement, self.config).wait_ready()

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        rows = self.sampler.draw(self.preference.batch_size)
        batch = self.pair_batch(self.train_data.select(rows), rows, "train")
        metrics = self.actor.train_step(batch, "policy")
        elapsed = time.perf_counter() - start
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
        whole = {"global_valid_samples": {PAIR_MASK: torch.tensor(float(len(self.eval_data)), dtype=torch.float64)},
                 "batch_num_tokens": {PAIR_MASK: torch.tensor(float(sum(sum(mask) for _, mask in self.eval_data.chosen)),
                                                              dtype=torch.float64)}}
        records = []
        for start in range(0, len(self.eval_data), EVAL_PAIRS):
            rows = list(range(start, min(start + EVAL_PAIRS, len(self.eval_data))))
            batch = self.pair_batch(self.eval_data.select(rows), rows, "eval")
            batch.meta_info.update(whole)
            loss, metrics = self.loss_func(batch, self.outputs(batch))
            records.append({name: float(value) for name, value in {"loss@sum": loss, **metrics}.items()})
        return {f"eval/{self.metric_prefix}/{name}": value for name, value in reduce_metrics(records).items()}

    def train(self, first_step: int = 1, end_step=None) -> dict[str, float]:
        """Steps first_step..preference.steps (fewer when preference.epochs runs out), held-out metrics
        every preference.eval_every; `end_step(step, metrics, last)` gets each step's metrics."""
        p, metrics, start = self.preference, {}, time.perf_counter()
        if first_step == 1:
            self.actor.reset_optimizer(p.lr)
        bar = progress_bar(p.steps - first_step + 1, self.metric_prefix)
        for step in range(first_step, p.steps + 1):
            if self.data_used_up:
                logger.info("%s: the training pairs are used up (preference.epochs=%d) after step %d",
                            self.metric_prefix, p.epochs, step - 1)
                break
            self.stage = f"{self.metric_prefix} step {step}"
            metrics = self.step(step)
            bar.update()
            last = step == p.steps or self.data_used_up
            if step % p.eval_every == 0 or last:
                metrics.update(self.evaluate())
                name = f"{self.metric_prefix}/{self.headline}"
                held_out = metrics.get(f"eval/{name}")
                logger.info("%s step %d/%d | %s %.3f%s | %.1f s", self.metric_prefix, step, p.steps, self.headline,
                            metrics.get(name, float("nan")), "" if held_out is None else f" | held-out {held_out:.3f}",
                            time.perf_counter() - start)
            if end_step is not None:
                end_step(step, metrics, last=last)
        bar.close()
        return metrics

    def save_final(self, path: Path) -> None:
        self.actor.save_pretrained(str(path.resolve()))
        self.tokenizer.save_pretrained(path)
        logger.info("saved the model and tokenizer to %s", path)

    def run(self) -> list[dict]:
        """Workers, step-0 eval, preference.steps steps (checkpoints as configured; resumed as `resume`
        says), final/. Returns the metrics history."""
        from roll_lite.workers.placement import reservation

        c, start = self.config, time.monotonic()
        self.prepare_data()  # before the run directory and Ray: a bad file stops here
        with RunSession(self, reservation(c, with_rollout=False)) as session:
            self.stage = "the start of the workers"
            self.start_workers()
            resumed_step = session.begin()
            self.before_training(resumed_step)
            if not resumed_step:
                self.stage = "step 0 (evaluation)"
                initial = self.evaluate()
                if initial:
                    session.log(0, initial)
            self.train(first_step=resumed_step + 1, end_step=session.end_step)
            if c.save_model:
                self.stage = "saving the final model"
                self.save_final(session.run_dir / "final")
        logger.info("%s: %.1f s in all; run dir %s", self.metric_prefix, seconds_in_all(start), session.run_dir)
        return session.tracker.history

    def before_training(self, resumed_step: int) -> None:
        """After the workers start (and a resume), before step 0's evaluation."""

    # -- checkpoints (pipelines/session.py, roll_lite/checkpoint/) ---------------------------------

    # Besides the model's: the keys that decide which pairs the sampler's saved position refers to.
    checkpoint_compat_keys = ("preference.train_files", "preference.shuffle", "preference.prompt_key",
                              "preference.chosen_key", "preference.rejected_key", "preference.apply_chat_template",
                              "preference.max_length")
    total_steps_key = "preference.steps"

    @property
    def total_steps(self) -> int:
        return self.preference.steps

    @property
    def data_used_up(self) -> bool:
        return self.sampler.exhausted

    def checkpoint_groups(self) -> dict:
        return {"actor": self.actor}

    def save_driver_state(self, folder: Path) -> None:
        """Nothing by default: the driver draws no random numbers (the sampler's position is in the manifest)."""

    def load_driver_state(self, folder: Path, step: int) -> None:
        """Nothing by default (see save_driver_state)."""
