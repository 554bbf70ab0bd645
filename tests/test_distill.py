"""On-policy distillation (roll_lite/loss/distill.py, pipelines/teachers.py): the advantage's formula,
teachers routed by domain, the start-up checks (a teacher's tokenizer, a domain without a teacher),
and the docs' command end to end with a teacher folder, for both signals. The reverse-KL loss is in the
exactness matrix (tests/test_exactness.py)."""

import json
import shlex
import sys
from pathlib import Path

import doc_commands
import pyarrow.parquet as pq
import pytest
import torch
from warm_driver import roll_train

from roll_lite.config import ConfigError, load_config
from roll_lite.data import DataProto
from roll_lite.loss import distill_advantages
from roll_lite.model.modeling import build_causal_lm
from roll_lite.model.tokenizer import build_char_tokenizer

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "workers.torch_threads=1",
]


def save_teacher(folder: Path, seed: int = 1, hidden: int = 32) -> Path:
    tokenizer = build_char_tokenizer()
    lm = build_causal_lm(
        dict(
            model_type="qwen2",
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
        ),
        seed=seed,
    )
    lm.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_as_a_loss_k2_follows_the_reverse_kl_k3_the_forward_kl_and_k1_nothing():
    # The exact expectation over the student's own next token of ∇ estimator(log π_S(x), log π_T(x)),
    # against autograd of the KLs themselves: why distill.kl_estimator refuses k1 for reverse_kl.
    from roll_lite.loss.kl import kl_penalty

    generator = torch.Generator().manual_seed(0)
    teacher = torch.log_softmax(torch.randn(7, generator=generator, dtype=torch.float64), -1)
    logits = torch.randn(7, generator=generator, dtype=torch.float64)

    def gradient(objective):
        theta = logits.clone().requires_grad_()
        objective(torch.log_softmax(theta, -1)).backward()
        return theta.grad

    def expected_gradient(estimator):  # Σ_x π_S(x) ∇ k(x), the sampled token's weight held fixed
        return gradient(lambda student: (student.exp().detach() * kl_penalty(student, teacher, estimator)).sum())

    reverse = gradient(lambda student: (student.exp() * (student - teacher)).sum())
    forward = gradient(lambda student: (teacher.exp() * (teacher - student)).sum())
    assert torch.allclose(expected_gradient("k2"), reverse, atol=1e-12) and reverse.abs().max() > 0.1
    assert torch.allclose(expected_gradient("k3"), forward, atol=1e-12) and forward.abs().max() > 0.1
    assert expected_gradient("k1").abs().max() < 1e-12


def test_on_policy_the_advantage_signal_and_the_k2_loss_give_one_gradient():
    # At ratio 1 (the step's own samples) PPO's gradient on A = coef·(log π_T − log π_S) is coef·(log π_S −
    # log π_T)·∇log π_S token by token, which is k2's: the two signals differ only off-policy.
    from roll_lite.loss import ppo_policy_loss_func, reverse_kl_loss_func
    from roll_lite.loss.checker import random_rl_batch

    data = random_rl_batch(seed=3)
    mask = data["response_mask"]
    data.meta_info.update(
        batch_num_tokens={"response_mask": mask.sum().double()},
        global_valid_samples={"response_mask": (mask.sum(-1) > 0).sum().double()},
    )
    data.batch["teacher_log_probs"] = data["ref_log_probs"]
    task = data["advantages"].clone()

    def gradient(loss_func, advantages):
        data.batch["advantages"] = advantages
        log_probs = data["old_log_probs"].clone().requires_grad_()
        loss_func(data, {"log_probs": log_probs})[0].backward()
        return log_probs.grad

    ppo = ppo_policy_loss_func("token-mean")
    through_advantage = gradient(
        ppo,
        distill_advantages(task, data["old_log_probs"], data["teacher_log_probs"], mask, coef=0.5, reward_weight=1.0),
    )
    through_loss = gradient(reverse_kl_loss_func(ppo, "token-mean", coef=0.5, estimator="k2"), task)
    assert torch.allclose(through_advantage, through_loss, atol=1e-15) and through_loss.abs().max() > 1e-3


def test_advantage_is_the_teachers_log_ratio_plus_the_weighted_task_advantage():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]])
    task = torch.tensor([[9.0, 1.0, 1.0, 9.0], [9.0, 9.0, -2.0, -2.0]])
    student = torch.tensor([[0.0, -1.0, -2.0, float("nan")], [0.0, 0.0, -0.5, -0.1]])
    teacher = torch.tensor([[0.0, -0.5, -3.0, 0.0], [float("inf"), 0.0, -0.5, -1.1]])
    advantages = distill_advantages(task, student, teacher, mask, coef=2.0, reward_weight=0.5)
    expected = torch.tensor([[0.0, 0.5 + 1.0, 0.5 - 2.0, 0.0], [0.0, 0.0, -1.0 + 0.0, -1.0 - 2.0]])
    assert torch.equal(advantages, expected)  # exact zeros (no nan, no inf) outside the mask


