#!/usr/bin/env bash
# tests/torch/gpt2-124m.sh [BUILD]: GPT-2 124M itself against PyTorch
# (`make torch-gpt2`; some 4.5 minutes on 2 cores, 5 GB of memory, 3 GB of
# disk). examples/gpt2.mesh at its full size (12 layers, 768 wide,
# vocabulary 50257 padded to 50304, T = 1024) on one rank in fp32, B = 2:
# meshrun trains a step into a checkpoint and 2 more from it, logging each;
# check_train.py trains those 2 in PyTorch (float64) from that checkpoint
# and compares. The make test cases are these models shrunk; this one is
# the size the GPU benchmark times. Prints check_train's lines and exits
# with its status.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
B=${1:-build}
. tests/torch/lib.sh # torch_python
PY=$(torch_python) || { echo "gpt2-124m: no python3 imports torch (make deps installs python3-torch)"; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mesh-gpt2-124m.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
set -e
"$B/meshrun" tokenize examples/data/devils-dictionary.txt -o "$TMP/dd.bin" >/dev/null
"$B/meshc" -o "$TMP/gpt2.plan" examples/gpt2.mesh --set mesh.dp=1 --set mesh.tp=1 --set mesh.pp=1 \
    --set train.zero=0 --set train.precision=fp32 --set train.global_batch=2 --set train.micro_batch=2 \
    --set train.steps=100 --set train.log_every=1 --set train.checkpoint_every=0 \
    "--set=train.lr_schedule=cosine(warmup: 2, min_lr: 6e-5)" >/dev/null
run() { "$B/meshrun" "$TMP/gpt2.plan" --data "$TMP/dd.bin" --val "$TMP/dd.bin" "$@" | grep '^step'; }
run --steps 1 --checkpoint "$TMP/ck0"
cp -r "$TMP/ck0" "$TMP/ck"
run --steps 3 --checkpoint "$TMP/ck" --resume --metrics "$TMP/m.jsonl"
"$PY" tests/torch/check_train.py --plan "$TMP/gpt2.plan" --data "$TMP/dd.bin" \
    --from "$TMP/ck0" --to "$TMP/ck" --metrics "$TMP/m.jsonl"
