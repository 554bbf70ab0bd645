"""The sections of the pipelines beside RL (beyond_rl.py): sft.*, preference.* and distill.*."""

from __future__ import annotations

from roll_lite.config.key_checks import check, file_list, one_of
from roll_lite.config.schema import DataConfig, PreferenceConfig, RunConfig, SFTConfig
from roll_lite.loss import DISTILL_SIGNALS, PAIR_LOSSES


def validate_sft(sft: SFTConfig) -> None:
    sft.train_files = file_list(sft.train_files, "sft.train_files")
    sft.eval_files = file_list(sft.eval_files, "sft.eval_files")
    check(sft.steps >= 0, "sft.steps", f"must be >= 0, got {sft.steps}")
    check(sft.batch_size >= 1, "sft.batch_size", f"must be >= 1, got {sft.batch_size}")
    check(sft.lr > 0, "sft.lr", f"must be > 0, got {sft.lr}")
    check(sft.eval_every >= 1, "sft.eval_every", f"must be >= 1, got {sft.eval_every}")
    check(bool(sft.prompt_key), "sft.prompt_key", "must name the prompt (or conversation) column")
    check(
        sft.response_key != sft.prompt_key, "sft.response_key", f"must differ from sft.prompt_key ('{sft.prompt_key}')"
    )
    check(
        sft.max_length is None or sft.max_length >= 2,
        "sft.max_length",
        f"must be >= 2 or null (no limit), got {sft.max_length}",
    )
    check(sft.epochs is None or sft.epochs >= 1, "sft.epochs", f"must be >= 1 or null (unbounded), got {sft.epochs}")
    check(
        not sft.steps or bool(sft.train_files) or sft.from_data_source,
        "sft.train_files",
        f"sft.steps={sft.steps} needs training files (the warm start's or the SFT pipeline's data), or "
        "sft.from_data_source=true with a data.source",
    )


def validate_sft_source(sft: SFTConfig, data: DataConfig) -> None:
    """sft.from_data_source: the rows are data.source's training rows, rendered as the RL prompts are."""
    if not sft.from_data_source:
        return
    check(
        data.source is not None,
        "sft.from_data_source",
        "takes the rows of data.source, and data.source is null (name a source, or give sft.train_files)",
    )
    check(
        not sft.train_files,
        "sft.train_files",
        "must be empty with sft.from_data_source=true (the rows come from data.source)",
    )
    check(
        sft.apply_chat_template == data.apply_chat_template,
        "sft.apply_chat_template",
        f"must equal data.apply_chat_template ({data.apply_chat_template}) with sft.from_data_source=true: the "
        "SFT prompts are rendered as the RL prompts are",
    )


def validate_preference(p: PreferenceConfig) -> None:
    p.train_files = file_list(p.train_files, "preference.train_files")
    p.eval_files = file_list(p.eval_files, "preference.eval_files")
    for key in ("steps", "batch_size", "eval_every"):
        check(getattr(p, key) >= 1, f"preference.{key}", f"must be >= 1, got {getattr(p, key)}")
    check(p.lr > 0, "preference.lr", f"must be > 0, got {p.lr}")
    seen: dict[str, str] = {}  # column -> the key that names it
    for key in ("prompt_key", "chosen_key", "rejected_key", "margin_key"):
        column = getattr(p, key)
        check(key == "margin_key" or bool(column), f"preference.{key}", "must name a column")
        check(
            column is None or column not in seen,
            f"preference.{key}",
            f"'{column}' is also preference.{seen.get(column)}",
        )
        seen[column] = key
    check(
        p.max_length is None or p.max_length >= 2,
        "preference.max_length",
        f"must be >= 2 or null (no limit), got {p.max_length}",
    )
    check(p.epochs is None or p.epochs >= 1, "preference.epochs", f"must be >= 1 or null (unbounded), got {p.epochs}")
    one_of(p.loss, PAIR_LOSSES, "preference.loss")
    one_of(p.reference, ("worker", "precomputed"), "preference.reference")
    check(p.beta > 0, "preference.beta", f"must be > 0, got {p.beta}")
    check(0 <= p.label_smoothing < 0.5, "preference.label_smoothing", f"must be in [0, 0.5), got {p.label_smoothing}")
    check(not p.label_smoothing or p.loss != "ipo", "preference.label_smoothing", "applies to dpo and simpo, not ipo")
    check(p.nll_coef >= 0, "preference.nll_coef", f"must be >= 0, got {p.nll_coef}")
    check(p.center_coef >= 0, "preference.center_coef", f"must be >= 0, got {p.center_coef}")


def validate_distill(config: RunConfig) -> None:
    """The teachers' keys; their folders and tokenizers are checked in the driver (pipelines/teachers.py)."""
    d = config.distill
    check(
        not (d.teacher and d.teachers),
        "distill.teachers",
        "set distill.teacher (one teacher for every row) or distill.teachers (one per domain), not both",
    )
    if not (d.teacher or d.teachers):
        return
    one_of(d.signal, DISTILL_SIGNALS, "distill.signal")
    one_of(d.kl_estimator, ("k1", "k2", "k3"), "distill.kl_estimator")
    check(
        not (d.signal == "reverse_kl" and d.kl_estimator == "k1"),
        "distill.kl_estimator",
        "k1 as a loss has zero expected gradient on the student's own samples (E[∇ log π_S] = 0), so it would "
        "not train; use k2 (its gradient is the reverse KL's), k3, or distill.signal=advantage (k1 as the advantage)",
    )
    check(d.coef > 0, "distill.coef", f"must be > 0, got {d.coef}")
    check(d.reward_weight >= 0, "distill.reward_weight", f"must be >= 0 (0: pure distillation), got {d.reward_weight}")
    check(d.top_k >= 1, "distill.top_k", f"must be >= 1, got {d.top_k}")
    for domain, folder in d.teachers.items():
        check(
            isinstance(folder, str) and bool(folder),
            f"distill.teachers.{domain}",
            f"must be a teacher folder, got {folder!r}",
        )
    routed = list(config.reward.domains) or list(config.data.domain_weights)
    missing = [domain for domain in routed if d.teachers and domain not in d.teachers]
    check(
        not missing,
        "distill.teachers",
        f"has no teacher for domain(s) {', '.join(missing)}, which "
        f"{'reward.domains' if config.reward.domains else 'data.domain_weights'} names",
    )
    check(
        not (d.teachers and config.environment.name is not None),
        "distill.teachers",
        "teachers by domain are for single-turn runs; a multi-turn run (environment.name) takes one distill.teacher",
    )