class FakeTeacher:
    """A teacher group whose log-probs are its own constant, so the test sees which teacher scored a row."""

    def __init__(self, value):
        self.value, self.calls = value, []

    def compute_log_probs(self, batch):
        self.calls.append(len(batch))
        outputs = {"log_probs": torch.full(batch["input_ids"].shape, self.value)}
        if batch.meta_info.get("teacher_top_k"):  # its top k: ids 0..k-1, each at its constant
            shape = (*batch["input_ids"].shape, batch.meta_info["teacher_top_k"])
            outputs.update(
                top_k_ids=torch.arange(shape[-1]).expand(shape), top_k_log_probs=torch.full(shape, self.value)
            )
        return DataProto(outputs)

    def peak_memory_gib(self):
        return self.value + 3.0


def test_each_row_is_scored_by_its_domains_teacher():
    from roll_lite.pipelines.teachers import Teachers

    config = load_config(REPO / "configs/grpo.yaml", ["distill.teachers={math: /m, code: /c, chat: /m}"])
    teachers = Teachers(config)
    assert teachers.folders == ["/m", "/c"] and sorted(teachers.domains) == ["chat", "code", "math"]
    teachers.groups = {"/m": FakeTeacher(-1.0), "/c": FakeTeacher(-2.0)}
    domains = ["code", "math", "chat", "code", "math"]
    batch = DataProto(
        {"input_ids": torch.zeros(5, 3, dtype=torch.long), "attention_mask": torch.ones(5, 3, dtype=torch.long)},
        {"extra": [{"domain": d} for d in domains]},
    )
    log_probs = teachers.scores(batch)["teacher_log_probs"]
    assert log_probs[:, 0].tolist() == [-2.0, -1.0, -1.0, -2.0, -1.0]
    assert teachers.groups["/m"].calls == [3] and teachers.groups["/c"].calls == [2]  # one call per teacher
    assert "teacher_top_k" not in batch.meta_info  # the teachers' pass asks for it, the batch the actor trains on not
    assert teachers.metrics["teacher/peak_memory_gib"] == 2.0  # the larger teacher's
    assert teachers.metrics["teacher/tokens_per_s"] == 15 / teachers.metrics["perf/teacher_s"]  # 5 rows of 3 tokens
    teachers.distill.signal, teachers.distill.top_k = "top_k_forward_kl", 2
    scores = teachers.scores(batch)
    assert scores["teacher_top_k_ids"].shape == (5, 3, 2) and scores["teacher_top_k_log_probs"][:, 0, 0].tolist() == [
        -2.0,
        -1.0,
        -1.0,
        -2.0,
        -1.0,
    ]
    assert "teacher_top_k" not in batch.meta_info


def test_a_teacher_with_another_tokenizer_is_refused_naming_the_first_difference(tmp_path):
    from roll_lite.pipelines.teachers import Teachers

    folder = save_teacher(tmp_path / "teacher")
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    config = load_config(REPO / "configs/grpo.yaml", [f"distill.teacher={folder}"])
    with pytest.raises(
        ConfigError,
        match=r"distill.teacher: the teacher's tokenizer .* differs from the student's: token id "
        r"\d+ is 'a' for the student and 'b' for the teacher",
    ):
        Teachers(config).check(build_char_tokenizer())
    Teachers(load_config(REPO / "configs/grpo.yaml", [f"distill.teacher={save_teacher(tmp_path / 'same')}"])).check(
        build_char_tokenizer()
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["distill.teacher=/t", "distill.teachers={a: /t}"],
            "distill.teachers: set distill.teacher .* or distill.teachers",
        ),
        (
            [
                "distill.teachers={a: /t}",
                "reward.domains={a: {functions: {exact_answer: 1.0}}, b: {functions: {exact_answer: 1.0}}}",
            ],
            "distill.teachers: has no teacher for domain.s. b, which reward.domains names",
        ),
        (
            ["distill.teacher=/t", "distill.signal=forward_kl"],
            "distill.signal: 'forward_kl' is not one of advantage, reverse_kl, top_k_forward_kl",
        ),
        (["distill.teacher=/t", "distill.top_k=0"], "distill.top_k: must be >= 1"),
        (
            ["distill.teacher=/t", "distill.signal=reverse_kl", "distill.kl_estimator=k1"],
            r"distill.kl_estimator: k1 as a loss has zero expected gradient .* use k2",
        ),
        (["distill.teacher=/t", "distill.coef=0"], "distill.coef: must be > 0"),
    ],
)
def test_distill_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs/grpo.yaml", overrides)


# each signal's overrides: one run in the fully async mode (the teacher scores a batch whose rows began under
# older weights), on Ray; the others in one process (workers.backend=local: no Ray, bit for bit the same run)
LOCAL = "workers.backend=local"
OVERRIDES = {
    "advantage": [LOCAL],
    "reverse_kl": [LOCAL],
    "top_k_forward_kl": [
        "rollout.fully_async=true",
        "rollout.max_staleness=1",
        "algorithm.rollout_is=token",
        "workers.backend=ray",
    ],
}


