"""LoRA (roll_lite/lora/adapters.py) against peft itself: targets, the frozen base, merging, the PEFT folder, the
reference as the adapters switched off, and the strategy training and checkpointing adapters only.
(The adapters' gradients under D x A x packing: tests/test_exactness.py's LoRA cases.)"""

import pytest
import torch
from loss_cases import LORA, MASK_KEYS, global_batch, lora_model, make_loss
from spawned_ranks import join_group, leave_group, spawn_ranks

from roll_lite.errors import ConfigError
from roll_lite.lora.adapters import (
    adapted_modules,
    adapter_state,
    adapters_disabled,
    add_adapters,
    base_state,
    linear_module_names,
    merged_state,
    scaling,
    target_modules,
    to_adapted_names,
    write_peft_adapter,
)
from roll_lite.lora.settings import LoraSettings
from roll_lite.loss.checker import TINY_MODEL
from roll_lite.model.modeling import build_causal_lm
from roll_lite.strategy import FSDP2Strategy, StrategyConfig

LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def logits(lm, input_ids):
    with torch.no_grad():
        return lm(input_ids=input_ids).logits


def test_targets_resolve_against_the_models_linear_modules_and_unknown_names_list_them():
    lm = build_causal_lm(TINY_MODEL, seed=0)
    assert linear_module_names(lm) == LINEAR  # lm_head left out
    assert target_modules(LoraSettings(rank=4), lm) == LINEAR
    assert target_modules(LoraSettings(rank=4, target_modules=["v_proj", "q_proj"]), lm) == ["q_proj", "v_proj"]
    for wrong in (["q_proj", "query"], ["lm_head"], []):
        with pytest.raises(ConfigError) as error:
            target_modules(LoraSettings(rank=4, target_modules=wrong), lm, key="critic.lora")
        assert str(error.value).startswith("critic.lora.target_modules:") and str(LINEAR) in str(error.value)


def test_settings_are_checked_naming_the_key():
    for settings, key in (
        (LoraSettings(rank=-1), "rank"),
        (LoraSettings(rank=4, alpha=0), "alpha"),
        (LoraSettings(rank=4, dropout=1.0), "dropout"),
    ):
        with pytest.raises(ValueError, match=f"^actor.lora.{key}:"):
            StrategyConfig(lora=settings).validate("actor.")


