"""The vllm engine's logic without a vllm.LLM (roll_lite/rollout/vllm_engine.py, vllm_requests.py,
vllm_weights.py): what it asks vLLM for, what it sends as weights, how it reads vLLM's outputs, and
when it sleeps and wakes (sleep mode exists on GPU only, so only here is it exercised).

`RecordingLLM` stands in for a vllm.LLM and returns outputs shaped like vLLM 0.32's RequestOutput /
CompletionOutput / Logprob. The real engine runs on CPU in tests/test_vllm_cpu.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from roll_lite.model.modeling import build_causal_lm
from roll_lite.rollout import SamplingParams
from roll_lite.rollout.vllm_engine import VLLMEngine
from roll_lite.rollout.vllm_requests import (
    completions_from_outputs,
    request_seeds,
    vllm_logprobs_mode,
    vllm_sampling_kwargs,
)
from roll_lite.rollout.vllm_weights import checkpoint_names, vllm_weights

EOS = 2


def test_sampling_maps_every_setting_and_asks_for_the_sampled_tokens_log_probs():
    params = SamplingParams(max_new_tokens=16, num_samples=8, temperature=0.7, top_p=0.9, top_k=20)
    assert vllm_sampling_kwargs(params, EOS, request_seed=123) == dict(
        n=8,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        max_tokens=16,
        seed=123,
        logprobs=0,
        stop_token_ids=[EOS],
        detokenize=False,
        ignore_eos=False,
    )


def test_greedy_is_temperature_zero_one_sample_no_log_probs():
    kwargs = vllm_sampling_kwargs(SamplingParams(max_new_tokens=5, greedy=True), EOS, request_seed=7)
    assert kwargs == dict(n=1, temperature=0.0, max_tokens=5, stop_token_ids=[EOS], detokenize=False, ignore_eos=False)
    with pytest.raises(ValueError, match="num_samples=1"):
        vllm_sampling_kwargs(SamplingParams(max_new_tokens=5, num_samples=2, greedy=True), EOS, request_seed=7)


def test_log_probs_mode_is_the_actors_quantity_or_an_error():
    assert vllm_logprobs_mode(temperature=0.7, top_p=1.0, top_k=0) == "processed_logprobs"
    assert vllm_logprobs_mode(temperature=1.0, top_p=0.9, top_k=50) == "raw_logprobs"
    with pytest.raises(ValueError, match="rollout.top_p=1 and rollout.top_k=0, or rollout.temperature=1"):
        vllm_logprobs_mode(temperature=0.7, top_p=0.9, top_k=0)


def test_request_seeds_are_reproducible_distinct_and_never_overlap_across_samples():
    first = request_seeds(seed=0, call=3, num_prompts=4, num_samples=8)
    assert first == request_seeds(seed=0, call=3, num_prompts=4, num_samples=8)
    assert first != request_seeds(seed=0, call=4, num_prompts=4, num_samples=8)
    assert first != request_seeds(seed=1, call=3, num_prompts=4, num_samples=8)
    sample_seeds = [s + j for s in first for j in range(8)]  # vLLM seeds sample j of a request with seed + j
    assert len(set(sample_seeds)) == 32


@pytest.mark.parametrize("tied", [True, False])
def test_weights_carry_the_names_and_shapes_of_the_models_hf_checkpoint(tmp_path, tied):
    """vLLM loads a HF checkpoint's names itself (q/k/v into qkv_proj, ...): the in-memory sync must
    send exactly the tensors `save_pretrained` writes, which is what vLLM reads from disk."""
    model = build_causal_lm(
        dict(
            model_type="qwen2",
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
            tie_word_embeddings=tied,
        ),
        seed=0,
    )
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as checkpoint:
        on_disk = {name: tuple(checkpoint.get_slice(name).get_shape()) for name in checkpoint.keys()}
    sent = vllm_weights(model.state_dict(), tie_word_embeddings=tied)
    assert {name: tuple(t.shape) for name, t in sent} == on_disk
    assert sorted(checkpoint_names(model.config)) == sorted(on_disk)  # what the engine checks every sync against
    assert ("lm_head.weight" in on_disk) is (not tied)
    layer_of = [name.split(".")[2] for name, _ in sent if name.startswith("model.layers.")]
    assert layer_of == sorted(layer_of, key=int)  # each layer's tensors together, in order


def _output(samples):
    """A RequestOutput: `samples` are (tokens, log-probs, finish reason), with vLLM's per-position
    {token id: Logprob} dicts (logprobs=0: just the sampled token)."""
    outputs = [
        SimpleNamespace(
            index=i,
            token_ids=tokens,
            finish_reason=reason,
            logprobs=None if lps is None else [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(tokens, lps)],
        )
        for i, (tokens, lps, reason) in enumerate(samples)
    ]
    return SimpleNamespace(outputs=outputs[::-1])  # in any order: the engine sorts by index


def test_outputs_become_prompt_major_completions_with_log_probs():
    params = SamplingParams(max_new_tokens=3, num_samples=2)
    outputs = [
        _output([([5, 6, EOS], [-0.1, -0.2, -0.3], "stop"), ([7, 8, 9], [-1.0, -2.0, -3.0], "length")]),
        _output([([EOS], [-0.5], "stop"), ([4, EOS], [-0.6, -0.7], "stop")]),
    ]
    completions = completions_from_outputs(outputs, params, EOS)
    assert completions.token_ids == [[5, 6, EOS], [7, 8, 9], [EOS], [4, EOS]]
    assert completions.log_probs == [[-0.1, -0.2, -0.3], [-1.0, -2.0, -3.0], [-0.5], [-0.6, -0.7]]


def test_outputs_that_break_the_contract_are_errors():
    params = SamplingParams(max_new_tokens=3, num_samples=1)
    with pytest.raises(RuntimeError, match="without EOS"):
        completions_from_outputs([_output([([5, 6], [-0.1, -0.2], "stop")])], params, EOS)
    with pytest.raises(RuntimeError, match="1 completions for prompt 0, asked for 2"):
        completions_from_outputs([_output([([5], [-0.1], "length")])], SamplingParams(3, num_samples=2), EOS)
    with pytest.raises(RuntimeError, match="log-probs for 0 of 1"):
        completions_from_outputs([_output([([5], None, "length")])], params, EOS)
    greedy = completions_from_outputs([_output([([5, EOS], None, "stop")])], SamplingParams(3, greedy=True), EOS)
    assert greedy.token_ids == [[5, EOS]] and greedy.log_probs is None


class RecordingLLM:
    """Records the calls a VLLMEngine makes; generates token 5 then EOS for every sample."""

    def __init__(self, not_loaded=()):
        self.calls, self.not_loaded = [], list(not_loaded)

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls.append(("generate", [p["prompt_token_ids"] for p in prompts], sampling_params))
        return [_output([([5, EOS], [-0.1, -0.2], "stop")] * sp["n"]) for sp in sampling_params]

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def collective_rpc(self, method, args):
        self.calls.append((method, [name for name, _ in args[0]]))
        return [self.not_loaded]

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))
        return True


def _engine(llm, release_memory):
    return VLLMEngine(llm, dict, EOS, tie_word_embeddings=True, seed=0, release_memory=release_memory)


def test_engine_sleeps_after_each_generation_and_wakes_what_it_needs():
    llm = RecordingLLM()
    engine = _engine(llm, release_memory=True)
    params = SamplingParams(max_new_tokens=2, num_samples=2)
    weights = {"model.embed_tokens.weight": torch.zeros(4, 2), "lm_head.weight": torch.zeros(4, 2)}
    engine.update_weights(weights)  # before the first generation: awake, nothing to wake
    completions = engine.generate([[1, 3], [1]], params)
    engine.update_weights(weights)  # after training: the weights wake, the KV cache waits for the generation
    engine.generate([[1]], params)
    engine.generate([[1]], SamplingParams(max_new_tokens=2, greedy=True))  # e.g. an evaluation, no update before it
    names = [call[0] for call in llm.calls]
    assert names == [
        "roll_lite_load_weights",
        "reset_prefix_cache",
        "generate",
        "sleep",
        "wake_up",
        "roll_lite_load_weights",
        "reset_prefix_cache",
        "wake_up",
        "generate",
        "sleep",
        "wake_up",
        "generate",
        "sleep",
    ]
    assert [c[1] for c in llm.calls if c[0] == "wake_up"] == [["weights"], None, None]
    assert all(c[1] == 1 for c in llm.calls if c[0] == "sleep")  # level 1: the weights survive on CPU
    assert llm.calls[0][1] == ["model.embed_tokens.weight"]  # tied: no lm_head
    assert completions.token_ids == [[5, EOS]] * 4 and completions.log_probs == [[-0.1, -0.2]] * 4
    prompts, requests = llm.calls[2][1], llm.calls[2][2]
    assert prompts == [[1, 3], [1]] and [r["seed"] for r in requests] == request_seeds(0, 0, 2, 2)


def test_engine_without_release_memory_never_sleeps_and_resumes_its_seeds():
    llm = RecordingLLM()
    engine = _engine(llm, release_memory=False)
    params = SamplingParams(max_new_tokens=2, num_samples=2)
    engine.generate([[1]], params)
    state = engine.state_dict()
    engine.generate([[1]], params)
    resumed = _engine(RecordingLLM(), release_memory=False)
    resumed.load_state_dict(state)
    resumed.generate([[1]], params)
    assert [c[0] for c in llm.calls] == ["generate", "generate"]
    assert resumed.llm.calls[0][2] == llm.calls[1][2]  # the same seeds as the uninterrupted engine's second call


def test_engine_refuses_a_sync_that_left_parameters_unloaded():
    engine = _engine(RecordingLLM(not_loaded=["model.norm.weight"]), release_memory=False)
    with pytest.raises(KeyError, match=r"vllm worker 0 did not load \['model.norm.weight'\]"):
        engine.update_weights({"model.embed_tokens.weight": torch.zeros(4, 2)})


def test_engine_refuses_a_sync_without_every_checkpoint_tensor_before_vllm_sees_it():
    llm = RecordingLLM()
    engine = VLLMEngine(llm, dict, EOS, tie_word_embeddings=False, checkpoint_names=["a.weight", "b.weight"])
    with pytest.raises(KeyError, match=r"missing \['b.weight'\] \(1\), not in the model's checkpoint \['c.weight'\]"):
        engine.update_weights({"a.weight": torch.zeros(1), "c.weight": torch.zeros(1)})
    assert llm.calls == []
    engine.update_weights({"a.weight": torch.zeros(1), "b.weight": torch.zeros(1)})
    assert [c[0] for c in llm.calls] == ["roll_lite_load_weights", "reset_prefix_cache"]


# --- prompts with images (roll_lite/rollout/vllm_images.py) ---


def test_each_images_run_of_tokens_is_folded_to_one_placeholder_and_a_wrong_run_is_refused():
    from roll_lite.rollout.vllm_images import folded_prompt, image_request

    pad, grids = 9, torch.tensor([[1, 4, 4], [1, 4, 8]])  # 4 and 8 image tokens (merge 2)
    ids = [1, 7, *[pad] * 4, 8, 3, 7, *[pad] * 8, 8, 5]
    assert folded_prompt(ids, grids, pad, 2) == [1, 7, pad, 8, 3, 7, pad, 8, 5]
    entry = {"pixel_values": torch.zeros(48, 24), "image_grid_thw": grids}
    request = image_request(ids, entry, pad, 2)
    assert request["prompt_token_ids"] == [1, 7, pad, 8, 3, 7, pad, 8, 5]
    assert request["multi_modal_data"]["image"]["image_grid_thw"] is grids
    assert image_request([1, 2], None, pad, 2) == {"prompt_token_ids": [1, 2]}
    with pytest.raises(ValueError, match="a run of 12 image tokens where its grid needs 4"):
        folded_prompt([1, *[pad] * 12, 5], grids, pad, 2)  # two images' tokens side by side
    with pytest.raises(ValueError, match="expanded exactly once"):
        folded_prompt([1, pad, 8, 7, pad, 8], grids, pad, 2)  # the placeholders not expanded
    with pytest.raises(ValueError, match="expanded exactly once"):
        image_request([1, pad, 2], None, pad, 2)  # an image token in a text prompt


def test_ids_vllm_ran_that_are_not_the_trainers_are_an_error_naming_the_prompt():
    from roll_lite.rollout.vllm_images import check_engine_ids

    ran = [SimpleNamespace(prompt_token_ids=[1, 9, 9, 2]), SimpleNamespace(prompt_token_ids=[1, 9, 9, 9, 2])]
    check_engine_ids(ran[:1], [[1, 9, 9, 2]])
    with pytest.raises(
        RuntimeError, match="vllm ran prompt 1 as 5 ids where the trainer holds 4, first difference at position 3"
    ):
        check_engine_ids(ran, [[1, 9, 9, 2], [1, 9, 9, 2]])


def test_a_partial_sync_is_a_vision_language_models_language_model_or_refused():
    text = VLLMEngine(llm=None, sampling_params_class=dict, eos_token_id=EOS, tie_word_embeddings=True)
    with pytest.raises(ValueError, match="a vision-language model's engine"):
        text.update_weights({}, part_of={"model.norm.weight"})
    names = ["model.language_model.norm.weight", "model.visual.merger.mlp.0.weight"]
    vision = VLLMEngine(None, dict, EOS, True, checkpoint_names=names, images={"image_token_id": 9})
    assert vision.language_model_names() == {"model.language_model.norm.weight"}
    with pytest.raises(ValueError, match="part_of may name a vision-language model's language model only"):
        vision.update_weights({}, part_of=set(names))
