"""DCP checkpoints of the FSDP2 strategy: written by 2 gloo ranks, loaded by 1 (resharding) and by 2;
and written by 1 rank (whose model is not wrapped: FSDP2Strategy.sharded is False) and loaded by 2; and
written by 2 ranks at sequence_parallel S = 2 (one data-parallel group of 2: the (D, S) mesh) and loaded at S = 2
(a run resumed at its degree) and at S = 1 (another degree: the same flattened shards, DCP reshards).

After the load, the model, the AdamW moments and the LR schedule equal the saved ones exactly, and
the next step equals the next step of the run that wrote the checkpoint (bit for bit on the same D;
to float64 rounding on another D, whose reduction order differs)."""

import os
import tempfile

import pytest
import torch
from loss_cases import MASK_KEYS, global_batch, make_loss
from spawned_ranks import join_group, leave_group, spawn_ranks

from roll_lite.loss.checker import TINY_MODEL
from roll_lite.model.modeling import build_causal_lm

LOSS = ("ppo", "token-mean")
SETTINGS = dict(lr=1e-2, warmup_steps=5, weight_decay=0.1, param_dtype="float64")


def _full_state(strategy):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    optimizer = get_optimizer_state_dict(
        strategy.model, strategy.optimizer, options=StateDictOptions(full_state_dict=True)
    )
    moments = {
        f"{name}.{key}": value.clone() for name, state in optimizer["state"].items() for key, value in state.items()
    }
    model = {
        name: value.clone() for name, value in strategy.full_state_dict().items()
    }  # on 1 rank: views of the parameters
    return {
        "model": model,
        "optimizer": moments,
        "lr": strategy.scheduler.get_last_lr()[0],
        "scheduler_step": strategy.scheduler.last_epoch,
    }


def _rank(rank: int, world_size: int, port: int, runs: list[tuple[str, str, str, dict]], out_path: str):
    """Each of `runs` (name, mode, folder, settings) in turn on these ranks: a strategy of its own that
    saves a checkpoint after two steps, or loads one; then one more step. Rank 0 writes every run's
    (loaded, metrics, after) to out_path."""
    join_group(rank, world_size, port)
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig
    from roll_lite.strategy.micro_batches import split_for_data_parallel

    data = global_batch(torch.float64)
    data.meta_info["loss_mask_keys"] = MASK_KEYS[LOSS[0]]
    results = {}
    for name, mode, folder, settings in runs:
        degree = settings.get("sequence_parallel", 1)  # the S ranks of data-parallel rank rank // S share its rows
        share = split_for_data_parallel(data, world_size // degree, balance_tokens=True)[rank // degree]
        seed = 0 if mode == "save" else 1  # a loading run starts from other weights: the load must replace them
        model = build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=seed)
        strategy = FSDP2Strategy(model, StrategyConfig(**settings))
        if mode == "save":
            for _ in range(2):
                strategy.train_step(share, make_loss(*LOSS))
            strategy.save_checkpoint(folder)
        else:
            strategy.load_checkpoint(folder)
        loaded = _full_state(strategy)
        metrics = strategy.train_step(share, make_loss(*LOSS))
        results[name] = (loaded, metrics, _full_state(strategy))
    if rank == 0:
        torch.save(results, out_path)
    leave_group()