@pytest.mark.parametrize("signal", ["advantage", "reverse_kl", "top_k_forward_kl"])
def test_the_docs_distill_command_trains_the_student_on_its_teacher(tmp_path, signal):
    for name in ("configs", "data"):
        (tmp_path / name).symlink_to(REPO / name)
    teacher = save_teacher(tmp_path / "outputs/grpo_reverse_digits/final")  # where the docs' first command puts it
    (line,) = doc_commands.commands("roll-train", "configs/distill.yaml")
    result = roll_train(
        shlex.split(line)
        + TINY
        + [
            "sft.steps=0",
            "steps=2",
            "eval_every=2",
            "rollout.prompts_per_step=2",
            "rollout.num_samples=2",
            f"distill.signal={signal}",
            "distill.kl_estimator=k3",
            "distill.top_k=4",
            *OVERRIDES[signal],
        ],
        tmp_path,
    )
    assert "distillation: " in result.stderr and "every row: outputs/grpo_reverse_digits/final" in result.stderr
    records = [
        json.loads(line)
        for line in (tmp_path / "outputs/distill_reverse_digits/metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in records if r["step"] >= 1]
    assert len(steps) == 2 and all(r["actor/grad_norm"] > 0 for r in steps)
    # the fully async run's second batch began under the first step's weights, and its teacher scored it all
    fully_async = "rollout.fully_async=true" in OVERRIDES[signal]
    assert [r["rollout/staleness"] for r in steps] == ([0, 1] if fully_async else [0, 0])
    for r in steps:  # the teacher's cost: its pass is part of preparing the step; a CPU process holds > 0.1 GiB
        assert 0 < r["perf/teacher_s"] < r["perf/prepare_s"] and r["teacher/tokens_per_s"] > 0
        assert r["teacher/peak_memory_gib"] > 0.1
    if signal == "advantage":  # a random teacher and student: the sampled tokens' log-ratio is far from 0
        assert all(abs(r["distill/reverse_kl"]) > 1e-3 for r in steps)
    elif signal == "reverse_kl":
        assert all(r["actor/distill_kl"] > 0 and r["actor/distill_loss"] > 0 for r in steps)  # k3 ≥ 0
    else:  # over the teacher's top 4 only (not renormalised), so of either sign, but never 0 here
        assert all(r["actor/distill_kl"] != 0 and r["actor/distill_loss"] != 0 for r in steps)
    assert teacher.is_dir()
    traces = pq.read_table(tmp_path / "outputs/distill_reverse_digits/traces").to_pylist()  # docs/traces.md
    assert len(traces) == 8 and all(
        len(r["teacher_log_probs"]) == len(r["response_ids"]) and all(lp < 0 for lp in r["teacher_log_probs"])
        for r in traces
    )
    # each step's line shows the distillation KL, and in the fully async run the staleness (pipelines/run_log.py)
    kl = "distill/reverse_kl" if signal == "advantage" else "actor/distill_kl"
    lines = [line for line in result.stderr.splitlines() if " step " in line and "/2 | reward" in line]
    for r, line in zip(steps, lines, strict=True):
        assert f"| distill kl {r[kl]:.3g} |" in line, line
        assert ("| staleness " in line) == fully_async, line


def test_the_comparison_example_stages_are_valid_configs(monkeypatch):
    # examples/distill/compare.py ran for docs/distillation.md (~15 min); here its stages load as configs.
    sys.path.insert(0, str(REPO / "examples/distill"))
    import compare

    monkeypatch.chdir(REPO)
    for teacher in (None, "outputs/some/final"):
        for name, arguments in compare.stages(teacher).items():
            config = load_config(REPO / arguments[1], arguments[2:])
            assert config.run_name.startswith("distill_"), name
            if name in ("opd", "rkl", "topk", "grpo", "mixed"):  # the same student: width, start and steps
                assert (config.model.hidden_size, config.steps, config.sft.steps) == (64, 200, 0)


def test_a_multi_turn_run_distils_on_the_models_own_tokens(tmp_path):
    # The teacher scores the trajectory; the advantage counts model_mask's tokens only (distill_advantages
    # above zeroes the rest), so the environment's tokens never enter.
    for name in ("configs", "data"):
        (tmp_path / name).symlink_to(REPO / name)
    teacher = save_teacher(tmp_path / "teacher")
    roll_train(
        [
            "roll-train",
            "--config",
            "configs/multiturn.yaml",
            f"distill.teacher={teacher}",
            "steps=1",
            "sft.steps=0",
            "eval_every=100",
            *TINY,
            LOCAL,
        ],
        tmp_path,
    )
    records = [
        json.loads(line)
        for line in (tmp_path / "outputs/multiturn_guess_the_number/metrics.jsonl").read_text().splitlines()
    ]
    (step,) = [r for r in records if r["step"] == 1]
    assert step["distill/reverse_kl"] != 0 and step["actor/grad_norm"] > 0 and step["env/turns"] >= 1
