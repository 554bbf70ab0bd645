"""The image rows of the exactness matrix: a tiny float64 Qwen2.5-VL (vision tower trained, and once frozen)
trained by the real FSDP2 strategy in D ∈ {1, 2} gloo processes × A ∈ {1, 2} × padded / packed, and token-budget
micro-batches (at D = 2 the ranks run 2 and 1: a placeholder pass, which still runs the trainable vision tower),
on conversations with 0, 1 or 2 images of different sizes (vision_cases.py): the PPO loss in every agg mode, the
KL-regularised loss and a user's own loss_func give the loss and every gradient of one forward/backward of the
plain HF model over the padded global batch (sdpa attention, transformers' own M-RoPE ids), relative error
≤ 1e-10. Each micro-batch takes its own rows' images (roll_lite/strategy/vision_inputs.py) and the policy head
computes M-RoPE's three rows per sequence (roll_lite/model/vision.py, mrope_layout).

Qwen3-VL takes a subset of the same rows (QWEN3 below): its DeepStack features (added to the image tokens'
hidden states after the first decoder layers) and interleaved M-RoPE are checked the same way.

LoRA (LORA below): rank-2 adapters on every Linear layer of the language model (roll_lite/lora/vision.py), the
tower frozen with the base: the adapters' gradients, and no other, match peft's model over the global batch.

Sequence parallelism (SP below; roll_lite/model/vision_sp.py): at D = 1, S = 2 each rank merges the images into
the whole sequence and lays out its M-RoPE rows before keeping its slice; the loss and every gradient, the
tower's included (counted once: each rank's tower back-propagates the group's feature gradient / S), match too.

The critic (VALUE below; roll_lite/model/vision_heads.py): the value loss through FSDP2Strategy(head="value") at
D = 1 and 2, A = 2, packed (Qwen3-VL at D = 1, a LoRA critic at D = 2), and compute_values, match the plain HF
trunk's hidden states with the value head applied by hand; 1-D positions for the image tokens must miss.

Negative controls: each micro-batch's pixels laid out in the wrong row order, and 1-D positions for image
tokens (what transformers falls back to, silently), must miss; for Qwen3-VL, 1-D positions and DeepStack
features given to the wrong images' tokens (the main features right) must miss too. Image tokens stay out of every loss mask and
every count: a loss mask that covers one is an error."""

import pytest
from vision_cases import (
    MASK_KEYS,
    VisionCase,
    run_vision_strategy,
    value_reference,
    vision_batch,
    vision_lm,
    vision_reference,
)

from roll_lite.loss import AGG_MODES
from roll_lite.loss.checker import relative_deviation

SP_MODES = ("token-mean", "seq-mean-token-mean")
LOSSES = [("ppo", mode) for mode in AGG_MODES] + [("ppo_kl", "seq-mean-token-mean"), ("user", "token-mean")]
# D = 1: every loss on every strategy configuration; D = 2 (two processes, twice the CPU a case): every loss on
# two configurations, the KL-regularised and the user's loss on the other two.
CASES = [VisionCase(loss, mode, 1, a, mb) for a in (1, 2) for mb in ("padded", "packed") for loss, mode in LOSSES]
CASES += [VisionCase(loss, mode, 2, a, mb) for a, mb in ((1, "padded"), (2, "packed")) for loss, mode in LOSSES]
CASES += [VisionCase(loss, mode, 2, a, mb) for a, mb in ((2, "padded"), (1, "packed")) for loss, mode in LOSSES[4:]]
CASES += [VisionCase("ppo_kl", "token-mean", d, 1, "budget") for d in (1, 2)]
CASES += [VisionCase("ppo_kl", "token-mean", 2, 2, "packed", freeze_vision=True)]
# Qwen3-VL (DeepStack, interleaved M-RoPE): every loss at D = 1, A = 2 packed; padded once; at D = 2 packed, the
# token budget (a placeholder pass, its DeepStack mergers included) and the frozen tower
QWEN3 = dict(model_type="qwen3_vl")
CASES += [VisionCase(loss, mode, 1, 2, "packed", **QWEN3) for loss, mode in LOSSES]
CASES += [VisionCase("ppo", "token-mean", 1, 1, "padded", **QWEN3)]
CASES += [VisionCase(loss, mode, 2, 2, "packed", **QWEN3) for loss, mode in LOSSES[4:]]
CASES += [VisionCase("ppo_kl", "token-mean", 2, 1, "budget", **QWEN3)]
CASES += [VisionCase("ppo_kl", "token-mean", 2, 2, "packed", freeze_vision=True, **QWEN3)]
# LoRA on the language model (the tower frozen with the base): rank-2 adapters on every Linear layer of the LM
LORA = dict(freeze_vision=True, lora=True)
CASES += [VisionCase("ppo", "token-mean", d, 2, "packed", **LORA) for d in (1, 2)]
CASES += [VisionCase("ppo_kl", "seq-mean-token-mean", 2, 1, "padded", **LORA)]
CASES += [VisionCase("ppo", "token-mean", 1, 2, "packed", model_type="qwen3_vl", **LORA)]
# Sequence parallelism (vision_sp.py), D = 1, S = 2, in the D = 2 spawn's two processes: the PPO loss in two agg
# modes on three strategy configurations (A1 packed: the slices' boundary cuts an image's tokens, checked by
# hand), the frozen tower, Qwen3-VL (its DeepStack features sliced too)
SP = dict(sequence_parallel=2)
CASES += [
    VisionCase("ppo", m, 1, a, mb, **SP) for m in SP_MODES for a, mb in ((1, "packed"), (2, "packed"), (1, "padded"))
]
CASES += [VisionCase("ppo", "token-mean", 1, 1, "packed", freeze_vision=True, **SP)]
CASES += [VisionCase("ppo", m, 1, 1, "packed", model_type="qwen3_vl", **SP) for m in SP_MODES]
SP_NAIVE = [VisionCase("ppo", "token-mean", 1, 1, "packed", naive=naive, **SP) for naive in ("sp-columns", "sp-tower")]
# The critic (roll_lite/model/vision_heads.py): the value loss through FSDP2Strategy(head="value"), packed, at
# D = 1 and 2 (Qwen3-VL at D = 1), and its 1-D positions control; compute_values against the global forward
VALUE = [VisionCase("value", "token-mean", d, 2, "packed") for d in (1, 2)]
VALUE += [VisionCase("value", "token-mean", 1, 2, "packed", model_type="qwen3_vl")]
VALUE += [VisionCase("value", "token-mean", 2, 2, "packed", **LORA)]  # a LoRA critic: adapters and head train
VALUE_NAIVE = VisionCase("value", "token-mean", 1, 2, "packed", naive="1d")
NAIVE = [VisionCase("ppo", "token-mean", 1, 2, "packed", naive="pixels")]
NAIVE += [VisionCase("ppo", "token-mean", 2, 1, "padded", naive="1d")]
NAIVE += [VisionCase("ppo", "token-mean", 1, 2, "packed", naive=naive, **QWEN3) for naive in ("1d", "deepstack")]


