"""workers.backend=local: every worker an object in roll-train's own process, no Ray (workers/local.py).

One Ray run is the reference: tests/test_resume.py's tiny PPO run (a reference and a critic, generating one
step ahead, a checkpoint every 2 steps), with its final weights. The same command with workers.backend=local,
run in this process (roll_lite.cli.main), gives the same metrics.jsonl bit for bit (perf/ timings aside), the
same traces and the same final weights: uninterrupted, with the reference, the critic and a reward worker
as workers of their own; and stopped by SIGINT after step 4's checkpoint, then resumed to step 6. The other
tests check the local workers themselves and the config's refusals, without a run.
"""

import json
import logging
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from roll_lite.workers.calls import WorkerCalls
from roll_lite.workers.local import LocalActor, start_local, stop_local
from safetensors.torch import load_file
from test_resume import ASYNC, STEPS, TINY

from roll_lite.cli import main
from roll_lite.config import ConfigError, WorkersConfig, load_config
from roll_lite.model.weights import flatten_state_dict
from roll_lite.runtime.failures import WorkerError
from roll_lite.strategy.distributed import close_one_process_group, init_one_process_group, process_group

REPO = Path(__file__).resolve().parents[1]
# what a worker's process group setup would set; a local run leaves this process's environment as it was
GROUP_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def args(data: list[str], output: Path, run_name: str, *extra: str) -> list[str]:
    return [
        "--config",
        str(REPO / "configs/ppo.yaml"),
        *TINY,
        *ASYNC,
        "save_model=true",
        *data,
        f"output_dir={output}",
        f"run_name={run_name}",
        "workers.backend=ray",  # the reference run; `extra` says local for the others
        *extra,
    ]


class Lines(logging.Handler):
    """The log's lines; with `interrupt_after`, a SIGINT to this process after the first line holding it."""

    def __init__(self, interrupt_after: str | None = None) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.interrupt_after = interrupt_after

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if self.interrupt_after is not None and self.interrupt_after in self.lines[-1]:
            self.interrupt_after = None
            os.kill(os.getpid(), signal.SIGINT)


@contextmanager
def logging_to(handler: logging.Handler):
    logging.getLogger("roll_lite").addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger("roll_lite").removeHandler(handler)


def metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Run directories: `ray` (a fresh roll-train process), `local` and `resumed` (in this process)."""
    folder = tmp_path_factory.mktemp("local_backend")
    for name in ("train", "eval"):
        lines = (REPO / f"data/reverse_digits/{name}.jsonl").read_text().splitlines(keepends=True)[:8]
        (folder / f"{name}.jsonl").write_text("".join(lines))
    data = [f"data.train_files={folder / 'train.jsonl'}", f"data.eval_files={folder / 'eval.jsonl'}"]
    ray = subprocess.run(
        [sys.executable, "-m", "roll_lite.cli", *args(data, folder, "ray")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert ray.returncode == 0, ray.stderr[-3000:]
    environment, handlers = {k: os.environ.get(k) for k in GROUP_VARIABLES}, signal.getsignal(signal.SIGINT)
    group = process_group()  # another test's one-process group (FSDP2Strategy in this process) is used, and kept
    local = ["workers.backend=local"]
    own_workers = ["reward.in_driver=false", "workers.one_process_per_rank=false"]
    log = Lines()
    with logging_to(log):
        assert main(args(data, folder, "local", *local, *own_workers)) == 0
    (folder / "local" / "driver.log").write_text("\n".join(log.lines))
    # Stopped by SIGINT once step 4's checkpoint is written (with step 5's batch, generated ahead), then
    # resumed. (A run of steps=4 would generate nothing ahead at its last step: its step 5 would not.)
    with logging_to(Lines(interrupt_after="checkpoints/step_4 written")):
        assert main(args(data, folder, "resumed", *local)) == 128 + signal.SIGINT
    with logging_to(resumed := Lines()):
        assert main(args(data, folder, "resumed", *local)) == 0
    assert any(line.startswith("resumed from ") and "step_4 (step 4)" in line for line in resumed.lines)
    # nothing of the runs is left in this process
    assert process_group() == group
    assert {k: os.environ.get(k) for k in GROUP_VARIABLES} == environment
    assert signal.getsignal(signal.SIGINT) == handlers
    return {"ray": folder / "ray", "local": folder / "local", "resumed": folder / "resumed"}


@pytest.mark.parametrize("run", ["local", "resumed"])
def test_a_local_run_equals_the_ray_run_bit_for_bit(runs, run):
    assert len(metrics(runs["ray"])) == STEPS + 1
    for got, expected in zip(metrics(runs[run]), metrics(runs["ray"]), strict=True):
        differing = {
            k: (got.get(k), expected.get(k)) for k in got.keys() | expected.keys() if got.get(k) != expected.get(k)
        }
        assert not differing, f"step {got['step']}: {differing}"
    assert metrics(runs[run])[-1]["rollout/staleness"] == 1  # generated one step ahead
    assert pq.read_table(runs[run] / "traces").to_pylist() == pq.read_table(runs["ray"] / "traces").to_pylist()
    weights, expected_weights = (load_file(runs[name] / "final/model.safetensors") for name in (run, "ray"))
    assert weights.keys() == expected_weights.keys()
    assert all(torch.equal(weights[name], expected_weights[name]) for name in weights)


def test_the_local_run_started_no_ray_and_its_roles_were_workers_of_their_own(runs):
    log = (runs["local"] / "driver.log").read_text()
    assert "workers.backend=local: every worker in this process, no Ray" in log
    assert "rewards: scored by a reward worker of its own" in log
    for role in ("reference", "critic"):
        assert f"{role}: a worker of its own in this process (workers.backend=local)" in log


class Toy:
    """A worker: holds weights, generates with them, keeps what it is given, draws random numbers."""

    def __init__(self, weights: int, fail_init: bool = False):
        if fail_init:
            raise ValueError("no model here")
        self.weights, self.kept = weights, []

    def generate(self) -> int:
        return self.weights

    def update(self, weights: int) -> None:
        self.weights = weights

    def keep(self, items: list) -> list:
        items.append("kept")
        self.kept = items
        return self.kept

    def identity(self, value):
        return value

    def draw(self) -> float:
        return torch.rand(1).item()

    def use_threads(self, count: int) -> int:
        torch.set_num_threads(count)
        return torch.get_num_threads()

    def threads(self) -> int:
        return torch.get_num_threads()

    def fail(self) -> None:
        raise KeyError("the row is gone")


def test_calls_run_in_the_order_made_a_generation_queued_before_an_update_has_the_old_weights():
    worker = LocalActor(Toy, 1)
    before, update, after = worker.generate.remote(), worker.update.remote(2), worker.generate.remote()
    calls = WorkerCalls("rollout", WorkersConfig(backend="local"))
    assert [calls.get(before, "generate"), calls.get(update, "update"), calls.get(after, "generate")] == [1, None, 2]
    stop_local()


def test_a_failure_is_a_worker_error_naming_the_role_the_rank_and_the_call():
    calls = WorkerCalls("actor", WorkersConfig(backend="local"))
    with pytest.raises(WorkerError) as raised:
        calls.get([LocalActor(Toy, 1).fail.remote()], "train_step")
    assert (raised.value.role, raised.value.rank, raised.value.method, raised.value.kind) == (
        "actor",
        0,
        "train_step",
        "raised",
    )
    assert "KeyError: 'the row is gone'" in str(raised.value) and "in fail" in str(raised.value)
    # a constructor that raises is reported at the first call, as Ray reports it
    with pytest.raises(WorkerError, match=r"(?s)^actor raised an error in __init__\n.*ValueError: no model here$"):
        calls.get(LocalActor(Toy, 1, True).generate.remote(), "describe")
    stop_local()


def test_arguments_and_answers_are_copies_as_on_ray_the_weights_are_not():
    worker, items = LocalActor(Toy, 1), ["given"]
    answer = worker.keep.remote(items).value
    assert items == ["given"] and answer == ["given", "kept"]
    answer.append("changed by the caller")
    assert worker._instance.kept == ["given", "kept"]
    weights = flatten_state_dict({"w": torch.ones(2)})
    assert worker.identity.remote(weights).value is weights
    stop_local()


def test_each_worker_has_the_random_generators_and_threads_of_a_process_of_its_own():
    torch.manual_seed(7)
    driver_draws, threads = torch.rand(2), torch.get_num_threads()
    torch.manual_seed(7)
    first, second = LocalActor(Toy, 1), LocalActor(Toy, 1)
    fresh = torch.Generator()  # a new process's torch generator
    expected = [torch.rand(1, generator=fresh).item() for _ in range(2)]
    assert [first.draw.remote().value, first.draw.remote().value] == expected  # its own stream, continued
    assert second.draw.remote().value == expected[0]  # not the first worker's
    assert torch.rand(2).equal(driver_draws)  # the driver's stream did not move
    assert first.use_threads.remote(threads + 1).value == threads + 1
    assert torch.get_num_threads() == threads and first.threads.remote().value == threads + 1
    stop_local()


def test_a_callers_group_of_one_process_is_used_and_kept_a_larger_one_is_refused(monkeypatch):
    had = process_group()
    init_one_process_group(torch.device("cpu"))
    try:
        start_local()
        stop_local()
        assert process_group() == (1, "gloo")  # the caller's, left to it
        monkeypatch.setattr("roll_lite.workers.local.process_group", lambda: (2, "gloo"))
        with pytest.raises(ConfigError, match=r"^workers.backend: local trains in a torch.distributed group of this"):
            start_local()
    finally:
        if had is None:
            close_one_process_group()


@pytest.mark.parametrize(
    "config, overrides, error",
    [
        ("ppo", ["workers.backend=lokal"], "workers.backend: 'lokal' is not one of auto, ray, local"),
        ("ppo", ["workers.actor_dp=2"], "workers.actor_dp: workers.backend=local runs one rank of each role"),
        ("ppo", ["workers.critic_dp=2"], "workers.critic_dp: workers.backend=local runs one rank of each role"),
        ("ppo", ["workers.gpus_per_rank=1"], "workers.gpus_per_rank: workers.backend=local runs on the CPU"),
        ("ppo", ["ray_address=10.0.0.1:6379"], "ray_address: workers.backend=local starts no Ray"),
        ("ppo", ["workers.node_labels={actor: {zone: a}}"], "workers.node_labels: pins roles to Ray nodes"),
        ("ppo", ["rollout.engine=vllm"], "rollout.engine: vllm is not supported under workers.backend=local"),
        ("grpo_async", ["rollout.schedule=greedy"], "rollout.schedule: greedy is not supported under"),
        ("multiturn", ["rollout.fully_async=true"], "rollout.fully_async: multi-turn rollouts ahead are not"),
    ],
)
def test_what_local_cannot_run_is_a_config_error_naming_the_key(config, overrides, error):
    with pytest.raises(ConfigError) as raised:
        load_config(str(REPO / f"configs/{config}.yaml"), ["workers.backend=local", *overrides])
    assert str(raised.value).startswith(error), raised.value


def test_ray_address_in_the_environment_stops_roll_train_in_one_line_before_anything_starts(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    code = main(["--config", str(REPO / "configs/ppo.yaml"), "workers.backend=local", f"output_dir={tmp_path}"])
    assert code == 2 and not list(tmp_path.iterdir())
    assert capsys.readouterr().err.strip() == (
        "roll-train: config error: workers.backend: local joins no Ray cluster, but RAY_ADDRESS is set "
        "(10.0.0.1:6379): unset it, or set workers.backend=ray"
    )
