"""The reward worker: the weighted sum of a row's reward sources (functions, reward models, judges,
the code sandbox).

Each source gives each response a typed outcome (roll_lite/rewards/outcomes.py). A response whose
every source scored it `ok` is scored; any other is unscored: with reward.on_failure=zero the source
that did not score it adds 0 (and the response trains on the rest), with drop the pipeline takes it
out of the loss (pipelines/unscored.py). The metrics count each kind per source
(`reward/<name>/failed`, `/timed_out`, `/unparseable`) and the unscored responses (`reward/unscored`);
one warning per batch names the first reason. With reward.domains each row goes to its domain's
sources only (roll_lite/rewards/routing.py) and the metrics are per domain (`reward/<domain>/...`).
Reward models and judges run in this process, each loaded once whatever domains share it (a judge's
parser and template of your own in a guarded child process of its own, roll_lite/rewards/judge_code.py);
the code source runs each program in a sandbox of its own (roll_lite/sandbox/), a bounded pool of them
at once.

The sources score concurrently, one thread per scorer (the functions' runner, each reward model, each
judge, the code pool) going through the domains in order, so a source that waits (the sandbox's
programs, a model's GPU kernels) overlaps the others; on CPU a tiny judge's generation holds the
interpreter lock and the threads take turns (docs/benchmarks.md). Each scorer is used by
its own thread only, and the scores are summed in one fixed order, so the result does not depend on
which thread finishes first.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import torch

from roll_lite.rewards.outcomes import KINDS, Tally
from roll_lite.rewards.routing import all_sources, routes, rows_by_domain, uses_code
from roll_lite.rewards.runner import RewardRunner
from roll_lite.runtime.importing import enter_import_root

if TYPE_CHECKING:
    from roll_lite.rewards.code import CodeReward
    from roll_lite.rewards.judge import Judge
    from roll_lite.rewards.outcomes import Score
    from roll_lite.rewards.reward_model import RewardModel
    from roll_lite.rewards.routing import Sources

    # a source's call on a column dict: (a Score per row, its own counts for the metrics); `...`: the
    # lambdas that make them bind their source as a parameter with a default
    SourceCall = Callable[..., tuple[list[Score], dict[str, float]]]

logger = logging.getLogger("roll_lite.rewards")


def model_device(on_gpu: bool) -> str:
    """The GPU Ray gave this worker when torch sees CUDA, else the CPU (logical GPUs on a CPU machine)."""
    if on_gpu and torch.cuda.is_available():
        from .placement import local_gpu_index

        return f"cuda:{local_gpu_index(1)}"
    return "cpu"


class RewardWorker:
    models: dict[str, RewardModel]  # reward-model folder -> its scorer
    judges: dict[str, Judge]  # judge folder -> its scorer

    def __init__(
        self,
        reward,
        domain_key: str = "domain",
        policy_tokenizer: tuple[str | None, str | None] = (None, None),
        import_roots: Sequence[str | None] = (),
        driver_roll_lite: str | None = None,
        on_gpu: bool = False,
    ):
        """`reward`: the run's RewardConfig; `policy_tokenizer`: (model.tokenizer_path, model.chat_template),
        which the reward models compare their own with; `import_roots`: the directories the driver
        imported the user's reward modules from, searched after the installed packages; `on_gpu`: Ray
        gave this worker a GPU (workers/placement.py), where its reward models and judges then run."""
        for root in import_roots:
            # cast: RewardClient passes driver_roll_lite with import_roots, its only caller that has them
            enter_import_root(root, cast(str, driver_roll_lite))
        self.on_failure, self.domain_key = reward.on_failure, domain_key
        self.last_outcomes: list[list[tuple[str, float, str, str | None]]] = []
        self.routes = routes(reward)
        self.runner = RewardRunner(list(all_sources(reward, "functions")), reward.timeout_s)
        self.models, self.judges = {}, {}
        self.device = model_device(on_gpu)
        if models := all_sources(reward, "models"):
            from roll_lite.model.tokenizer import load_tokenizer
            from roll_lite.rewards.reward_model import RewardModel

            tokenizer = load_tokenizer(*policy_tokenizer)
            self.models = {
                path: RewardModel(
                    path,
                    tokenizer,
                    reward.model_max_tokens,
                    reward.model_normalize,
                    reward.model_clip,
                    self.device,
                    reward.model_timeout_s,
                )
                for path in models
            }
        if judges := all_sources(reward, "judges"):
            from roll_lite.rewards.judge import Judge

            self.judges = {
                path: Judge(
                    path,
                    reward.judge_template,
                    reward.judge_parser,  # imported and called in the judge's guarded process
                    reward.judge_max_new_tokens,
                    timeout_s=reward.judge_timeout_s,
                    device=self.device,
                    engine=reward.judge_engine,
                    gpu_memory_utilization=reward.judge_gpu_memory_utilization,
                    user_code_timeout_s=reward.timeout_s,
                )
                for path in judges
            }
        self.code: CodeReward | None = None
        if uses_code(reward):
            from roll_lite.rewards.code import CodeReward

            self.code = CodeReward(reward)  # starts the sandbox pool and proves it isolates

    def where(self) -> dict:
        from .placement import where_am_i

        return where_am_i()

    def describe(self) -> list[str]:
        """A line per reward model (how it sees the text) and per judge, where they run, and the routing."""
        sources = cast(
            "list[RewardModel | Judge | CodeReward]",  # cast: mypy joins the three kinds to object
            [*self.models.values(), *self.judges.values()] + ([self.code] if self.code else []),
        )
        lines = [source.describe() for source in sources]
        if self.models or self.judges:
            lines.append(f"reward models and judges on {self.device}")
        if None not in self.routes:
            lines.append(
                "rewards routed by data."
                + self.domain_key
                + ": "
                + "; ".join(
                    f"{domain}: {', '.join(name for name, _, _, _ in self._sources(sources))}"
                    for domain, sources in self.routes.items()
                )
            )
        return lines

    def score(
        self,
        responses: list[str],
        answers: list[str],
        extras: list[dict] | None = None,
        prompts: list | None = None,
        sequences: list[list[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(scores [rows], scored [rows] bool: every source gave that row a score, metrics).
        reward/<name> is the source's mean over the rows it scored; reward/<name>/<kind> counts the
        rows it did not score, by kind; reward/unscored counts the rows some source did not score.
        The reward models and judges also read each row's prompt (a string or chat messages) and its
        token ids (prompt + response, the policy's tokenizer)."""
        extras = [{} for _ in responses] if extras is None else [dict(e or {}) for e in extras]
        if not len(responses) == len(answers) == len(extras):
            raise ValueError(f"reward: {len(responses)} responses, {len(answers)} answers, {len(extras)} extras")
        if (self.models or self.judges) and (prompts is None or sequences is None):
            raise ValueError("reward: the reward models and judges need each row's prompt and token ids")
        columns: dict[str, list[Any] | None] = dict(
            responses=responses, answers=answers, extras=extras, prompts=prompts, sequences=sequences
        )
        # keys: None without routing, else the domains (cast: then every route is a domain)
        parts: dict[Any, list[int]] = (
            {None: list(range(len(responses)))}
            if None in self.routes  # no routing: every row, no prefix
            else rows_by_domain(extras, self.domain_key, cast("dict[str, Sources]", self.routes))
        )
        parts = {domain: rows for domain, rows in parts.items() if domain is None or rows}
        subsets = {
            domain: {key: None if value is None else [value[i] for i in rows] for key, value in columns.items()}
            for domain, rows in parts.items()
        }
        results = self._run_concurrently(subsets)
        total, scored = torch.zeros(len(responses)), torch.ones(len(responses), dtype=torch.bool)
        metrics, tallies = {}, {}
        for domain, rows in parts.items():
            prefix = "" if domain is None else f"{domain}/"
            part, part_scored, part_metrics, part_tallies = self._combine(results[domain], len(rows))
            total[rows], scored[rows] = part, part_scored
            metrics.update(
                {f"reward/{prefix}{key.removeprefix('reward/')}": value for key, value in part_metrics.items()}
            )
            if domain is not None:
                metrics[f"reward/{domain}/mean"] = part.mean().item()
            tallies.update({f"{prefix}{name}": tally for name, tally in part_tallies.items()})
        self._warn(tallies, len(responses), int((~scored).sum()))
        self.last_outcomes = [[] for _ in responses]
        for domain, rows in parts.items():
            for name, _, (outcomes, _) in results[domain]:
                for row, outcome in zip(rows, outcomes):
                    source = name if domain is None else f"{domain}/{name}"
                    self.last_outcomes[row].append((source, outcome.value, outcome.kind, outcome.reason))
        return total, scored, {**metrics, "reward/unscored": float((~scored).sum())}

    def outcomes(self) -> list[list[tuple[str, float, str, str | None]]]:
        """The last score() call's outcomes, per row: (source, score, kind, reason) of each of its sources
        (the traces, roll_lite/runtime/traces.py)."""
        return self.last_outcomes

    def _sources(self, sources: Sources) -> list[tuple[str, float, str, SourceCall]]:
        """(metric name, weight, scorer, a call on a column dict) of a route's sources; each call gives (a
        Score per row, the source's own counts for its metrics: the code source's program verdicts). The
        scorer names the object the call uses (the functions' runner, a model's or a judge's folder, the
        code pool): one thread each."""
        from roll_lite.rewards.judge import judge_metric_name
        from roll_lite.rewards.reward_model import model_metric_name

        named: list[tuple[str, float, str, SourceCall]] = [
            (
                name,
                weight,
                "functions",
                lambda c, name=name: (self.runner.score(name, c["responses"], c["answers"], c["extras"]), {}),
            )
            for name, weight in sources.functions.items()
        ]
        named += [
            (
                model_metric_name(path),
                weight,
                f"model {path}",
                lambda c, model=self.models[path]: (model.score(c["prompts"], c["responses"], c["sequences"]), {}),
            )
            for path, weight in sources.models.items()
        ]
        named += [
            (
                judge_metric_name(path),
                weight,
                f"judge {path}",
                lambda c, judge=self.judges[path]: (
                    judge.score(c["prompts"], c["responses"], c["answers"], c["extras"]),
                    {},
                ),
            )
            for path, weight in sources.judges.items()
        ]
        if sources.code:
            named.append(
                (
                    "code",
                    sources.code,
                    "code",  # cast: uses_code(reward) made self.code
                    lambda c: cast("CodeReward", self.code).score(c["responses"], c["extras"]),
                )
            )
        return named

    def _run_concurrently(self, subsets: dict) -> dict:
        """{domain: [(metric name, weight, (outcomes, counts)) per source, in the route's order]}: every
        (domain, source) call, one thread per scorer, each scorer's calls in domain order."""
        calls = [
            (domain, index, name, weight, scorer, run)
            for domain in subsets
            for index, (name, weight, scorer, run) in enumerate(self._sources(self.routes[domain]))
        ]
        by_scorer: dict[str, list] = {}
        for call in calls:
            by_scorer.setdefault(call[4], []).append(call)

        def run_all(scorer_calls):
            return [run(subsets[domain]) for domain, _, _, _, _, run in scorer_calls]

        if len(by_scorer) == 1:
            outputs = {scorer: run_all(scorer_calls) for scorer, scorer_calls in by_scorer.items()}
        else:
            with ThreadPoolExecutor(max_workers=len(by_scorer), thread_name_prefix="reward") as pool:
                futures = {scorer: pool.submit(run_all, scorer_calls) for scorer, scorer_calls in by_scorer.items()}
                outputs = {scorer: future.result() for scorer, future in futures.items()}
        done = {
            (call[0], call[1]): output
            for scorer, scorer_calls in by_scorer.items()
            for call, output in zip(scorer_calls, outputs[scorer])
        }
        return {
            domain: [(name, weight, done[(domain, index)]) for d, index, name, weight, _, _ in calls if d == domain]
            for domain in subsets
        }

    def _combine(
        self, results: list, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float], dict[str, Tally]]:
        """One domain's sources' outcomes, in the route's order: (weighted total, scored, metrics, tallies)."""
        total, scored = torch.zeros(rows, dtype=torch.float32), torch.ones(rows, dtype=torch.bool)
        metrics, tallies = {}, {}
        for name, weight, (outcomes, counts) in results:
            tally = tallies[name] = Tally()
            for outcome in outcomes:
                tally.add(outcome)
            values = torch.tensor([outcome.value for outcome in outcomes], dtype=torch.float32)
            ok = torch.tensor([outcome.ok for outcome in outcomes], dtype=torch.bool)
            total += float(weight) * values  # 0 where not ok
            scored &= ok
            metrics[f"reward/{name}"] = values[ok].mean().item() if ok.any() else 0.0
            metrics.update({f"reward/{name}/{kind}": float(tally.counts[kind]) for kind in KINDS if kind != "ok"})
            metrics.update({f"reward/{name}/{key}": value for key, value in counts.items()})
        return total, scored, metrics, tallies

    def _warn(self, tallies: dict[str, Tally], rows: int, unscored: int) -> None:
        if not unscored:
            return
        counts = "; ".join(
            f"{name}: "
            + ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in tally.counts.items() if kind != "ok" and n)
            for name, tally in tallies.items()
            if tally.not_ok
        )
        first = next(f"{name}: {tally.first_reason}" for name, tally in tallies.items() if tally.first_reason)
        then = (
            "scored 0 by those sources (reward.on_failure=zero)"
            if self.on_failure == "zero"
            else "taken out of the loss and their groups' baselines (reward.on_failure=drop)"
        )
        logger.warning("rewards: %d of %d responses unscored (%s), %s; first: %s", unscored, rows, counts, then, first)

    def close(self) -> None:
        self.runner.close()
        for judge in self.judges.values():
            judge.close()
        if self.code is not None:
            self.code.close()
