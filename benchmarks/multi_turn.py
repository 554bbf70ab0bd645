"""Multi-turn rollouts on CPU: trajectories per second of one trajectory at a time, of the episode
loop in lockstep, and of the episode loop overlapping the engine with the environments.

    python benchmarks/multi_turn.py [--trajectories 32] [--env-latency-ms 50] [--max-concurrent 8]
                                    [--max-turns 6] [--new-tokens 6] [--repeats 3] [--threads 1] [--tiny]

The environment is guess_the_number whose reset and step each sleep `--env-latency-ms` first
(SlowGuessTheNumber, below: a stand-in for a sandbox or a tool call that waits on something). The
environment processes import it from this file, by the import path `multi_turn:SlowGuessTheNumber`:
they get this process's sys.path (roll_lite/rewards/guarded.py), whose first entry is benchmarks/
when the script runs as `python benchmarks/multi_turn.py`. Trajectory i plays numbers from 1 to
10 + i with seed i, so the prompts differ in length and content.

The model is a Qwen2 built from config (hidden 64, 2 layers, 512 positions, the built-in character
tokenizer with the `compact` chat template, random init from seed 0 with initializer_range 0.2: at
the default 0.02 every greedy turn is six spaces, and all episodes would be alike) in roll_lite's hf
engine, float32, `--threads` torch threads, greedy: every row plays the same episodes if batching
does not change what the model picks, and the script checks that it does not (prompt and response
ids, every turn's text and reward, how each episode ended). The random model never guesses right:
every episode runs to max_turns; their lengths differ with what the environment answers.

Rows, all on the same engine:
- sequential: a plain loop written here (not episodes.py): one trajectory at a time, each turn
  generate one completion, then step its environment and wait; one environment process;
- lockstep: run_episodes(..., overlap=False) over `--max-concurrent` environment processes: every
  environment steps, then every running trajectory generates in one batch;
- overlapped: run_episodes(..., overlap=True) over the same processes: two cohorts of trajectories
  take turns, one generating while the other's environments step.
Each of `--repeats` rounds runs the three rows, the order rotated from round to round; the table
gives medians over the rounds. Start-up (model, processes) is outside the timings.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

from roll_lite.environments.guess_the_number import GuessTheNumber

ROWS = ("sequential", "lockstep", "overlapped")
MODEL = dict(
    model_type="qwen2",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    initializer_range=0.2,
)
TINY = dict(trajectories=4, env_latency_ms=5.0, max_concurrent=2, max_turns=3, new_tokens=4, repeats=1)


class SlowGuessTheNumber(GuessTheNumber):
    """guess_the_number with a fixed latency on every reset and step."""

    def __init__(self, latency_ms: float = 50.0, **kwargs):
        super().__init__(**kwargs)
        self.latency_s = latency_ms / 1000

    def reset(
        self, seed: int | None = None, secret: int | None = None, lo: int | None = None, hi: int | None = None
    ) -> tuple[str, dict]:
        time.sleep(self.latency_s)
        return super().reset(seed, secret, lo, hi)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        time.sleep(self.latency_s)
        return super().step(action)


class TimedEngine:
    """episodes.TurnEngine over the in-process hf engine: start_generate generates (the loop waits for
    the result right after anyway) and adds the call's time to `seconds`."""

    def __init__(self, engine):
        self.engine, self.seconds = engine, 0.0

    def start_generate(self, prompts, params):
        start = time.perf_counter()
        completions = self.engine.generate(prompts, params)
        self.seconds += time.perf_counter() - start
        return completions

    def result(self, handle):
        return handle


