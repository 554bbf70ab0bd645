"""SupervisedPipeline: what the SFT, reward-model and DPO pipelines share. Steps over a fixed dataset
(no rollout) through the same FSDP2 strategy and actor workers as RL: a seeded sampler over the rows,
held-out metrics every `eval_every` steps, checkpoints and resume through RunSession, final/ at the end.

A subclass gives its config section (`settings`: steps, lr, eval_every, epochs), `prepare_data`,
`step`, `evaluate`, `longest_sequences`, its names (`metric_prefix`, `headline`, `checkpoint_kind`,
`checkpoint_compat_keys`, `total_steps_key`) and, if it needs one, `before_training`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll_lite.runtime.progress import progress_bar, seconds_in_all

from .session import RunSession

if TYPE_CHECKING:
    from typing import Protocol

    from roll_lite.workers.group import ModelGroup

    from roll_lite.config import PreferenceConfig, RunConfig, SFTConfig
    from roll_lite.data.image_sequences import ImageColumn
    from roll_lite.data.sampler import PromptSampler

    class EndStep(Protocol):
        """What train() calls after each step (RunSession.end_step)."""

        def __call__(self, step: int, metrics: dict[str, float], *, last: bool) -> None: ...


logger = logging.getLogger("roll_lite")


def image_column(config: RunConfig) -> ImageColumn | None:
    """data.image_key's images for the rows of a vision-language model (docs/vision.md, "SFT and DPO on image
    rows"): the column and the run's processor; None without data.image_key. A ConfigError for a text model."""
    if config.data.image_key is None:
        return None
    from roll_lite.config import ConfigError
    from roll_lite.data.image_sequences import ImageColumn
    from roll_lite.model.vision_run import VISION_MODEL_TYPES, is_vision_model, model_processor

    if not is_vision_model(config.model):
        raise ConfigError(
            f"data.image_key: the model reads no images: set model.model_type={'|'.join(VISION_MODEL_TYPES)} (a "
            "vision-language model built from the model keys; docs/vision.md), or leave data.image_key null"
        )
    return ImageColumn(config.data.image_key, model_processor(config.model, config.data))


class SupervisedPipeline:
    section = "sft"  # the config section `settings` is (sft, preference): named in messages
    metric_prefix = "train"  # the log lines' and metrics' prefix
    headline = ("loss", "loss")  # (training metric, held-out metric) the log line shows, under the prefix
    train_loss = "policy"  # the actor workers' name for the loss: the pipeline's loss_func
    # Set after __init__ (None there): the data and the sampler by the subclass's prepare_data(), in the
    # driver only (SFTPipeline: SFTData; PairPipeline: PairData), the actor by start_workers().
    train_data: Any
    eval_data: Any
    sampler: PromptSampler | None
    actor: ModelGroup | None
    tokenizer: Any  # a transformers tokenizer: the subclass's __init__ loads it
    # what a subclass names for its checkpoints (pipelines/session.py, roll_lite/checkpoint/)
    checkpoint_kind: str
    checkpoint_compat_keys: tuple[str, ...]
    total_steps_key: str

    if TYPE_CHECKING:  # what a subclass provides (the module's docstring); declared for the type checker only

        def prepare_data(self) -> None: ...
        def step(self, step: int) -> dict[str, float]: ...
        def evaluate(self) -> dict[str, float]: ...
        def longest_sequences(self) -> tuple[int, int]: ...

    def __init__(self, config: RunConfig, settings: SFTConfig | PreferenceConfig) -> None:
        self.config, self.settings = config, settings
        self.train_data = self.eval_data = self.sampler = None  # prepare_data(): in the driver only
        self.actor = None
        self.stage = "start-up"  # where run() is: named by a worker failure and by a stop on a signal

    def start_workers(self) -> None:
        from roll_lite.workers.group import ModelGroup, make_placement

        placement = make_placement(self.config, roles_on_a_gpu=1)
        self.actor = ModelGroup("actor", self.config.workers.actor_dp, placement, self.config).wait_ready()

    def before_training(self, resumed_step: int) -> None:
        """After the workers start (and a resume), before step 0's evaluation."""

    def train(self, first_step: int = 1, end_step: EndStep | None = None) -> dict[str, float]:
        """Steps first_step..settings.steps at settings.lr (fewer when settings.epochs runs out), held-out
        metrics every settings.eval_every; `end_step(step, metrics, last)` gets each step's metrics. A
        fresh optimizer when starting at step 1; a resumed run keeps the one its checkpoint restored.
        Returns the last step's metrics."""
        metrics: dict[str, float]
        s, metrics, start = self.settings, {}, time.perf_counter()
        assert self.actor is not None  # start_workers() (or the RL pipeline's warm start) set it
        if first_step == 1:
            self.actor.reset_optimizer(s.lr)
        bar = progress_bar(s.steps - first_step + 1, self.progress_label)
        for step in range(first_step, s.steps + 1):
            if self.data_used_up:
                logger.info(
                    "%s: the training rows are used up (%s.epochs=%d) after step %d",
                    self.metric_prefix,
                    self.section,
                    s.epochs,
                    step - 1,
                )
                break
            self.stage = f"{self.metric_prefix} step {step}"
            metrics = self.step(step)
            bar.update()
            last = step == s.steps or self.data_used_up
            evaluated = step % s.eval_every == 0 or last
            if evaluated:
                metrics.update(self.evaluate())
            if evaluated or step % 100 == 0:
                self.log_progress(step, metrics, time.perf_counter() - start)
            if end_step is not None:
                end_step(step, metrics, last=last)
        bar.close()
        return metrics

    @property
    def progress_label(self) -> str:
        return self.metric_prefix

    def log_progress(self, step: int, metrics: dict[str, float], seconds: float) -> None:
        train_name, eval_name = self.headline
        held_out = metrics.get(eval_name)
        logger.info(
            "%s step %d/%d | %s %.3f%s | %.1f s",
            self.metric_prefix,
            step,
            self.settings.steps,
            train_name.rsplit("/", 1)[-1],
            metrics.get(train_name, float("nan")),
            "" if held_out is None else f" | held-out {held_out:.3f}",
            seconds,
        )

    def save_final(self, path: Path) -> None:
        """The model as a HF folder (+ tokenizer)."""
        assert self.actor is not None  # start_workers() set it
        from roll_lite.model.vision_run import save_tokenizer_files

        self.actor.save_pretrained(str(path.resolve()))
        save_tokenizer_files(self.config.model, self.config.data, self.tokenizer, path)  # a VLM's: its processor
        logger.info("saved the model and tokenizer to %s", path)

    def run(self) -> list[dict[str, Any]]:
        """Workers, step-0 eval, settings.steps steps (checkpoints as configured; resumed as `resume`
        says), final/. Returns the metrics history."""
        from roll_lite.workers.group import reservation

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
        assert session.tracker is not None  # session.begin() opened it
        return session.tracker.history

    # -- checkpoints (pipelines/session.py, roll_lite/checkpoint/) ---------------------------------

    @property
    def total_steps(self) -> int:
        return self.settings.steps

    @property
    def data_used_up(self) -> bool:
        """settings.epochs ended: no rows left to draw."""
        assert self.sampler is not None  # prepare_data() made it
        return self.sampler.exhausted

    def checkpoint_groups(self) -> dict[str, ModelGroup | None]:
        return {"actor": self.actor}

    def save_driver_state(self, folder: Path) -> None:
        """Nothing by default: the driver draws no random numbers (the sampler's position is in the manifest)."""

    def load_driver_state(self, folder: Path, step: int) -> None:
        """Nothing by default (see save_driver_state)."""
