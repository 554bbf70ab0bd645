"""Where the time from launch to the first GRPO step goes: workers.backend=ray against =local (and TRL).

    python benchmarks/startup.py [--rounds 3] [--backends ray,local,trl] [--model DIR] [--sft-steps 600]
                                 [--threads 2]

The demo-size GRPO run (configs/grpo.yaml, sft.steps=0, a warm start through model.pretrained_path; 2
prompts × 8 samples, ≤ 16 new tokens, as benchmarks/vs_trl.py), one step. Each run is a fresh process
(this script again, with --one BACKEND) that imports torch, transformers, Ray (the ray arm only) and
roll_lite one at a time, then calls roll_lite.cli.main with timers wrapped around these calls (nothing
in the pipeline is changed): the config checks (check_run: the model's config and the tokenizer; the
first use of transformers' model registry lands here), the prompt files' read, the start of Ray (or of
the local backend), the actor's worker process (Ray: from its launch to its first answer), its model
build with the warm start's load, the step-0 held-out evaluation and the first step. Every mark is
seconds since the process started (its start time in /proc, as perf/since_launch_s), so the
interpreter's own start is in the table too; "other" is what the timers leave out (the config's load,
the run directory, the reward and rollout clients, the step-0 record). "launch -> exit" is the whole
process, the end-of-run evaluation, checkpoint and shutdown included. `trl`: benchmarks/trl_grpo.py
--steps 1 in TRL's venv (.venv-trl, made by benchmarks/vs_trl.py): its imports, then the model's load
and evaluation, then its trainer's setup and first step. Without --model the warm start is made first
(--sft-steps SFT steps).
Rounds are interleaved (ray, local, trl, ray, ...); the table is the median [range] per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRL_PYTHON = REPO / ".venv-trl" / "bin" / "python"
PHASES = (  # the order of the table
    "python start",
    "import torch",
    "import transformers",
    "import ray",
    "import roll_lite",
    "config checks (model config, tokenizer)",
    "prompt data (read, tokenize)",
    "Ray / local start",
    "actor worker process",
    "actor model build + load",
    "step-0 evaluation",
    "first step",
    "other",
    "launch -> first step",
    "launch -> exit",
)
TRL_PHASES = ("python start + imports", "model load + step-0 evaluation", "trainer setup + first step")


def since_launch_s() -> float:
    """As roll_lite.runtime.tracking.since_launch_s (imported only after the timed imports)."""
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    return float(Path("/proc/uptime").read_text().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")


def grpo_args(model: str, work: str, backend: str, threads: int) -> list[str]:
    return [
        "--config",
        str(REPO / "configs/grpo.yaml"),
        f"model.pretrained_path={model}",
        "sft.steps=0",
        f"data.train_files={REPO / 'data/reverse_digits/train.jsonl'}",
        f"data.eval_files={REPO / 'data/reverse_digits/eval.jsonl'}",
        "rollout.prompts_per_step=2",
        "rollout.num_samples=8",
        "rollout.max_new_tokens=16",
        "actor.lr=1e-4",
        "steps=1",
        "eval_every=25",
        "checkpoint.every=0",
        "save_model=false",
        f"workers.backend={backend}",
        f"workers.torch_threads={threads}",
        f"output_dir={work}",
        f"run_name={backend}",
    ]


def one_run(backend: str, model: str, work: str, threads: int) -> dict[str, float]:
    """In a fresh process: the phases of one launch, in seconds."""
    marks = {"python start": since_launch_s()}

    def mark(name: str) -> None:
        marks[name] = since_launch_s()

    import torch  # noqa: F401

    mark("import torch")
    import transformers  # noqa: F401  (its model modules load where the run builds a model)

    mark("import transformers")
    if backend == "ray":
        import ray  # noqa: F401
    mark("import ray")
    import roll_lite.pipelines.ppo
    import roll_lite.workers.group
    import roll_lite.workers.local

    import roll_lite.cli

    mark("import roll_lite")
    spans: dict[str, list[float]] = {}  # name -> [start, end], the first call only

    def timed(owner, name: str, phase: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = since_launch_s()
            try:
                return original(*args, **kwargs)
            finally:
                spans.setdefault(phase, [start, since_launch_s()])

        setattr(owner, name, wrapper)

    if backend == "ray":  # the local arm leaves Ray unimported, as roll-train does
        import roll_lite.workers.cluster

        timed(roll_lite.workers.cluster, "start_ray", "Ray / local start")
    timed(roll_lite.workers.local, "start_local", "Ray / local start")
    timed(roll_lite.cli, "check_run", "config checks (model config, tokenizer)")
    timed(roll_lite.pipelines.ppo.PPOPipeline, "prepare_data", "prompt data (read, tokenize)")
    timed(roll_lite.pipelines.ppo.PPOPipeline, "evaluate", "step-0 evaluation")
    timed(roll_lite.pipelines.ppo.PPOPipeline, "step", "first step")
    group_init, wait_ready = roll_lite.workers.group.ModelGroup.__init__, roll_lite.workers.group.ModelGroup.wait_ready
    calls_get = roll_lite.workers.group.WorkerCalls.get

    def init(self, role, *args, **kwargs):  # the worker processes start here (Ray: in the background)
        if role == "actor":
            spans.setdefault("actor launched", [since_launch_s()] * 2)
        group_init(self, role, *args, **kwargs)

    def get(self, refs, method):  # Ray: the actor's first answer (its address) is its process up and running
        values = calls_get(self, refs, method)
        if self.role == "actor" and method == "address":
            spans.setdefault("actor answered", [since_launch_s()] * 2)
        return values

    def ready(self):
        start = since_launch_s()
        group = wait_ready(self)
        if self.role == "actor":
            spans.setdefault("actor ready", [start, since_launch_s()])
        return group

    roll_lite.workers.group.ModelGroup.__init__ = init
    roll_lite.workers.group.ModelGroup.wait_ready = ready
    roll_lite.workers.group.WorkerCalls.get = get
    code = roll_lite.cli.main(grpo_args(model, work, backend, threads))
    if code:
        raise SystemExit(f"roll-train ({backend}) exited {code}")
    launched = spans["actor launched"][0]
    answered = spans.get("actor answered", [launched])[0]  # local: no process to wait for
    phases = {"python start": marks["python start"]}
    names = list(marks)
    for before, name in zip(names, names[1:]):
        phases[name] = marks[name] - marks[before]
    for phase in ("config checks (model config, tokenizer)", "prompt data (read, tokenize)", "Ray / local start"):
        phases[phase] = spans[phase][1] - spans[phase][0]
    phases["actor worker process"] = answered - launched
    phases["actor model build + load"] = spans["actor ready"][1] - answered
    phases["step-0 evaluation"] = spans["step-0 evaluation"][1] - spans["step-0 evaluation"][0]
    phases["first step"] = spans["first step"][1] - spans["first step"][0]
    total = spans["first step"][1]
    phases["other"] = total - sum(phases.values())
    phases["launch -> first step"] = total
    phases["ray imported"] = float("ray" in sys.modules)
    phases["model module imported"] = float("transformers.models.qwen2.modeling_qwen2" in sys.modules)
    return phases


def run_trl(model: str, work: str, threads: int) -> dict[str, float]:
    out = subprocess.run(
        [str(TRL_PYTHON), str(REPO / "benchmarks/trl_grpo.py"), "--model", model, "--steps", "1", "--threads",
         str(threads), "--output-dir", f"{work}/trl", "--train", str(REPO / "data/reverse_digits/train.jsonl"),
         "--eval", str(REPO / "data/reverse_digits/eval.jsonl")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode:
        raise SystemExit(f"benchmarks/trl_grpo.py failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    imported, evaluated, first = result["imported_s"], result["evaluations"][0][1], result["first_step_end_s"]
    return {
        TRL_PHASES[0]: imported,
        TRL_PHASES[1]: evaluated - imported,
        TRL_PHASES[2]: first - evaluated,
        "launch -> first step": first,
    }


def launch(backend: str, model: str, work: str, threads: int) -> dict[str, float]:
    start = time.perf_counter()  # "launch -> exit": from here (the spawn included) to the process's end
    if backend == "trl":
        return {**run_trl(model, work, threads), "launch -> exit": time.perf_counter() - start}
    command = [sys.executable, __file__, "--one", backend, "--model", model, "--work", work, "--threads", str(threads)]
    out = subprocess.run(command, capture_output=True, text=True, cwd=work, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode:
        raise SystemExit(f"the {backend} run failed:\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "launch -> exit": time.perf_counter() - start}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} [{min(values):.2f}-{max(values):.2f}]"


def print_table(results: dict[str, list[dict[str, float]]]) -> None:
    rows = [p for p in PHASES if any(p in r for runs in results.values() for r in runs)]
    at = rows.index("launch -> first step")
    rows[at:at] = [p for p in TRL_PHASES if "trl" in results]
    width = max(map(len, rows)) + 2
    print(f"\n{'seconds since launch':<{width}}" + "".join(f"{b:>22}" for b in results))
    for phase in rows:
        cells = [summary([r[phase] for r in runs]) if phase in runs[0] else "" for runs in results.values()]
        print(f"{phase:<{width}}" + "".join(f"{c:>22}" for c in cells))
    if "ray" in results and "local" in results:
        ratios = [local["launch -> first step"] / ray["launch -> first step"]
                  for ray, local in zip(results["ray"], results["local"])]  # fmt: skip
        print(f"local / ray, launch -> first step, per round: {summary(ratios)}")
    if "local" in results:
        print("ray imported by the local run:", "yes" if any(r["ray imported"] for r in results["local"]) else "no")
    if "ray" in results:
        driver = "yes" if any(r["model module imported"] for r in results["ray"]) else "no"
        print("the Qwen2 model's module imported by the Ray driver:", driver)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="ray,local,trl", help="comma-separated: ray, local, trl")
    parser.add_argument("--model", help="a warm start (HF folder with its tokenizer); made when left out")
    parser.add_argument("--sft-steps", type=int, default=600, help="the warm start's SFT steps, without --model")
    parser.add_argument("--threads", type=int, default=2, help="the actor's torch threads (TRL's too)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a single run in this process: ray or local
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.model, args.work, args.threads)))
        return
    backends = args.backends.split(",")
    if unknown := set(backends) - {"ray", "local", "trl"}:
        raise SystemExit(f"--backends: unknown {sorted(unknown)}; use ray, local, trl")
    if "trl" in backends and not TRL_PYTHON.exists():
        raise SystemExit(f"--backends trl needs {TRL_PYTHON}: run benchmarks/vs_trl.py once to make it")
    with tempfile.TemporaryDirectory() as work:
        model = args.model
        if model is None:
            from vs_trl import warm_start

            model = str(warm_start(Path(work), args.sft_steps))
        results: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
        for round_ in range(args.rounds):
            for backend in backends:
                run_dir = Path(work) / f"r{round_}_{backend}"
                run_dir.mkdir()
                start = time.perf_counter()
                results[backend].append(launch(backend, model, str(run_dir), args.threads))
                print(f"round {round_ + 1} {backend}: {time.perf_counter() - start:.1f} s", flush=True)
        print_table(results)


if __name__ == "__main__":
    main()
