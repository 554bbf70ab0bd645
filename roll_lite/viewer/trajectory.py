"""One traced sample as roll-view opens it: its header values, its reward sources, and its response cut
into parts (single-turn: one; multi-turn: each model turn, then the environment's reply), each token
with its text and values (advantage, log-prob gap, engine log-prob, weight version, trained or not)."""

from __future__ import annotations

from typing import Any

from roll_lite.viewer.runs import clean, prompt_key, prompt_text
from roll_lite.viewer.tokens import TokenTexts

PER_TOKEN = ("token_advantages", "log_prob_gap", "engine_log_probs", "weight_versions", "loss_mask")
HEADER = ("step", "sample", "group", "reward", "advantage", "scored", "answer", "end", "fault", "margin")


def trajectory(row: dict[str, Any], step: int, tokens: TokenTexts) -> dict[str, Any]:
    ids = row.get("response_ids") or row.get("ids") or []
    texts = tokens.texts(ids) if ids else []
    notes = [tokens.problem] if texts is None and tokens.problem else []
    # those every RL step writes (the log-prob gap only where the step computes the trainer's log-probs)
    expected = ("token_advantages", "weight_versions", "loss_mask") if row.get("response_ids") is not None else ()
    missing = [name for name in expected if name not in row]
    if missing:
        notes.append(f"this trace has no {', '.join(missing)}: those colours are off")
    values = {name: row.get(name) or [] for name in PER_TOKEN}
    cells = [
        {
            "id": token,
            "text": texts[i] if texts else f"[{token}]",
            "advantage": at(values["token_advantages"], i),
            "gap": at(values["log_prob_gap"], i),
            "logp": at(values["engine_log_probs"], i),
            "version": at(values["weight_versions"], i),
            "trained": at(values["loss_mask"], i),
        }
        for i, token in enumerate(ids)
    ]
    parts = []
    if row.get("turns"):  # multi-turn: the turns' ids and reply_ids, in order, are the response's
        position = 0
        for number, turn in enumerate(row["turns"], 1):
            for kind, key, text in (("model", "ids", "text"), ("environment", "reply_ids", "reply")):
                count = len(turn.get(key) or [])
                if kind == "environment" and turn.get(text) is None and not count:
                    continue  # no reply after the last turn
                part = {
                    "kind": kind,
                    "turn": number,
                    "text": turn.get(text),
                    "tokens": cells[position : position + count],
                }
                if kind == "model":
                    part.update(
                        reward=clean(turn.get("reward")),
                        version=turn.get("weight_version"),
                        metrics=turn.get("metrics"),
                    )
                parts.append(part)
                position += count
        if position != len(cells):
            notes.append(f"the turns hold {position} tokens, the response {len(cells)}: the trace is inconsistent")
    elif cells:
        parts.append({"kind": "sequence" if "ids" in row else "model", "turn": None, "text": None, "tokens": cells})
    return {
        "header": {name: clean(row.get(name)) for name in HEADER if name in row} | {"step": row.get("step", step)},
        "prompt": prompt_text(row.get("prompt")),
        "prompt_key": prompt_key(row.get("prompt")),
        "sources": row.get("reward_sources") or [],
        "pairs": {name: row[name] for name in ("chosen", "rejected") if row.get(name) is not None},
        "parts": parts,
        "notes": notes,
    }


def at(values: list, i: int) -> Any:
    return clean(values[i]) if i < len(values) else None
