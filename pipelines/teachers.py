"""The teachers of on-policy distillation (distill.teacher, or distill.teachers by domain): one worker
group per teacher folder, placed like the reference and built by the same ModelWorker code (role
"teacher": log-probs, no optimizer), the teacher's folder as its `model`. Each row's domain (its
data.domain_key field) picks its teacher, so one batch mixes teachers.

The teacher scores the student's sampled tokens at the student's sampling temperature (the batch's
meta_info["temperature"], as every log-prob of the step). Its tokenizer must be the student's:
cross-tokenizer distillation is out of scope, and a difference stops the run before it starts.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, cast

import torch

from roll_lite.config import ConfigError, RunConfig
from roll_lite.data import DataProto, undo_permutation
from roll_lite.loss import distill_advantages

if TYPE_CHECKING:
    from roll_lite.workers.group import ModelGroup

logger = logging.getLogger("roll_lite")


class Teachers:
    def __init__(self, config: RunConfig):
        d = config.distill
        self.config, self.distill = config, d
        # domain -> folder; None: the one teacher of every row (cast: `of` makes Teachers only with one or the other)
        self.by_domain = cast("dict[str | None, str]", dict(d.teachers) if d.teachers else {None: d.teacher})
        self.folders = list(dict.fromkeys(self.by_domain.values()))
        self.groups: dict[str, ModelGroup] = {}  # folder -> ModelGroup (start())
        self.metrics: dict[str, float] = {}  # the last step's (scores(), advantages())

    @staticmethod
    def of(config: RunConfig) -> "Teachers | None":
        """The run's teachers, or None when it distils nothing."""
        return Teachers(config) if (config.distill.teacher or config.distill.teachers) else None

    @property
    def domains(self) -> list[str] | None:
        """The domains the teachers are routed by (every training row must name one), or None."""
        return None if None in self.by_domain else cast("list[str]", list(self.by_domain))

    def key(self, domain: str | None) -> str:
        return "distill.teacher" if domain is None else f"distill.teachers.{domain}"

    def check(self, tokenizer) -> None:
        """In the driver, before Ray: each teacher folder loads a tokenizer equal to the student's; for a
        vision-language student, a folder of its family whose vision token ids, patch sizes and image processor
        are the student's too (roll_lite/model/vision_teacher_folder.py)."""
        from roll_lite.model.tokenizer import load_tokenizer
        from roll_lite.model.vision_run import is_vision_model
        from roll_lite.model.vision_teacher_folder import teacher_difference

        vision = is_vision_model(self.config.model)  # then each teacher a vision-language folder (validation_vision)
        for domain, folder in self.by_domain.items():
            try:
                if vision:  # its config.json and processor read the student's ids and pixels alike, then its tokenizer
                    theirs, difference = teacher_difference(self.config.model, self.config.data, folder)
                else:
                    theirs, difference = load_tokenizer(folder), None
            except ValueError as error:
                message = str(error).removeprefix("model.tokenizer_path: ").removeprefix("model.pretrained_path: ")
                raise ConfigError(f"{self.key(domain)}: {message}") from None
            if difference is not None:  # a vision-language teacher that reads the ids or the pixels otherwise
                raise ConfigError(
                    f"{self.key(domain)}: the teacher ('{folder}') differs from the student: {difference}. It scores "
                    "the student's ids with the sample's images, so both need one tokenizer and processor"
                )
            difference = first_difference(tokenizer, theirs)
            if difference is not None:
                raise ConfigError(
                    f"{self.key(domain)}: the teacher's tokenizer ('{folder}') differs from the student's: "
                    f"{difference}. Distillation scores the student's token ids with the teacher, so both "
                    "need one tokenizer (cross-tokenizer distillation is not supported)"
                )

    def start(self, placement) -> None:
        """Each teacher's worker group, started and ready (blocks)."""
        from roll_lite.workers.group import ModelGroup

        for folder in self.folders:
            model = dataclasses.replace(self.config.model, pretrained_path=folder, tokenizer_path=folder)
            config = dataclasses.replace(self.config, model=model)
            # cast: load_config sets reference_dp (None in the dataclass: "as actor_dp on GPUs, else 1")
            self.groups[folder] = ModelGroup("teacher", cast(int, self.config.workers.reference_dp), placement, config)
        for group in self.groups.values():
            group.wait_ready()

    def describe(self) -> str:
        routes = "; ".join(f"{domain or 'every row'}: {folder}" for domain, folder in self.by_domain.items())
        d = self.distill
        loss = (
            f"KL {d.kl_estimator}(π_S‖π_T)"
            if d.signal == "reverse_kl"
            else f"the forward KL over the teacher's top {d.top_k}"
        )
        how = (
            f"advantage = {d.reward_weight:g}·A_task + {d.coef:g}·(log π_T − log π_S)"
            if d.signal == "advantage"
            else f"the policy loss on {d.reward_weight:g}·A_task + {d.coef:g} × {loss}"
        )
        return f"distillation: {how}; teachers by {self.config.data.domain_key}: {routes}"

    def scores(self, batch: DataProto) -> dict[str, torch.Tensor]:
        """Each row's teacher's view of its tokens (token-aligned, like the actor's): teacher_log_probs
        [rows, seq], and with distill.signal = top_k_forward_kl teacher_top_k_ids / teacher_top_k_log_probs
        [rows, seq, distill.top_k], the teacher's most likely next tokens."""
        start = time.perf_counter()
        asked = DataProto(batch.batch, batch.non_tensor_batch, dict(batch.meta_info))
        if self.distill.signal == "top_k_forward_kl":
            asked.meta_info["teacher_top_k"] = self.distill.top_k
        if len(self.folders) == 1:
            outputs = self.groups[self.folders[0]].compute_log_probs(asked)
        else:
            domain_key = self.config.data.domain_key
            folders = [self.by_domain[extra[domain_key]] for extra in batch.non_tensor_batch["extra"]]
            parts, order = [], []
            for folder, group in self.groups.items():
                rows = [i for i, chosen in enumerate(folders) if chosen == folder]
                if rows:
                    parts.append(group.compute_log_probs(asked.index_select(rows)))
                    order += rows
            outputs = undo_permutation(DataProto.concat(parts), order)
        seconds = time.perf_counter() - start
        self.metrics = {  # the teachers' cost: the whole of their pass, each token of prompt and response scored
            "perf/teacher_s": seconds,
            "teacher/tokens_per_s": float(batch["attention_mask"].sum()) / seconds,
            "teacher/peak_memory_gib": max(group.peak_memory_gib() for group in self.groups.values()),
        }
        return {
            f"teacher_{name}": outputs[name]
            for name in ("log_probs", "top_k_ids", "top_k_log_probs")
            if name in outputs.batch
        }

    def advantages(self, task_advantages: torch.Tensor, batch: DataProto, mask: torch.Tensor, actor) -> torch.Tensor:
        """distill.signal = advantage: reward_weight·A_task + coef·(log π_T − log π_S) with the sampling
        policy's log-probs (the old ones; computed here when the step has none), and the metric
        distill/reverse_kl (their k1 estimate per sampled token); reverse_kl: reward_weight·A_task (the KL
        is in the loss, reported as actor/distill_kl)."""
        d = self.distill
        if d.signal != "advantage":
            return d.reward_weight * task_advantages
        student = (
            batch["old_log_probs"] if "old_log_probs" in batch.batch else actor.compute_log_probs(batch)["log_probs"]
        )
        gap = torch.where(mask.bool(), student.double() - batch["teacher_log_probs"].double(), 0.0)
        self.metrics["distill/reverse_kl"] = (gap.sum() / mask.sum().clamp(min=1)).item()  # k1, per sampled token
        return distill_advantages(task_advantages, student, batch["teacher_log_probs"], mask, d.coef, d.reward_weight)


def first_difference(ours, theirs) -> str | None:
    """Where two tokenizers differ first (vocabulary by id, then the special tokens), or None."""
    mine, other = ours.get_vocab(), theirs.get_vocab()
    by_id_mine, by_id_other = {i: t for t, i in mine.items()}, {i: t for t, i in other.items()}
    for token_id in range(max(len(by_id_mine), len(by_id_other))):
        a, b = by_id_mine.get(token_id), by_id_other.get(token_id)
        if a != b:
            return f"token id {token_id} is {a!r} for the student and {b!r} for the teacher"
    for name in ("bos", "eos", "pad"):
        a, b = getattr(ours, f"{name}_token_id"), getattr(theirs, f"{name}_token_id")
        if a != b:
            return f"the {name} token id is {a} for the student and {b} for the teacher"
    return None
