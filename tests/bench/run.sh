#!/usr/bin/env bash
# tests/bench/run.sh: `make bench` — meshc compile times, training steps,
# the communicators' bandwidth and (make CUDA=1 bench, GPU_BENCH) the CUDA
# kernels', measured side by side in one run (best of 3 wall-clock runs
# each; machines are noisy, so read the ratios, not the absolute times).
# Not a test: nothing here fails on a number.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
MESHC=${MESHC:-build/meshc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

best_of_3() {
    local best="" t
    for _ in 1 2 3; do
        local s e
        s=$(date +%s.%N)
        "$@" >/dev/null 2>&1 || { echo "FAILED: $*" >&2; return 1; }
        e=$(date +%s.%N)
        t=$(awk -v s="$s" -v e="$e" 'BEGIN { print e - s }')
        if [ -z "$best" ] || awk -v t="$t" -v b="$best" 'BEGIN { exit !(t < b) }'; then best=$t; fi
    done
    printf '%.3f' "$best"
}

printf '%-44s %10s  %s\n' "input" "seconds" "what meshc reports"
for f in examples/*.mesh tests/bench/gpt3-175b.mesh; do
    t=$(best_of_3 "$MESHC" -o "$tmp/t.plan" "$f") || exit 1
    check=$("$MESHC" -o "$tmp/t.plan" "$f" 2>/dev/null | sed -n 's/^  check: *//p')
    printf '%-44s %10s  %s\n' "$f" "$t" "$check"
done
t=$(best_of_3 "$MESHC" --stats tests/bench/gpt3-175b.mesh) || exit 1
printf '%-44s %10s\n' "gpt3-175b --stats" "$t"
"$MESHC" --stats tests/bench/gpt3-175b.mesh 2>/dev/null | sed -n '1,4p;/^pipeline/p'

# plan file sizes: SPMD, so they do not grow with dp, tp or ep
printf '\n%-44s %12s\n' "plan file" "bytes"
for f in examples/gpt2.mesh tests/bench/gpt3-175b.mesh; do
    "$MESHC" -o "$tmp/p.plan" "$f" >/dev/null 2>&1 || { echo "FAILED: $f" >&2; exit 1; }
    printf '%-44s %12s\n' "$f" "$(wc -c <"$tmp/p.plan")"
done
"$MESHC" -o "$tmp/p.plan" --set mesh.dp=2 --set train.global_batch=128 tests/bench/gpt3-175b.mesh >/dev/null 2>&1
printf '%-44s %12s\n' "gpt3-175b with dp 2 instead of 24" "$(wc -c <"$tmp/p.plan")"

# CPU training on one rank: ms/step and tokens/s next to the GEMM-only
# limit measured in the same run (tests/bench/train_bench.c).
TRAIN_BENCH=${TRAIN_BENCH:-build/train_bench}
printf '\n%-28s %11s %6s %9s %10s %9s %8s %6s\n' "plan" "params" "tokens" "ms/step" "tok/s" \
    "sgemm GF/s" "limit ms" "ratio"
"$MESHC" -o "$tmp/tiny.plan" examples/gpt-tiny.mesh >/dev/null 2>&1 &&
    (cd "$tmp" && "$OLDPWD/$TRAIN_BENCH" tiny.plan 20) || exit 1
"$MESHC" -o "$tmp/gpt2-b4t64.plan" examples/gpt2.mesh --set mesh.dp=1 --set mesh.tp=1 --set mesh.pp=1 \
    --set train.global_batch=4 --set train.micro_batch=4 --set train.seq_len=64 --set train.zero=0 \
    --set train.precision=fp32 >/dev/null 2>&1 &&
    (cd "$tmp" && "$OLDPWD/$TRAIN_BENCH" gpt2-b4t64.plan 3) || exit 1
echo "ratio: the step's time over the GEMM-only limit (6 x params x tokens FLOPs at the sgemm rate)"

# gpt-tiny (global batch 16 x 64) on 1, 2 and 4 ranks, threads of one
# process sharing this machine's cores (the kernels' threads divided among
# the ranks)
printf '\n%-28s %5s %4s %4s %9s %10s %11s %6s\n' "plan" "ranks" "dp" "tp" "ms/step" "tok/s" "no-overlap" "ratio"
for m in 2x1 4x1 1x2 2x2; do # one rank: the table above
    "$MESHC" -o "$tmp/tiny-$m.plan" examples/gpt-tiny.mesh --set mesh.dp=${m%x*} --set mesh.tp=${m#*x} >/dev/null 2>&1 &&
        (cd "$tmp" && "$OLDPWD/$TRAIN_BENCH" "tiny-$m.plan" 20) || exit 1
done
# a larger model, where the gradient sync is worth hiding: GPT-2 small's
# width with 4 layers, dp 2 (ZeRO 0, 1, and 3: its gathers a layer ahead)
for z in 0 1 3; do
    "$MESHC" -o "$tmp/gpt2-4l-dp2-z$z.plan" examples/gpt2.mesh --set model.layers=4 --set mesh.dp=2 --set mesh.tp=1 \
        --set mesh.pp=1 --set train.global_batch=4 --set train.micro_batch=2 --set train.seq_len=64 \
        --set train.zero=$z --set train.precision=fp32 >/dev/null 2>&1 &&
        (cd "$tmp" && "$OLDPWD/$TRAIN_BENCH" "gpt2-4l-dp2-z$z.plan" 3) || exit 1
done
echo "ratio: ms/step with the gradient sync overlapped with backward over ms/step with it after backward"

# the threads communicator's bandwidth, next to memcpy's (tests/bench/comm_bench.c)
echo
COMM_BENCH=${COMM_BENCH:-build/comm_bench}
"$COMM_BENCH" 64 || exit 1

# the same collectives between processes: MPI (mpirun, Open MPI's shared
# memory transport) and TCP (torchrun's variables, over loopback)
if command -v mpirun >/dev/null 2>&1; then
    for n in 2 4; do
        echo
        env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
            OMPI_MCA_btl=self,vader mpirun -n $n "$COMM_BENCH" --world 64 || exit 1
    done
else
    echo "SKIP the MPI communicator's bandwidth: no mpirun (make deps installs Open MPI)"
fi
echo
port=$((20000 + $$ % 9000))
for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$COMM_BENCH" --world 64 >"$tmp/comm_bench_tcp.$r" 2>&1 &
done
wait
cat "$tmp/comm_bench_tcp.0"

# the CUDA kernels against cuBLAS(Lt) and a device-to-device copy, side by
# side (tests/gpu/gpu_bench.c: GEMM TFLOP/s and our path's share of raw
# cuBLASLt's, the goal being 85%; attention TFLOP/s; memory-bound kernels'
# share of the copy's GB/s): with CUDA=1 (make CUDA=1 bench), on a GPU
echo
if [ -n "${GPU_BENCH:-}" ]; then
    "$GPU_BENCH" || exit 1
else
    echo "SKIP the CUDA kernels' benchmark: built without CUDA (make CUDA=1 bench builds and runs tests/gpu/gpu_bench)"
fi