def test_adapters_start_as_the_base_model_and_only_they_train():
    base = build_causal_lm(TINY_MODEL, seed=0)
    lm = add_adapters(
        build_causal_lm(TINY_MODEL, seed=0), LoraSettings(rank=4, target_modules=["q_proj", "up_proj"]), seed=0
    )
    ids = torch.randint(0, TINY_MODEL["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(logits(lm, ids), logits(base, ids))  # lora_B starts at zero
    trainable = [name for name, p in lm.named_parameters() if p.requires_grad]
    layers = TINY_MODEL["num_hidden_layers"]
    assert len(trainable) == 2 * 2 * layers and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert adapted_modules(lm) == ["q_proj", "up_proj"]
    again = add_adapters(
        build_causal_lm(TINY_MODEL, seed=0), LoraSettings(rank=4, target_modules=["q_proj", "up_proj"]), seed=0
    )
    assert all(torch.equal(a, b) for a, b in zip(lm.state_dict().values(), again.state_dict().values()))  # seeded


def test_merge_equals_peft_merge_and_unload():
    from peft import get_peft_model

    from roll_lite.lora.adapters import peft_config

    lm = lora_model(torch.float64)
    ours = merged_state(lm.state_dict(), scaling(LORA))
    reference = get_peft_model(build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0), peft_config(LORA, LINEAR))
    reference.base_model.model.load_state_dict(lm.state_dict())
    theirs = reference.merge_and_unload().state_dict()
    assert set(ours) == set(theirs)
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-14, atol=1e-15)
    plain = build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0)
    plain.load_state_dict(ours)
    ids = torch.randint(0, TINY_MODEL["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(logits(plain, ids), logits(lm, ids), rtol=1e-12, atol=1e-12)


def test_the_peft_folder_loads_with_peft_model_from_pretrained(tmp_path):
    from peft import PeftModel

    lm = lora_model(torch.float32)
    write_peft_adapter(tmp_path, adapter_state(lm.state_dict()), LORA, adapted_modules(lm))
    loaded = PeftModel.from_pretrained(build_causal_lm(TINY_MODEL, seed=0), str(tmp_path))
    ids = torch.randint(0, TINY_MODEL["vocab_size"], (3, 11), generator=torch.Generator().manual_seed(2))
    assert torch.equal(logits(loaded, ids), logits(lm, ids))
    assert not torch.equal(logits(loaded, ids), logits(build_causal_lm(TINY_MODEL, seed=0), ids))  # the adapter acts


def test_adapters_disabled_is_the_base_model_and_they_come_back():
    lm, base = lora_model(torch.float32), build_causal_lm(TINY_MODEL, seed=0)
    ids = torch.randint(0, TINY_MODEL["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(3))
    adapted = logits(lm, ids)
    with adapters_disabled(lm):
        assert torch.equal(logits(lm, ids), logits(base, ids))
    assert torch.equal(logits(lm, ids), adapted)
    assert all(p.requires_grad for name, p in lm.named_parameters() if ".lora_" in name)
    with pytest.raises(RuntimeError, match="no LoRA adapters"), adapters_disabled(base):
        pass


def test_plain_names_go_into_the_adapted_base_and_back():
    lm = lora_model(torch.float32)
    plain = base_state(lm.state_dict())
    assert set(plain) == set(build_causal_lm(TINY_MODEL, seed=0).state_dict())
    adapted = to_adapted_names(plain, lm)
    assert set(adapted) == set(lm.state_dict()) - set(adapter_state(lm.state_dict()))


def test_the_strategy_steps_only_the_adapters_and_its_reference_equals_a_separate_base_model():
    data = global_batch(torch.float32)
    data.meta_info["loss_mask_keys"] = MASK_KEYS["ppo"]
    strategy = FSDP2Strategy(lora_model(torch.float32), StrategyConfig(lr=1e-2, use_packing=True))
    before = {name: value.clone() for name, value in strategy.full_state_dict().items()}
    assert len(strategy.optimizer.param_groups[0]["params"]) == len(adapter_state(before))
    strategy.train_step(data, make_loss("ppo", "token-mean"))
    after = strategy.full_state_dict()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == set(adapter_state(before))
    assert set(strategy.full_state_dict(trainable_only=True)) == changed
    reference = FSDP2Strategy(build_causal_lm(TINY_MODEL, seed=0), StrategyConfig(use_packing=True), trainable=False)
    with adapters_disabled(strategy.model):
        from_actor = strategy.compute_log_probs(data)["log_probs"]
    assert torch.equal(from_actor, reference.compute_log_probs(data)["log_probs"])
    assert not torch.equal(strategy.compute_log_probs(data)["log_probs"], from_actor)


SETTINGS = dict(lr=1e-2, warmup_steps=5, weight_decay=0.1, param_dtype="float64", use_packing=True)


def _checkpoint_rank(rank: int, world_size: int, port: int, mode: str, folder: str, out_path: str):
    join_group(rank, world_size, port)
    from roll_lite.strategy.micro_batches import split_for_data_parallel

    data = global_batch(torch.float64)
    data.meta_info["loss_mask_keys"] = MASK_KEYS["ppo"]
    share = split_for_data_parallel(data, world_size, balance_tokens=True)[rank]
    lm = lora_model(torch.float64)
    if mode == "load":  # other adapter values: the load must replace them
        with torch.no_grad():
            for parameter in lm.parameters():
                if parameter.requires_grad:
                    parameter.mul_(0.5)
    strategy = FSDP2Strategy(lm, StrategyConfig(**SETTINGS), shard_single_rank=True)
    if mode == "save":
        for _ in range(2):
            strategy.train_step(share, make_loss("ppo", "token-mean"))
        strategy.save_checkpoint(folder)
    else:
        strategy.load_checkpoint(folder)
    loaded = {name: value.clone() for name, value in strategy.full_state_dict().items()}
    adapters = strategy.full_state_dict(trainable_only=True)  # what an adapter-only sync gathers
    metrics = strategy.train_step(share, make_loss("ppo", "token-mean"))
    if rank == 0:
        assert adapters.keys() == adapter_state(loaded).keys()
        assert all(torch.equal(adapters[name], loaded[name]) for name in adapters)
        torch.save((loaded, metrics), out_path)
    leave_group()


def _spawn(world_size, mode, folder, out_path):
    spawn_ranks(_checkpoint_rank, world_size, mode, folder, out_path)
    return torch.load(out_path, weights_only=False)


def test_a_lora_checkpoint_holds_only_the_adapters_and_resumes_bit_for_bit(tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = str(tmp_path / "actor")
    saved, saved_metrics = _spawn(2, "save", folder, str(tmp_path / "saved.pt"))
    keys = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    model_keys = [key for key in keys if key.startswith("model.")]
    assert model_keys and all(".lora_A." in key or ".lora_B." in key for key in model_keys)
    loaded, metrics = _spawn(2, "load", folder, str(tmp_path / "loaded.pt"))
    assert all(torch.equal(loaded[name], saved[name]) for name in saved)
    assert metrics["loss"] == saved_metrics["loss"] and metrics["grad_norm"] == saved_metrics["grad_norm"]
