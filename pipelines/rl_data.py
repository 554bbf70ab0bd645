"""PPOPipeline's prompts, apart from its step: the data files read, checked and tokenized in the driver
before Ray starts (with the warm start's SFT data), the training sampler, and each step's prompts drawn
from it. MultiTurnPipeline replaces read_data, longest_sequences and draw_prompts (its rows seed
environments)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from roll_lite.config import RunConfig
from roll_lite.data.domain_sampler import training_sampler
from roll_lite.data.prompts import PromptData, prepare_datasets
from roll_lite.model.vision_run import image_prompt_encoder
from roll_lite.rewards.code import code_row_check

from .sft import SFTPipeline

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from roll_lite.data.domain_sampler import DomainSampler, PromptSampler  # what training_sampler returns

    from .async_episodes import FullyAsyncEpisodes
    from .async_schedule import FullyAsyncSchedule
    from .rollout_schedule import RolloutSchedule
    from .teachers import Teachers

logger = logging.getLogger("roll_lite")


class RLData:
    # What this mixin reads of the pipeline it is mixed into (PPOPipeline sets them in __init__):
    # declared for the type checker only, no value here.
    config: RunConfig
    tokenizer: PreTrainedTokenizerFast
    schedule: RolloutSchedule | FullyAsyncSchedule | FullyAsyncEpisodes
    teachers: Teachers | None
    train_data: Any  # read_data()'s rows: PromptData here, the dataset's dicts in MultiTurnPipeline
    eval_data: Any
    sampler: PromptSampler | DomainSampler | None
    warm_start_sft: SFTPipeline | None

    def prepare_data(self) -> None:
        """Load, validate and tokenize the data: files (data.train_files, data.eval_files), and the
        training sampler. In the driver, before Ray starts; a bad file raises DataError (one line).
        Idempotent: run() calls it too."""
        if self.train_data is not None:
            return
        if self.teachers is not None:
            self.teachers.check(self.tokenizer)
        self.train_data, self.eval_data = self.read_data()
        self.sampler = training_sampler(self.config.data, self.train_data, self.data_seed)
        if self.config.sft.steps:
            self.warm_start_sft = SFTPipeline(self.config, self.tokenizer)
            self.warm_start_sft.train_loss = "sft"  # the built-in SFT loss, not this pipeline's loss_func
            self.warm_start_sft.prepare_data()

    def read_data(self) -> tuple[PromptData, PromptData | None]:
        """(the training prompts, the held-out ones or None), tokenized."""
        reward, data = self.config.reward, self.config.data
        teachers = self.teachers.domains if self.teachers is not None else None
        domains = list(reward.domains) or list(data.domain_weights) or teachers
        prepared = prepare_datasets(
            data,
            self.tokenizer,
            domains=domains,
            row_check=code_row_check(reward, data.domain_key),
            seed=self.data_seed,
            encode_images=image_prompt_encoder(self.config.model, data),  # data.image_key: docs/vision.md
        )
        for note in prepared.notes:
            logger.info(note)
        return prepared.train, prepared.eval

    def longest_sequences(self) -> tuple[int, int]:
        """(tokens of the longest prompt, of the longest warm-start SFT sequence; 0 without a warm start)."""
        self.prepare_data()
        rows = [self.train_data] + ([self.eval_data] if self.eval_data is not None else [])
        longest_prompt = max(len(ids) for data in rows for ids in data.prompt_ids)
        return longest_prompt, cast(SFTPipeline, self.warm_start_sft).longest_sequences()[
            1
        ] if self.config.sft.steps else 0

    @property
    def data_seed(self) -> int:
        return self.config.seed if self.config.data.seed is None else self.config.data.seed

    @property
    def data_used_up(self) -> bool:
        """data.epochs ended: no prompts left to draw, and every step they were drawn for has run."""
        assert self.sampler is not None  # prepare_data() made it
        return self.sampler.exhausted and not len(self.schedule.queue)

    def draw_prompts(
        self,
    ) -> tuple[list[int], list[list[int]]] | tuple[list[int], list[list[int]], list[dict[str, Any]]] | None:
        """(dataset rows, their prompt ids) of the next prompts, and their image inputs for image rows."""
        assert self.sampler is not None  # prepare_data() made it
        rows = self.sampler.draw(self.config.rollout.prompts_per_step)
        if not rows:
            return None
        drawn = self.train_data.select(rows)
        return (rows, drawn.prompt_ids, drawn.images) if drawn.images else (rows, drawn.prompt_ids)