@pytest.fixture(scope="module")
def strategy_results():
    return run_vision_strategy(CASES + NAIVE + SP_NAIVE + VALUE + [VALUE_NAIVE])


@pytest.fixture(scope="module")
def references():
    return {}


def case_key(case) -> tuple:
    return (case.loss, case.mode, case.freeze_vision, case.model_type, case.lora)


def errors(case, strategy_results, references) -> tuple[float, float]:
    key = case_key(case)
    if key not in references:
        references[key] = vision_reference(*key)
    (loss, grads, _), (ref_loss, ref_grads, _) = strategy_results[case], references[key]
    assert set(grads) == set(ref_grads), set(grads) ^ set(ref_grads)
    return relative_deviation(loss, ref_loss), max(relative_deviation(grads[n], ref_grads[n]) for n in ref_grads)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_step_with_images_equals_global_forward_backward(case, strategy_results, references):
    loss_error, grad_error = errors(case, strategy_results, references)
    assert loss_error <= 1e-10 and grad_error <= 1e-10, (loss_error, grad_error)
    grads = strategy_results[case][1]
    tower = [name for name in grads if name.startswith("model.visual.")]
    assert bool(tower) != case.freeze_vision  # trained: its gradients are checked; frozen: it has none
    if case.lora:  # the adapters alone train, every one of them on the language model
        assert grads and all(".lora_" in name and name.startswith("model.language_model.") for name in grads)
    if case.micro_batching == "budget" and case.world_size == 2:
        assert strategy_results[case][2] == 2


@pytest.mark.parametrize("case", NAIVE, ids=[c.id for c in NAIVE])
def test_misplaced_pixels_and_1d_positions_miss(case, strategy_results, references):
    """The check can fail: the same step with each micro-batch's pixels in the wrong order, with 1-D
    positions for the image tokens, or (Qwen3-VL) with the DeepStack features of each micro-batch's images in
    reverse order, misses the global batch's loss and gradient."""
    loss_error, grad_error = errors(case, strategy_results, references)
    assert loss_error > 1e-6 and grad_error > 1e-6, (loss_error, grad_error)


@pytest.mark.parametrize("world_size", [1, 2])
def test_log_probs_with_images_equal_the_global_forward(world_size, strategy_results, references):
    """compute_log_probs (the old-policy and reference pass) on rank 0's rows, packed: the global forward's."""
    key = ("ppo", "token-mean", False, "qwen2_5_vl", False)
    if key not in references:
        references[key] = vision_reference(*key)
    rows, log_probs = strategy_results[("log_probs", world_size)]
    expected = references[key][2][rows]
    assert log_probs.shape == expected.shape and (log_probs - expected).abs().max() <= 1e-12


