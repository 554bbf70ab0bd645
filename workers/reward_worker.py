"""The reward worker: the weighted sum of the configured reward functions and reward models per response.

Each source gives each response a typed outcome (roll_lite/rewards/outcomes.py). A response whose
every function scored it `ok` is scored; any other is unscored: with reward.on_failure=zero the
function that did not score it adds 0 (and the response trains on the rest), with drop the pipeline
takes it out of the loss (pipelines/unscored.py). The metrics count each kind per function
(`reward/<name>/failed`, `/timed_out`, `/unparseable`) and the unscored responses (`reward/unscored`);
one warning per batch names the first reason. The reward models run in this process.
"""

from __future__ import annotations

import logging

import torch

from roll_lite.rewards.outcomes import KINDS, Tally
from roll_lite.rewards.runner import RewardRunner
from roll_lite.runtime.importing import enter_import_root

logger = logging.getLogger("roll_lite.rewards")


class RewardWorker:
    def __init__(self, weights: dict[str, float], timeout_s: float = 5.0, import_roots: list[str | None] = (),
                 driver_roll_lite: str | None = None, on_failure: str = "zero", models: dict[str, float] | None = None,
                 model_options: dict | None = None, policy_tokenizer: tuple[str | None, str | None] = (None, None),
                 judges: dict[str, float] | None = None, judge_options: dict | None = None):
        """`models`: reward-model folder -> weight, loaded with `model_options` (max_tokens, normalize,
        clip: reward.model_*) and compared with the policy's tokenizer (model.tokenizer_path, chat_template).
        `judges`: judge folder -> weight, with `judge_options` (template, parser: an import path,
        max_new_tokens: reward.judge_*)."""
        # The directories the driver imported the user's reward modules from, after the installed packages.
        for root in import_roots:
            enter_import_root(root, driver_roll_lite)
        self.weights = {name: float(weight) for name, weight in weights.items()}
        self.on_failure = on_failure
        self.runner = RewardRunner(list(self.weights), timeout_s)
        self.models, self.judges = {}, {}
        if models:
            from roll_lite.model.tokenizer import load_tokenizer
            from roll_lite.rewards.reward_model import RewardModel, model_metric_name

            tokenizer = load_tokenizer(*policy_tokenizer)
            self.models = {model_metric_name(path): (RewardModel(path, tokenizer, **(model_options or {})), float(weight))
                           for path, weight in models.items()}
        if judges:
            from roll_lite.rewards.judge import Judge, judge_metric_name
            from roll_lite.runtime.importing import load_object

            options = dict(judge_options or {})
            options["parser"] = load_object(options["parser"]) if options.get("parser") else None
            self.judges = {judge_metric_name(path): (Judge(path, **options), float(weight)) for path, weight in judges.items()}

    def describe(self) -> list[str]:
        """A line per reward model (how it sees the text) and per judge."""
        return [source.describe() for source, _ in [*self.models.values(), *self.judges.values()]]

    def score(self, responses: list[str], answers: list[str], extras: list[dict] | None = None,
              prompts: list | None = None,
              sequences: list[list[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(scores [rows], scored [rows] bool: every source gave that row a score, metrics).
        reward/<name> is the source's mean over the rows it scored; reward/<name>/<kind> counts the
        rows it did not score, by kind; reward/unscored counts the rows some source did not score.
        The reward models also read each row's prompt (a string or chat messages) and its token ids
        (prompt + response, the policy's tokenizer)."""
        extras = [{} for _ in responses] if extras is None else [dict(e or {}) for e in extras]
        if not len(responses) == len(answers) == len(extras):
            raise ValueError(f"reward: {len(responses)} responses, {len(answers)} answers, {len(extras)} extras")
        if (self.models or self.judges) and (prompts is None or sequences is None):
            raise ValueError("reward: the reward models and judges need each row's prompt and token ids")
        total = torch.zeros(len(responses), dtype=torch.float32)
        scored = torch.ones(len(responses), dtype=torch.bool)
        metrics, tallies = {}, {}
        sources = [(name, weight, lambda name=name: self.runner.score(name, responses, answers, extras))
                   for name, weight in self.weights.items()]
        sources += [(name, weight, lambda model=model: model.score(prompts, responses, sequences))
                    for name, (model, weight) in self.models.items()]
        sources += [(name, weight, lambda judge=judge: judge.score(prompts, responses, answers, extras))
                    for name, (judge, weight) in self.judges.items()]
        for name, weight, run in sources:
            outcomes = run()
            tally = tallies[name] = Tally()
            for outcome in outcomes:
                tally.add(outcome)
            values = torch.tensor([outcome.value for outcome in outcomes], dtype=torch.float32)
            ok = torch.tensor([outcome.ok for outcome in outcomes], dtype=torch.bool)
            total += weight * values  # 0 where not ok
            scored &= ok
            metrics[f"reward/{name}"] = values[ok].mean().item() if ok.any() else 0.0
            metrics.update({f"reward/{name}/{kind}": float(tally.counts[kind]) for kind in KINDS if kind != "ok"})
        metrics["reward/unscored"] = float((~scored).sum())
        self._warn(tallies, len(responses), int((~scored).sum()))
        return total, scored, metrics

    def _warn(self, tallies: dict[str, Tally], rows: int, unscored: int) -> None:
        if not unscored:
            return
        counts = "; ".join(f"{name}: " + ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in tally.counts.items()
                                                   if kind != "ok" and n)
                           for name, tally in tallies.items() if tally.not_ok)
        first = next(f"{name}: {tally.first_reason}" for name, tally in tallies.items() if tally.first_reason)
        then = ("scored 0 by those functions (reward.on_failure=zero)" if self.on_failure == "zero" else
                "taken out of the loss and their groups' baselines (reward.on_failure=drop)")
        logger.warning("rewards: %d of %d responses unscored (%s), %s; first: %s", unscored, rows, counts, then, first)

    def close(self) -> None:
        self.runner.close()
