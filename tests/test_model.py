"""Your own model: a pretrained folder for the actor, reference and critic (tied and untied LM heads),
gradient checkpointing through the strategy, and a saved `final/` that plain transformers loads and
generates from as the run did."""

import json
import subprocess
import sys
import threading

import pytest
import torch
from roll_lite.workers.model_worker import ModelWorker

from roll_lite.config import load_config
from roll_lite.data.sequences import build_sequence_batch
from roll_lite.loss import ppo_policy_loss_func, sft_loss_func
from roll_lite.loss.checker import TINY_MODEL, random_rl_batch
from roll_lite.model.modeling import build_causal_lm, decoder_layers, enable_gradient_checkpointing, load_causal_lm
from roll_lite.model.tokenizer import build_char_tokenizer
from roll_lite.rollout import HFEngine, SamplingParams
from roll_lite.runtime.importing import roll_lite_dir
from roll_lite.strategy import FSDP2Strategy, StrategyConfig
from roll_lite.strategy.distributed import free_port

PROMPTS = ["38125=", "907=", "Hello, world 42\n=", "x"]


def _full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def test_gradient_checkpointing_gives_the_same_loss_and_grads_and_recomputes(tmp_path):
    data = random_rl_batch(num_rows=8, seq_len=16, seed=3)
    loss_func = ppo_policy_loss_func("seq-mean-token-mean")
    results = []
    for checkpointing in (False, True):
        lm = build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0)
        if checkpointing:
            enable_gradient_checkpointing(lm)
        config = StrategyConfig(use_packing=True, grad_accum_steps=2, param_dtype="float64", lr=0.0)
        strategy = FSDP2Strategy(lm, config)
        mlp_calls = []
        # a pre-hook: the non-reentrant recomputation stops as soon as it has what backward needs
        decoder_layers(strategy.model)[0].mlp.register_forward_pre_hook(lambda *_: mlp_calls.append(1))
        metrics = strategy.train_step(data, loss_func)
        grads = {name: _full(p.grad).clone() for name, p in strategy.model.named_parameters()}
        results.append((metrics, grads, len(mlp_calls)))
    (plain, plain_grads, plain_calls), (ckpt, ckpt_grads, ckpt_calls) = results
    assert plain_calls == 2 and ckpt_calls == 4  # 2 micro-batches; checkpointing runs each layer again in backward
    assert ckpt["pg_loss"] == pytest.approx(plain["pg_loss"], rel=1e-12, abs=1e-15) and plain["grad_norm"] > 0
    assert plain_grads.keys() == ckpt_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-12, atol=1e-14, msg=name)


def _save_pretrained_model(folder, model_type: str, tied: bool):
    tokenizer = build_char_tokenizer()
    settings = dict(TINY_MODEL, model_type=model_type, vocab_size=len(tokenizer) + 5, tie_word_embeddings=tied)
    lm = build_causal_lm(settings, dtype=torch.float64, seed=7)
    lm.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {name: value.clone() for name, value in lm.state_dict().items()}


def assert_special_ids_exported(folder, tokenizer):
    """config.json and generation_config.json both carry the tokenizer's bos / eos / pad ids."""
    expected = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    for file in ("config.json", "generation_config.json"):
        written = json.loads((folder / file).read_text())
        assert {key: written.get(key) for key in expected} == expected, file
    assert expected["eos_token_id"] is not None and expected["pad_token_id"] is not None


def _worker(role, config, monkeypatch):
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(key, "")  # setup() sets them; monkeypatch puts the old values back
    worker = ModelWorker(role, 0, 1, config, None, roll_lite_dir())
    worker.setup("127.0.0.1", free_port())
    return worker


