"""RewardModelPipeline: a Bradley–Terry reward model trained on preference pairs.

`roll-train --config configs/reward_model.yaml` puts a one-label score head on the decoder of the
run's causal LM (`model.pretrained_path`, or a model built from the `model` keys), trains it on
`preference.train_files` with −log σ(s_chosen − s_rejected − margin) (+ `preference.center_coef` ·
(s_c + s_r)²), reports pairwise accuracy and the score gap on `preference.eval_files`, and writes
<output_dir>/<run_name>/final/: a transformers *ForSequenceClassification folder (num_labels=1) with
the tokenizer, which `reward.models` loads as it is (roll_lite/rewards/reward_model.py).

The score of a sequence is the head's output at its last token that is not padding, where the
exported classifier reads it, so final/ gives the scores the run trained. The head starts from
transformers' initialisation (normal, std initializer_range) drawn from `seed`.
"""

from __future__ import annotations

import torch

from roll_lite.config import ConfigError
from roll_lite.data import DataProto
from roll_lite.loss import bradley_terry_loss_func

from .pairs import PairPipeline


class RewardModelPipeline(PairPipeline):
    actor_head = "score"
    metric_prefix = "rm"
    headline = ("rm/accuracy", "eval/rm/accuracy")
    checkpoint_kind = "reward_model"

    def __init__(self, config, tokenizer=None):
        super().__init__(config, tokenizer)
        self._loss = bradley_terry_loss_func(center_coef=self.preference.center_coef)

    def loss_func(self, batch: DataProto, output: dict) -> tuple[torch.Tensor, dict]:
        """Bradley–Terry over the batch's pairs (mean over the step's pairs, whatever D, A and packing)."""
        return self._loss(batch, output)

    def outputs(self, batch: DataProto) -> dict[str, torch.Tensor]:
        assert self.actor is not None  # start_workers() set it
        return dict(self.actor.compute_scores(batch).batch)

    def check_config(self) -> None:
        if self.config.actor.lora.rank:
            raise ConfigError(
                "actor.lora.rank: the reward-model pipeline trains the whole model and its score head; "
                "set actor.lora.rank=0"
            )
