#!/usr/bin/env bash
# tests/gpu/emu/meshrun.sh BUILD: meshrun --device cuda as a user runs it,
# on the emulation (BUILD/meshrun_emu: the CUDA executor, its kernels and
# NCCL emulated), with 4 ranks as threads, a GPU each: gpt-tiny on dp 1 x
# tp 2 x pp 2 in bf16 (tensor-parallel all-reduces and pipeline transfers
# over NCCL) trains 2 steps with a validation and a checkpoint, then
# resumes from it for a third; its losses and validation losses must be
# the CPU's (meshrun --device cpu, the same plan) within 2e-2 relative.
# Ends with `# N passed, N failed`; exits 1 if any failed.
set -u
B=${1:?usage: meshrun.sh BUILD}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1 MESH_EMU_GPUS=4 MESH_COLLECTIVE_TIMEOUT_S=60
passed=0
failed=0

check() { # check WHAT CONDITION-STATUS
    if [ "$2" -eq 0 ]; then
        echo "ok - $1"
        passed=$((passed + 1))
    else
        echo "not ok - $1"
        failed=$((failed + 1))
    fi
}

# the `loss` and `val loss` figures of a meshrun log, one per line: "STEP
# LOSS", "STEPv VAL_LOSS"
losses() {
    sed -n -e 's/^step \([0-9]*\)\/[0-9]* | loss \([0-9.]*\) .*/\1 \2/p' \
        -e 's/^step \([0-9]*\)\/[0-9]* | val loss \([0-9.]*\).*/\1v \2/p' "$1"
}

"$B/meshrun_emu" tokenize examples/data/devils-dictionary.txt -o "$T/train.bin" --val "$T/val.bin" >/dev/null
"$B/meshc" --set mesh.tp=2 --set mesh.pp=2 --set train.global_batch=4 --set train.micro_batch=2 \
    --set train.precision=bf16 --set train.log_every=1 examples/gpt-tiny.mesh -o "$T/tp2pp2.plan" >/dev/null
check "meshc compiles gpt-tiny on tp 2 x pp 2" $?

run() { # run LOG ARGS...: meshrun_emu on the plan, its output in LOG
    local log=$1
    shift
    timeout 300 "$B/meshrun_emu" "$T/tp2pp2.plan" --data "$T/train.bin" --val "$T/val.bin" "$@" >"$log" 2>&1
    local rc=$?
    [ "$rc" -eq 0 ] || { echo "# meshrun $* exited with $rc:"; sed 's/^/#   /' "$log"; }
    return "$rc"
}

run "$T/cpu2.log" --device cpu --steps 2 && run "$T/cpu3.log" --device cpu --steps 3
check "the CPU trains 2 steps, and 3" $?
cat "$T/cpu2.log" "$T/cpu3.log" >"$T/cpu.log"
run "$T/gpu.log" --device cuda --steps 2 --checkpoint "$T/ck"
check "4 emulated GPUs train 2 steps over NCCL, validate and save a checkpoint" $?
grep -q 'running on NVIDIA H200 (CPU emulation' "$T/gpu.log"
check "meshrun says it runs on the (emulated) GPU" $?
run "$T/resume.log" --device cuda --steps 3 --checkpoint "$T/ck" --resume
check "they resume from the checkpoint for a third step" $?
grep -q 'resumed from .* after step 2' "$T/resume.log"
check "meshrun says it resumed after step 2" $?

# every figure of the GPU runs next to the CPU's
cat "$T/gpu.log" "$T/resume.log" >"$T/both.log"
bad=0
n=0
while read -r step value; do
    want=$(losses "$T/cpu.log" | awk -v s="$step" '$1 == s { print $2; exit }')
    n=$((n + 1))
    if [ -z "$want" ] || ! awk -v g="$value" -v w="$want" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(d <= 2e-2 * w) }'; then
        echo "# step $step: ${value} on the GPUs, ${want:-nothing} on the CPU"
        bad=1
    fi
done < <(losses "$T/both.log")
[ "$n" -eq 5 ] || { echo "# $n losses on the GPUs, not 5"; bad=1; }
check "their $n losses and validation losses are the CPU's within 2e-2" $bad
echo "# $passed passed, $failed failed"
[ "$failed" -eq 0 ]
