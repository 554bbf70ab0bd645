"""On-policy distillation (roll_lite/loss/distill.py, pipelines/teachers.py): the advantage's formula,
teachers routed by domain, the start-up checks (a teacher's tokenizer, a domain without a teacher),
and the docs' command end to end with a teacher folder, for both signals. The reverse-KL loss is in the
exactness matrix (tests/test_exactness.py)."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import doc_commands
from roll_lite.config import ConfigError, load_config
from roll_lite.data import DataProto
from roll_lite.loss import distill_advantages
from roll_lite.model.modeling import build_causal_lm
from roll_lite.model.tokenizer import build_char_tokenizer

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2", "model.num_attention_heads=2",
        "model.num_key_value_heads=1", "workers.torch_threads=1"]


def save_teacher(folder: Path, seed: int = 1, hidden: int = 32) -> Path:
    tokenizer = build_char_tokenizer()
    lm = build_causal_lm(dict(model_type="qwen2", vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                              max_position_embeddings=64), seed=seed)
    lm.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


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
            outputs.update(top_k_ids=torch.arange(shape[-1]).expand(shape), top_k_log_probs=torch.full(shape, self.value))
        return DataProto(outputs)


def test_each_row_is_scored_by_its_domains_teacher():
    from roll_lite.pipelines.teachers import Teachers

    config = load_config(REPO / "configs/grpo.yaml", ["distill.teachers={math: /m, code: /c, chat: /m}"])
    teachers = Teachers(config)
    assert teachers.folders == ["/m", "/c"] and sorted(teachers.domains) == ["chat", "code", "math"]
    teachers.groups = {"/m": FakeTeacher(-1.0), "/c": FakeTeacher(-2.0)}
    domains = ["code", "math", "chat", "code", "math"]
    batch = DataProto({"input_ids": torch.zeros(5, 3, dtype=torch.long)},
                      {"extra": [{"domain": d} for d in domains]})
    log_probs = teachers.scores(batch)["teacher_log_probs"]
    assert log_probs[:, 0].tolist() == [-2.0, -1.0, -1.0, -2.0, -1.0]
    assert teachers.groups["/m"].calls == [3] and teachers.groups["/c"].calls == [2]  # one call per teacher
    assert "teacher_top_k" not in batch.meta_info  # the teachers' pass asks for it, the batch the actor trains on not
    teachers.distill.signal, teachers.distill.top_k = "top_k_forward_kl", 2
    scores = teachers.scores(batch)
    assert scores["teacher_top_k_ids"].shape == (5, 3, 2) and scores["teacher_top_k_log_probs"][:, 0, 0].tolist() == [
        -2.0, -1.0, -1.0, -2.0, -1.0]
    assert "teacher_top_k" not in batch.meta_info


def test_a_teacher_with_another_tokenizer_is_refused_naming_the_first_difference(tmp_path):
    from roll_lite.pipelines.teachers import Teachers

    folder = save_teacher(tmp_path / "teacher")
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    config = load_config(REPO / "configs/grpo.yaml", [f"distill.teacher={folder}"])
    with pytest.raises(ConfigError, match=r"distill.teacher: the teacher's tokenizer .* differs from the student's: token id "
                                          r"\d+ is 'a' for the student and 'b' for the teacher"):
        Teachers(config).check(build_char_tokenizer())
    Teachers(load_config(REPO / "configs/grpo.yaml", [f"distill.teacher={save_teacher(tmp_path / 'same')}"])).check(
        build_char_tokenizer())


@pytest.mark.parametrize("overrides, message", [
    (["distill.teacher=/t", "distill.teachers={a: /t}"], "distill.teachers: set distill.teacher .* or distill.teachers"),
    (["distill.teachers={a: /t}", "reward.domains={a: {functions: {exact_answer: 1.0}}, b: {functions: {exact_answer: 1.0}}}"],
     "distill.teachers: has no teacher for domain.s. b, which reward.domains names"),
    (["distill.teacher=/t", "distill.signal=forward_kl"],
     "distill.signal: 'forward_kl' is not one of advantage, reverse_kl, top_k_forward_kl"),
    (["distill.teacher=/t", "distill.top_k=0"], "distill.top_k: must be >= 1"),
    (["distill.teacher=/t", "distill.coef=0"], "distill.coef: must be > 0"),
])
def test_distill_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs/grpo.yaml", overrides)


def roll_train(argv, cwd):
    result = subprocess.run([sys.executable, "-m", "roll_lite.cli", *argv[1:]], capture_output=True, text=True,
                            timeout=600, cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.parametrize("signal", ["advantage", "reverse_kl", "top_k_forward_kl"])
def test_the_docs_distill_command_trains_the_student_on_its_teacher(tmp_path, signal):
    for name in ("configs", "data"):
        (tmp_path / name).symlink_to(REPO / name)
    teacher = save_teacher(tmp_path / "outputs/grpo_reverse_digits/final")  # where the docs' first command puts it
    (line,) = doc_commands.commands("roll-train", "configs/distill.yaml")
    result = roll_train(shlex.split(line) + TINY + [
        "sft.steps=0", "steps=2", "eval_every=2", "rollout.prompts_per_step=2", "rollout.num_samples=2",
        f"distill.signal={signal}", "distill.kl_estimator=k3", "distill.top_k=4"], tmp_path)
    assert "distillation: " in result.stderr and "every row: outputs/grpo_reverse_digits/final" in result.stderr
    records = [json.loads(line) for line in (tmp_path / "outputs/distill_reverse_digits/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] >= 1]
    assert len(steps) == 2 and all(r["actor/grad_norm"] > 0 for r in steps)
    if signal == "advantage":  # a random teacher and student: the sampled tokens' log-ratio is far from 0
        assert all(abs(r["distill/reverse_kl"]) > 1e-3 for r in steps)
    elif signal == "reverse_kl":
        assert all(r["actor/distill_kl"] > 0 and r["actor/distill_loss"] > 0 for r in steps)  # k3 ≥ 0
    else:  # over the teacher's top 4 only (not renormalised), so of either sign, but never 0 here
        assert all(r["actor/distill_kl"] != 0 and r["actor/distill_loss"] != 0 for r in steps)
    assert teacher.is_dir()


def test_the_comparison_example_stages_are_valid_configs(monkeypatch):
    # examples/distill/compare.py ran for docs/distillation.md (~15 min); here its stages load as configs.
    sys.path.insert(0, str(REPO / "examples/distill"))
    import compare

    monkeypatch.chdir(REPO)
    for teacher in (None, "outputs/some/final"):
        for name, arguments in compare.stages(teacher).items():
            config = load_config(REPO / arguments[1], arguments[2:])
            assert config.run_name.startswith("distill_"), name
            if name in ("opd", "grpo", "mixed"):  # the same student: width, start and steps
                assert (config.model.hidden_size, config.steps, config.sft.steps) == (64, 200, 0)


def test_a_multi_turn_run_distils_on_the_models_own_tokens(tmp_path):
    # The teacher scores the trajectory; the advantage counts model_mask's tokens only (distill_advantages
    # above zeroes the rest), so the environment's tokens never enter.
    for name in ("configs", "data"):
        (tmp_path / name).symlink_to(REPO / name)
    teacher = save_teacher(tmp_path / "teacher")
    roll_train(["roll-train", "--config", "configs/multiturn.yaml", f"distill.teacher={teacher}", "steps=1", "sft.steps=0",
                "eval_every=100", *TINY], tmp_path)
    records = [json.loads(line) for line in (tmp_path / "outputs/multiturn_guess_the_number/metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in records if r["step"] == 1]
    assert step["distill/reverse_kl"] != 0 and step["actor/grad_norm"] > 0 and step["env/turns"] >= 1