class TimedWait:
    """concurrent.futures.wait, adding the time the caller is blocked in it to `seconds`: put in
    episodes.py's namespace while a row runs, it times the loop waiting for its environments."""

    def __init__(self, wait):
        self.wait, self.seconds = wait, 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.wait(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def environment_spec() -> str:
    """The import path of SlowGuessTheNumber as the environment processes can import it."""
    module = __spec__.name if __spec__ is not None else Path(__file__).stem  # -m benchmarks.multi_turn, or the script
    return f"{module}:SlowGuessTheNumber"


def play_sequentially(engine: TimedEngine, runner, tokenizer, starts, params, limits, blocked: list[float]) -> list:
    """One trajectory at a time: reset; then generate, step, until it ends. The same rules as
    run_episodes (episodes.py's docstring), written out for one trajectory; `blocked[0]` gathers the
    time spent waiting on the environment's futures."""
    from roll_lite.environments.turns import observation_ids
    from roll_lite.rollout import SamplingParams

    eos, positions = tokenizer.eos_token_id, limits.max_sequence_tokens

    def result(future):
        start = time.perf_counter()
        value = future.result()
        blocked[0] += time.perf_counter() - start
        if value.fault is not None:
            raise RuntimeError(f"{value.env_id}: {value.fault}: {value.error}")
        return value

    episodes = []
    for start in starts:
        first = result(runner.submit_reset(start.key, start.seed, start.fields))
        prompt = list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": first.observation}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        response, texts, rewards, end = [], [], [], None
        while True:
            allowed = min(limits.max_new_tokens_per_turn, positions - len(prompt) - len(response))
            turn = SamplingParams(allowed, 1, greedy=params.greedy)
            ids = engine.result(engine.start_generate([prompt + response], turn)).token_ids[0][:allowed]
            response += ids
            texts.append(tokenizer.decode(ids, skip_special_tokens=True))
            step = result(runner.submit_step(start.key, texts[-1]))
            rewards.append(step.reward)
            if step.terminated or step.truncated:
                end = "terminated" if step.terminated else "truncated"
                break
            if len(texts) >= limits.max_turns:
                end = "max_turns"
                break
            continuation = ([] if ids[-1] == eos else [eos]) + observation_ids(tokenizer, step.observation, eos)
            if positions - len(prompt) - len(response) < len(continuation) + 1:  # and one token of a next turn
                end = "token_budget"
                break
            response += continuation
        if end in ("max_turns", "token_budget"):  # the loop's own ends: the environment is given back
            runner.release(start.key)
        episodes.append((prompt, response, texts, rewards, end))
    return episodes


def outcome(episode) -> tuple:
    """What the equality check compares: prompt ids, response ids, turn texts, rewards, ending."""
    t = episode.trajectory
    return (t.prompt_ids, t.response_ids, episode.turn_texts, episode.turn_rewards, episode.end)


def run_row(row: str, engine: TimedEngine, runners: dict, tokenizer, starts, params, limits) -> dict:
    from roll_lite.environments import episodes as episode_loop

    engine.seconds = 0.0
    timed_wait = TimedWait(episode_loop.wait)
    start = time.perf_counter()
    if row == "sequential":
        blocked = [0.0]
        outcomes = play_sequentially(engine, runners["one"], tokenizer, starts, params, limits, blocked)
        waited = blocked[0]
    else:
        episode_loop.wait = timed_wait
        try:
            played = episode_loop.run_episodes(
                engine, runners["many"], tokenizer, starts, params, limits, overlap=row == "overlapped"
            )
        finally:
            episode_loop.wait = timed_wait.wait
        waited = timed_wait.seconds
        if faults := [f"{e.key}: {e.fault}: {e.error}" for e in played if e.fault is not None]:
            raise RuntimeError(f"{row}: environment faults: {faults}")
        outcomes = [outcome(e) for e in played]
    wall = time.perf_counter() - start
    return {
        "wall": wall,
        "generate": engine.seconds,
        "wait": waited,
        "outcomes": outcomes,
        "turns": statistics.mean(len(o[2]) for o in outcomes),
    }


def cpu_model() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--env-latency-ms", type=float, default=50.0, help="slept by every reset and step")
    parser.add_argument("--max-concurrent", type=int, default=8, help="environment processes of lockstep / overlapped")
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=6, help="max_new_tokens_per_turn")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the table gives medians")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--tiny", action="store_true", help=f"the test's size: {TINY}")
    args = parser.parse_args()
    if args.tiny:
        vars(args).update(TINY)

    import torch

    from roll_lite.environments.episodes import EpisodeLimits, EpisodeStart
    from roll_lite.environments.runner import EnvironmentRunner
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.model.tokenizer import load_tokenizer
    from roll_lite.rollout import SamplingParams
    from roll_lite.rollout.hf import HFEngine

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(None, "compact")
    model = build_causal_lm({**MODEL, "vocab_size": len(tokenizer)}, seed=0)
    engine = TimedEngine(HFEngine(model, tokenizer.pad_token_id, tokenizer.eos_token_id, seed=0))
    params = SamplingParams(args.new_tokens, 1, greedy=True)
    limits = EpisodeLimits(args.max_turns, args.new_tokens, None, MODEL["max_position_embeddings"])
    starts = [EpisodeStart(i, i, {"hi": 10 + i}) for i in range(args.trajectories)]
    kwargs = {"latency_ms": args.env_latency_ms, "max_turns": 8}
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average at the start (1 / 5 / 15 min): {load}", flush=True)
    engine.engine.generate([[1, 2, 3]], params)  # warm-up: transformers' first call
    results = {row: [] for row in ROWS}
    with (
        EnvironmentRunner(environment_spec(), kwargs, max_concurrent=1, step_timeout_s=60) as one,
        EnvironmentRunner(environment_spec(), kwargs, max_concurrent=args.max_concurrent, step_timeout_s=60) as many,
    ):
        runners = {"one": one, "many": many}
        for round_ in range(args.repeats):
            order = ROWS[round_ % 3 :] + ROWS[: round_ % 3]
            for row in order:
                results[row].append(run_row(row, engine, runners, tokenizer, starts, params, limits))
                print(f"round {round_ + 1}, {row}: {results[row][-1]['wall']:.2f} s", flush=True)
    report(results, args)


