"""The config sections of the pipelines beside RL: SFT (its pipeline and RL's warm start), preference
pairs (the reward-model and DPO pipelines), and the teachers of on-policy distillation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class SFTConfig:
    """Supervised fine-tuning (roll_lite/data/sft.py): the SFT pipeline (configs/sft.yaml), or, in an RL
    config, a warm start of `steps` SFT steps on the actor before RL (0: none)."""

    train_files: Any = field(default_factory=list)  # a path or a list of paths (formats as data.train_files)
    eval_files: Any = field(default_factory=list)  # for eval/sft_loss (the SFT pipeline)
    from_data_source: bool = False  # rows from data.source, not files: its training rows (never the held-out ones),
    # each RL prompt rendered as RL renders it, with the package's reference answer as the response
    prompt_key: str = "prompt"  # a string, or chat messages
    response_key: Optional[str] = "response"  # the target string; null: prompt_key holds whole conversations,
    # and the loss is on every assistant turn
    apply_chat_template: bool = False  # render string prompts + responses with the chat template (messages always are)
    max_length: Optional[int] = None  # longer sequences (in tokens) are left out, counted and logged; null: no limit
    shuffle: bool = True  # a new seeded order of the rows every epoch (seed: data.seed)
    epochs: Optional[int] = None  # passes over the training rows; null: unbounded (steps decides)
    steps: int = 0  # optimizer steps (the SFT pipeline needs >= 1)
    batch_size: int = 64  # sequences per step; the loss is the mean over all their target tokens
    lr: float = 2e-3  # the SFT steps' learning rate (the warm start's too; RL then uses actor.lr)
    eval_every: int = 100  # the SFT pipeline: eval/sft_loss every this many steps and at the end


@dataclass
class PreferenceConfig:
    """Preference pairs (roll_lite/data/pairs.py) for the reward-model pipeline (configs/reward_model.yaml,
    Bradley–Terry) and the DPO pipeline (configs/dpo.yaml): rows of a prompt, a chosen and a rejected response."""

    train_files: Any = field(default_factory=list)  # a path or a list of paths (formats as data.train_files)
    eval_files: Any = field(default_factory=list)  # held-out pairs: accuracy and margins every eval_every steps
    prompt_key: str = "prompt"  # a string, or chat messages
    chosen_key: str = "chosen"  # the preferred response: a string, or the assistant's message(s)
    rejected_key: str = "rejected"  # the other response, same form as chosen
    margin_key: Optional[str] = None  # the reward model: a column of per-pair margins m in −log σ(s_c − s_r − m)
    apply_chat_template: bool = False  # render string prompts + responses with the chat template (messages always are)
    max_length: Optional[int] = None  # pairs whose longer side has more tokens are left out, counted and logged
    shuffle: bool = True  # a new seeded order of the pairs every epoch (seed: data.seed)
    epochs: Optional[int] = None  # passes over the training pairs; null: unbounded (steps decides)
    steps: int = 100  # optimizer steps
    batch_size: int = 32  # pairs per step; each loss is the mean over the step's pairs
    lr: float = 1e-3  # learning rate (the actor's optimizer settings otherwise)
    eval_every: int = 20  # held-out metrics every this many steps and at the end
    loss: str = "dpo"  # the DPO pipeline: dpo | ipo | simpo (the reward-model pipeline: Bradley–Terry)
    beta: float = 0.1  # DPO / IPO / SimPO: the inverse temperature β of the implicit reward
    label_smoothing: float = 0.0  # dpo, simpo: conservative DPO's ε, the chance that a label is flipped
    nll_coef: float = 0.0  # dpo, ipo, simpo: + this × the chosen responses' token-mean NLL (RPO)
    simpo_gamma: float = 0.5  # simpo: the target margin γ
    # dpo, ipo: worker = the reference's log-probs for each step's pairs (a reference worker; with LoRA the
    # actor with its adapters off); precomputed = one pass over all pairs before step 1, kept in checkpoints
    reference: str = "worker"
    center_coef: float = 0.0  # the reward model: + this × (s_c + s_r)² per pair, which centres scores on zero


@dataclass
class DistillConfig:
    """On-policy distillation in the RL pipelines (roll_lite/loss/distill.py, docs/distillation.md): a
    teacher scores every token the student sampled, at the student's sampling temperature, on the
    tokens the losses train on (environment and tool tokens never count)."""

    teacher: Optional[str] = None  # a local causal-LM folder: the teacher of every row
    # or one teacher per domain: the row's data.domain_key field picks it ({domain: folder}); a domain the
    # data or reward.domains names without a teacher here stops the run before it starts
    teachers: dict[str, str] = field(default_factory=dict)
    # advantage: A_t = reward_weight·A_task + coef·(log π_T − log π_S) of the sampled token, through the
    # policy loss (algorithm.policy_loss, with its clipping and rollout corrections);
    # reverse_kl: the policy loss on reward_weight·A_task, + coef × the KL(π_S‖π_T) estimate as a loss;
    # top_k_forward_kl: the same, with coef × Σ p_T·(log p_T − log p_S) over the teacher's top_k tokens
    signal: str = "advantage"
    coef: float = 1.0  # the teacher signal's weight
    reward_weight: float = 0.0  # the task reward's advantage, weighted in (0: pure distillation)
    # reverse_kl: k2 (its expected gradient is KL(π_S‖π_T)'s) or k3 (whose is KL(π_T‖π_S)'s) on the sampled
    # tokens (roll_lite/loss/kl.py); k1 is refused, its gradient as a loss has expectation 0
    kl_estimator: str = "k2"
    top_k: int = 16  # top_k_forward_kl: the teacher's most likely next tokens per position