def test_image_tokens_stay_out_of_loss_masks_and_counts():
    """No loss mask of the batch covers an image token (so no global count holds one); a mask that does
    is refused before the forward, naming the key."""
    from roll_lite.model.vision import VisionLMWithLogProbs
    from roll_lite.strategy import StrategyConfig
    from roll_lite.strategy.micro_batches import forward_micro_batch

    data = vision_batch()
    lm = vision_lm()
    image_tokens = data["input_ids"] == lm.config.image_token_id
    assert image_tokens.sum() == 4 + 3 + 1 + 2 + 4 + 4  # each image's tokens, expanded once
    assert not any((data[key].bool() & image_tokens).any() for key in ("response_mask", "kl_mask"))
    data.batch["response_mask"] = data["response_mask"] | image_tokens.long()
    data.meta_info["loss_mask_keys"] = MASK_KEYS["ppo"]
    with pytest.raises(ValueError, match=r"loss mask 'response_mask' covers 18 image token\(s\) \(first: row 0"):
        forward_micro_batch(VisionLMWithLogProbs(lm), data, StrategyConfig(), with_entropy=False)


@pytest.mark.parametrize("case", SP_NAIVE, ids=[c.id for c in SP_NAIVE])
def test_sequence_parallel_controls_miss(case, strategy_results, references):
    """The SP rows can fail: a rank's image tokens given the micro-batch's first features (the ids sliced
    before the merge) miss the loss and the gradient; the tower's gradient counted S times (the whole feature
    gradient back-propagated undivided on each rank) misses the tower's gradients only."""
    loss_error, grad_error = errors(case, strategy_results, references)
    assert grad_error > 1e-6, grad_error
    if case.naive == "sp-columns":
        assert loss_error > 1e-6, loss_error
    else:
        grads, ref_grads = strategy_results[case][1], references[case_key(case)][1]
        tower = max(relative_deviation(grads[n], ref_grads[n]) for n in ref_grads if n.startswith("model.visual."))
        lm = max(relative_deviation(grads[n], ref_grads[n]) for n in ref_grads if not n.startswith("model.visual."))
        assert loss_error <= 1e-10 and lm <= 1e-10 and abs(tower - 1.0) < 1e-6, (loss_error, lm, tower)


def test_log_probs_with_images_under_sequence_parallelism(strategy_results, references):
    """compute_log_probs at S = 2 (every row, packed, each split over the two ranks): the global forward's."""
    key = ("ppo", "token-mean", False, "qwen2_5_vl", False)
    if key not in references:
        references[key] = vision_reference(*key)
    log_probs, expected = strategy_results["log_probs_sp"], references[key][2]
    assert log_probs.shape == expected.shape and (log_probs - expected).abs().max() <= 1e-12


def value_errors(case, strategy_results, references) -> tuple[float, float]:
    key = ("value", case.model_type, case.lora)
    if key not in references:
        references[key] = value_reference(case.model_type, case.lora)
    (loss, grads, _), (ref_loss, ref_grads, _) = strategy_results[case], references[key]
    assert set(grads) == set(ref_grads), set(grads) ^ set(ref_grads)
    return relative_deviation(loss, ref_loss), max(relative_deviation(grads[n], ref_grads[n]) for n in ref_grads)


@pytest.mark.parametrize("case", VALUE, ids=[c.id for c in VALUE])
def test_critic_value_loss_with_images_equals_global_forward_backward(case, strategy_results, references):
    """The critic on a VLM: the value loss and every gradient (the tower's, the trunk's, the value head's)."""
    loss_error, grad_error = value_errors(case, strategy_results, references)
    assert loss_error <= 1e-10 and grad_error <= 1e-10, (loss_error, grad_error)
    grads = strategy_results[case][1]
    assert {"value_head.weight", "value_head.bias"} <= set(grads)
    if case.lora:  # the adapters and the value head alone train
        assert all(".lora_" in n or n.startswith("value_head.") for n in grads), sorted(grads)
    else:
        assert any(n.startswith("model.visual.") for n in grads)


def test_critic_with_1d_positions_misses(strategy_results, references):
    loss_error, grad_error = value_errors(VALUE_NAIVE, strategy_results, references)
    assert loss_error > 1e-6 and grad_error > 1e-6, (loss_error, grad_error)


@pytest.mark.parametrize("world_size", [1, 2])
def test_values_with_images_equal_the_global_forward(world_size, strategy_results, references):
    """compute_values (the critic's pass before GAE) on rank 0's rows, packed: the global forward's."""
    key = ("value", "qwen2_5_vl", False)
    if key not in references:
        references[key] = value_reference()
    rows, values = strategy_results[("values", world_size)]
    expected = references[key][2][rows]
    assert values.shape == expected.shape and (values - expected).abs().max() <= 1e-12