def report(results: dict, args) -> None:
    reference = results["sequential"][0]["outcomes"]
    same = {row: all(r["outcomes"] == reference for r in runs) for row, runs in results.items()}
    median = lambda row, key: statistics.median(r[key] for r in results[row])  # noqa: E731
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\nload average at the end (1 / 5 / 15 min): {load}; {cpu_model()}, torch threads {args.threads}; "
        f"{args.trajectories} trajectories, max_turns {args.max_turns}, max_new_tokens_per_turn {args.new_tokens}, "
        f"greedy; environment latency {args.env_latency_ms:g} ms per reset / step; lockstep and overlapped over "
        f"{args.max_concurrent} environment processes, sequential over 1; medians of {args.repeats} interleaved "
        "rounds\n"
    )
    print(
        "| rows | trajectories/s | wall s | generate | waiting for environments | loop's own work | mean turns | "
        "speed-up vs sequential |\n|---|---|---|---|---|---|---|---|"
    )
    for row in ROWS:
        wall = median(row, "wall")
        shares = [statistics.median(r[key] / r["wall"] for r in results[row]) for key in ("generate", "wait")]
        rest = statistics.median(1 - (r["generate"] + r["wait"]) / r["wall"] for r in results[row])
        print(
            f"| {row} | {args.trajectories / wall:.2f} | {wall:.2f} | {shares[0]:.0%} | {shares[1]:.0%} | {rest:.0%} | "
            f"{median(row, 'turns'):.2f} | {median('sequential', 'wall') / wall:.2f} |"
        )
    print(
        "\ngenerate: the engine's generate calls (the loop's thread runs them); waiting for environments: the "
        "loop's thread blocked on environment futures (sequential: future.result(); the episode loop: "
        "concurrent.futures.wait, timed by wrapping it in episodes.py's namespace); loop's own work: the rest "
        "(chat templates, tokenizing observations, decoding turns, submitting calls). Shares are medians over "
        "the rounds of each round's share."
    )
    print(
        "same episodes as sequential (prompt and response ids, turn texts, rewards, endings): "
        + ", ".join(f"{row} {'yes' if same[row] else 'NO'}" for row in ROWS[1:])
    )
    calls = median("sequential", "turns") + 1  # a reset and a step per turn, per trajectory
    floor = -(-args.trajectories // args.max_concurrent) * calls * args.env_latency_ms / 1000
    print(
        f"the environments alone take at least {args.trajectories * calls * args.env_latency_ms / 1000:.2f} s "
        f"one at a time, and about {floor:.2f} s over {args.max_concurrent} processes (their most loaded one: "
        f"{-(-args.trajectories // args.max_concurrent)} trajectories × {calls:g} calls × the latency)"
    )
    endings = [o[4] for o in reference]
    print("endings (sequential): " + ", ".join(f"{end} {endings.count(end)}" for end in sorted(set(endings))))


if __name__ == "__main__":
    main()