FUSED = {**SETTINGS, "adamw_fused": True}
SP = {**SETTINGS, "sequence_parallel": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every save and load of this file, in three spawns (a rank's start costs ~3 s of imports): each
    checkpoint is loaded by processes other than the ones that wrote it. Checkpoints: "two" (foreach
    AdamW) and "fused" (adamw_fused) written by 2 ranks, "one" by 1 unwrapped rank."""
    tmp = tmp_path_factory.mktemp("checkpoints")
    folder = {name: str(tmp / name) for name in ("two", "fused", "one", "sp")}
    results = {}
    for world_size, runs in (
        (
            2,
            [
                ("save two", "save", folder["two"], SETTINGS),
                ("save fused", "save", folder["fused"], FUSED),
                ("save sp", "save", folder["sp"], SP),
            ],
        ),
        (
            1,
            [
                ("load two on 1", "load", folder["two"], SETTINGS),
                ("load fused on 1", "load", folder["fused"], FUSED),
                ("save one", "save", folder["one"], SETTINGS),
            ],
        ),
        (
            2,
            [
                ("load two on 2", "load", folder["two"], SETTINGS),
                ("load fused on 2", "load", folder["fused"], FUSED),
                ("load one on 2", "load", folder["one"], SETTINGS),
                ("load sp at S2", "load", folder["sp"], SP),
                ("load sp at S1", "load", folder["sp"], SETTINGS),
            ],
        ),
    ):
        out_path = str(tmp / f"results{len(results)}.pt")
        spawn_ranks(_rank, world_size, runs, out_path)
        results.update(torch.load(out_path, weights_only=False))
    return folder, results


def _assert_equal_states(a, b):
    assert a["lr"] == b["lr"] and a["scheduler_step"] == b["scheduler_step"]
    for part in ("model", "optimizer"):
        assert set(a[part]) == set(b[part])
        for name in a[part]:
            assert torch.equal(a[part][name], b[part][name]), f"{part} {name}"


@pytest.mark.parametrize("world_size", [2, 1])
def test_a_checkpoint_of_two_ranks_loads_exactly_on_two_and_on_one(runs, world_size):
    folder, results = runs
    assert sorted(os.listdir(folder["two"])) == [".metadata", "__0_0.distcp", "__1_0.distcp", "schedule.pt"]
    saved, saved_metrics, saved_after = results["save two"]
    loaded, metrics, after = results[f"load two on {world_size}"]
    _assert_equal_states(loaded, saved)
    assert saved["scheduler_step"] == 2 and saved["lr"] == pytest.approx(SETTINGS["lr"] * 3 / 5)  # mid-warmup
    kinds = [name.rsplit(".", 1)[1] for name in saved["optimizer"]]
    assert kinds.count("step") == kinds.count("exp_avg") == kinds.count("exp_avg_sq") == len(kinds) / 3 > 0
    if world_size == 2:  # the same ranks: the continued step is the same step, bit for bit
        assert metrics["loss"] == saved_metrics["loss"] and metrics["grad_norm"] == saved_metrics["grad_norm"]
        _assert_equal_states(after, saved_after)
    else:
        assert metrics["loss"] == pytest.approx(saved_metrics["loss"], rel=1e-12)
        for name, value in saved_after["model"].items():
            torch.testing.assert_close(after["model"][name], value, rtol=1e-10, atol=1e-13)


def test_a_checkpoint_of_one_unwrapped_rank_loads_exactly_on_two(runs):
    saved, saved_metrics, _ = runs[1]["save one"]
    loaded, metrics, _ = runs[1]["load one on 2"]
    _assert_equal_states(loaded, saved)
    assert metrics["loss"] == pytest.approx(saved_metrics["loss"], rel=1e-12)


def test_a_checkpoint_of_fused_adamw_on_two_ranks_loads_exactly_on_two_and_on_one(runs):
    """reproducible=portable's AdamW (adamw_fused) on sharded DTensor parameters: the same state as
    foreach's (the same keys, dtypes and shapes), saved and loaded as exactly."""
    results = runs[1]
    saved, saved_metrics, saved_after = results["save fused"]
    foreach = results["save two"][0]["optimizer"]
    assert {name: (v.dtype, v.shape) for name, v in saved["optimizer"].items()} == {
        name: (v.dtype, v.shape) for name, v in foreach.items()
    }
    for world_size in (2, 1):
        loaded, metrics, after = results[f"load fused on {world_size}"]
        _assert_equal_states(loaded, saved)
        if world_size == 2:
            assert metrics["loss"] == saved_metrics["loss"] and metrics["grad_norm"] == saved_metrics["grad_norm"]
            _assert_equal_states(after, saved_after)


def _threads_named(name: str) -> int:
    tasks = f"/proc/{os.getpid()}/task"
    return sum(1 for task in os.listdir(tasks) if open(f"{tasks}/{task}/comm").read().strip() == name)


def _save_and_load_at_two_threads(rank: int, world_size: int, port: int, folder: str, out_path: str):
    join_group(rank, world_size, port, threads=2)
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig

    data = global_batch(torch.float64)
    data.meta_info["loss_mask_keys"] = MASK_KEYS[LOSS[0]]
    # 8 layers: enough tensors that the metadata DCP gathers is over torch's grain size (32 K elements),
    # the size from which an op splits over threads; the 2-layer model's starts no team either way.
    model = build_causal_lm({**TINY_MODEL, "num_hidden_layers": 8}, dtype=torch.float64, seed=0)
    strategy = FSDP2Strategy(model, StrategyConfig(**SETTINGS))
    strategy.train_step(data, make_loss(*LOSS))
    before = _threads_named("pt_gloo_runloop")
    strategy.save_checkpoint(folder)
    strategy.load_checkpoint(folder)
    torch.save(
        {"before": before, "after": _threads_named("pt_gloo_runloop"), "torch_threads": torch.get_num_threads()},
        out_path,
    )
    leave_group()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread names from /proc (Linux)")
def test_a_checkpoint_starts_no_openmp_team_on_the_process_groups_threads():
    """DCP's collectives run on gloo's helper threads. At 2 torch threads each of them started an
    OpenMP team of its own (a thread that inherits the helper's name), and with more OpenMP threads
    than cores libgomp stopped spinning in every team: each step after a checkpoint was ~55 % slower
    on 2 cores. The strategy saves and loads at one torch thread, then goes back to the run's."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "threads.pt")
        spawn_ranks(_save_and_load_at_two_threads, 1, os.path.join(tmp, "ckpt"), out_path)
        counts = torch.load(out_path)
    assert counts["before"] >= 1  # the group's helper threads, by the name the test looks for
    assert counts["after"] == counts["before"]
    assert counts["torch_threads"] == 2


def test_a_checkpoint_written_at_sequence_parallel_two_resumes_at_two_and_at_one(runs):
    saved, saved_metrics, saved_after = runs[1]["save sp"]
    for name in ("load sp at S2", "load sp at S1"):
        loaded, metrics, after = runs[1][name]
        _assert_equal_states(loaded, saved)
        assert saved["scheduler_step"] == 2
    # at its own degree, the continued step is the same step, bit for bit
    loaded, metrics, after = runs[1]["load sp at S2"]
    assert metrics["loss"] == saved_metrics["loss"] and metrics["grad_norm"] == saved_metrics["grad_norm"]
    _assert_equal_states(after, saved_after)
    # at S = 1 on the same 2 ranks (D = 2): the same step to float64 rounding
    loaded, metrics, after = runs[1]["load sp at S1"]
    assert metrics["loss"] == pytest.approx(saved_metrics["loss"], rel=1e-12)
    for name, value in saved_after["model"].items():
        torch.testing.assert_close(after["model"][name], value, rtol=1e-10, atol=1e-13)
