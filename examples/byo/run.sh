#!/usr/bin/env bash
# The byo example end to end, from the repository root with the venv active:
#   build (data, tokenizer, base model) -> held-out reward of the base model -> SFT -> GRPO.
# Arguments are passed to every roll-train as overrides, e.g. workers.torch_threads=1 on a busy
# machine. Prints each stage's wall time. Outputs: outputs/byo (assets), outputs/byo_{base,sft,grpo} (runs);
# it starts afresh: the previous run.sh's outputs are replaced (a run directory is otherwise never
# overwritten: roll-train would resume it or refuse).
set -euo pipefail
cd "$(dirname "$0")/../.."

stage() {  # stage NAME COMMAND...: run it and report its wall time
  local name=$1 start=$SECONDS
  shift
  echo "== $name: $*"
  "$@"
  echo "== $name: $((SECONDS - start)) s"
}

rm -rf outputs/byo_base outputs/byo_sft outputs/byo_grpo
stage build python -m examples.byo.build outputs/byo --overwrite
stage base-eval roll-train --config examples/byo/grpo.yaml model.pretrained_path=outputs/byo/base \
  run_name=byo_base steps=0 save_model=false "$@"
stage sft roll-train --config examples/byo/sft.yaml "$@"
stage grpo roll-train --config examples/byo/grpo.yaml "$@"
echo "== total: $SECONDS s"