# Plain transformers (AutoTokenizer + AutoModelForCausalLM, generation_config defaults) in a fresh process: for each
# line [folder, prompts] it reads, a line "greedy JSON" of each prompt's [input ids, 12 greedy tokens, decoded prompt]
PLAIN_TRANSFORMERS = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
for line in sys.stdin:
    folder, prompts = json.loads(line)
    tok = AutoTokenizer.from_pretrained(folder); model = AutoModelForCausalLM.from_pretrained(folder)
    out = []
    for p in prompts:
        ids = tok(p, return_tensors='pt')
        gen = model.generate(**ids, max_new_tokens=12, do_sample=False)[0, ids['input_ids'].shape[1]:].tolist()
        out.append([ids['input_ids'][0].tolist(), gen, tok.decode(ids['input_ids'][0], skip_special_tokens=True)])
    print("greedy", json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def plain_transformers(tmp_path_factory):
    """One such process for the module's exports (its start, ~4 s of CPU importing torch and transformers, once)."""
    stderr_path = tmp_path_factory.mktemp("plain") / "stderr"
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", PLAIN_TRANSFORMERS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )

    def generate(folder, prompts):
        process.stdin.write(json.dumps([str(folder), prompts]) + "\n")
        process.stdin.flush()
        timeout = threading.Timer(300, process.kill)  # a hung process: its stdout ends
        timeout.start()
        try:
            for line in process.stdout:
                if line.startswith("greedy "):
                    return json.loads(line.removeprefix("greedy "))
        finally:
            timeout.cancel()
        raise AssertionError(stderr_path.read_text()[-2000:])

    yield generate
    process.stdin.close()
    process.wait(timeout=60)


@pytest.mark.parametrize("model_type, tied", [("qwen2", True), ("llama", False)])
def test_a_pretrained_folder_feeds_actor_reference_critic_and_the_export(
    tmp_path, monkeypatch, model_type, tied, plain_transformers
):
    original = _save_pretrained_model(tmp_path / "model", model_type, tied)
    config = load_config(
        None,
        [
            f"model.pretrained_path={tmp_path / 'model'}",
            "model.dtype=float64",
            "actor.param_dtype=float64",
            "critic.param_dtype=float64",
            "actor.lr=2e-2",
        ],
    )
    assert config.model.tokenizer_path == str(tmp_path / "model")  # the tokenizer comes from the same folder
    workers = {role: _worker(role, config, monkeypatch) for role in ("actor", "reference", "critic")}
    for role, worker in workers.items():
        state = worker.strategy.full_state_dict()
        backbone = {k: v for k, v in state.items() if not k.startswith("value_head.")}
        assert backbone.keys() == original.keys(), role
        assert all(torch.equal(backbone[k], original[k]) for k in original), role
        assert next(worker.strategy.model.parameters()).dtype == torch.float64
    critic_head = workers["critic"].strategy.full_state_dict()
    assert not critic_head["value_head.weight"].any() and not critic_head["value_head.bias"].any()

    # SFT steps move the actor towards "12<eos>"; tied heads stay tied, untied ones move apart.
    actor = workers["actor"]
    tokenizer = actor.tokenizer
    prompts = [[tokenizer.bos_token_id] + tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    batch = build_sequence_batch(prompts, [[5, 6, tokenizer.eos_token_id]] * len(prompts), tokenizer.pad_token_id)
    batch.meta_info["loss_mask_keys"] = ["response_mask"]
    for _ in range(20):
        actor.strategy.train_step(batch, sft_loss_func())
    trained = actor.strategy.full_state_dict()
    assert not torch.equal(trained["model.embed_tokens.weight"], original["model.embed_tokens.weight"])
    assert torch.equal(trained["lm_head.weight"], trained["model.embed_tokens.weight"]) == tied

    actor.save_pretrained(str(tmp_path / "final"))
    tokenizer.save_pretrained(tmp_path / "final")  # as PPOPipeline.save_final does
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final", dtype=torch.float64)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in trained.items())
    same_storage = loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert same_storage == tied and loaded.config.tie_word_embeddings == tied
    assert_special_ids_exported(tmp_path / "final", tokenizer)
    assert "roll_lite" not in (tmp_path / "final" / "config.json").read_text()  # no custom attention named

    # Plain transformers in a fresh process (AutoTokenizer + AutoModelForCausalLM, generation_config
    # defaults) against the run's own engine, built and synced as the rollout worker does it.
    engine = HFEngine(
        load_causal_lm(config.model, len(tokenizer), seed=0), tokenizer.pad_token_id, tokenizer.eos_token_id
    )
    engine.update_weights(trained)
    run_outputs = [engine.generate([p], SamplingParams(12, greedy=True)).token_ids[0] for p in prompts]
    assert sum(tokenizer.eos_token_id in o for o in run_outputs) >= 2  # stopping at EOS is part of the comparison
    plain = plain_transformers(tmp_path / "final", PROMPTS)
    for prompt, run_prompt, run_output, (plain_prompt, plain_output, decoded) in zip(
        PROMPTS, prompts, run_outputs, plain
    ):
        assert plain_prompt == run_prompt and decoded == prompt  # AutoTokenizer encodes as the run did
        assert plain_output == run_output, prompt  # the same greedy completion, stopping at the same EOS
