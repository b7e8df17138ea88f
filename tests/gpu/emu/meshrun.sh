#!/usr/bin/env bash
# tests/gpu/emu/meshrun.sh BUILD: meshrun on GPUs as a user runs it, on
# the emulation (BUILD/meshrun_emu: the CUDA executor, its kernels and
# NCCL emulated), with 4 ranks as threads, a GPU each (--device auto, the
# default, finding them; --device cuda for the resume): gpt-tiny on dp 1 x
# tp 2 x pp 2 in bf16 (tensor-parallel all-reduces and pipeline transfers
# over NCCL) trains 2 steps with a validation and a checkpoint, then
# resumes from it for a third; its losses and validation losses must be
# the CPU's (meshrun --device cpu, the same plan) within 2e-2 relative.
# Then dp 2 with ZeRO-3 in fp32 on 2 GPUs, its collectives overlapped on
# a communication thread's NCCL world (bucketed gradient reduce-scatters
# during backward, the next layer's parameters gathered ahead), 2 steps
# and a validation, within 1e-4 of the CPU's, and again with the 2 ranks
# sharing 1 GPU (MESH_GPU_SHARED=1: the collectives staged through host
# memory, the communication thread's copies on its own device handle,
# comm_checked_restage), and with --device auto on 1 GPU (the CPU,
# saying why; its figures): the streams run behind the
# host (the emulation's default), so an order between the compute stream
# and NCCL's that the executor forgets shows as wrong numbers.
# A small Llama and a small Mixtral on 1 GPU, 4 steps in fp32, within
# 1e-4 (moe 1e-3) of the CPU's (the Mixtral with MESH_GEMM_TUNE=1), and
# with MESH_TF32=1 within 1e-2, not fp32's bytes. The
# attention's layouts by environment (MESH_ATTN_FWD_ROWS,
# MESH_ATTN_BWD_BLOCKS, MESH_ATTN_WGMMA) and the products' tuning
# (MESH_GEMM_TUNE): the same checkpoint bytes; on the emulated cuDNN
# (MESH_ATTN_CUDNN=1, and =fwd: its forward only): within 2e-2; where
# no cuDNN loads, mesh's kernels, the defaults' bytes, saying why.
# A GPU too small (EMU_GPU_MEM_MB=34, 16): meshrun stops, naming the
# bytes (the plan's, the kernels', the device's free and total); so does
# a device full from any allocation of a bf16 step on (EMU_FAIL=malloc:N+),
# a kernel's scratch included. A kernel that faults on one of 2 GPUs: the
# job stops at once.
# Then one rank per process, as torchrun starts them, on emulated nodes
# (EMU_NCCL_NODE: their NCCL worlds meet through files, nccl_node.cpp):
# dp 2 ZeRO-3 on 2 processes (1e-4; no files left behind; and under
# mpirun), tp 2 x pp 2 in bf16 on 4 processes of 2 emulated machines of 2
# GPUs (EMU_NCCL_HOST; each machine's LOCAL_RANK from 0) (2e-2), 2
# processes on 1 GPU (both stop; rank 0 says NCCL's Duplicate GPU), a
# process killed in its first step, and one whose NCCL
# communicator fails to form (the other stops at once, naming it; not at
# its timeout).
# Ends with `# N passed, N failed`; exits 1 if any failed.
set -u
B=${1:?usage: meshrun.sh BUILD}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1 MESH_EMU_GPUS=4 MESH_COLLECTIVE_TIMEOUT_S=60
. "$(dirname "$0")/checks.sh" # check, losses, mpi_env

"$B/meshrun_emu" tokenize examples/data/devils-dictionary.txt -o "$T/train.bin" --val "$T/val.bin" >/dev/null
"$B/meshc" --set mesh.tp=2 --set mesh.pp=2 --set train.global_batch=4 --set train.micro_batch=2 \
    --set train.precision=bf16 --set train.log_every=1 examples/gpt-tiny.mesh -o "$T/tp2pp2.plan" >/dev/null
check "meshc compiles gpt-tiny on tp 2 x pp 2" $?

run() { # run LOG ARGS...: meshrun_emu on $PLAN (default tp2pp2), its output in LOG
    local log=$1
    shift
    timeout 300 "$B/meshrun_emu" "$T/${PLAN:-tp2pp2}.plan" --data "$T/train.bin" --val "$T/val.bin" "$@" >"$log" 2>&1
    local rc=$?
    [ "$rc" -eq 0 ] || { echo "# meshrun $* exited with $rc:"; sed 's/^/#   /' "$log"; }
    return "$rc"
}

run "$T/cpu2.log" --device cpu --steps 2 && run "$T/cpu3.log" --device cpu --steps 3
check "the CPU trains 2 steps, and 3" $?
cat "$T/cpu2.log" "$T/cpu3.log" >"$T/cpu.log"
run "$T/gpu.log" --steps 2 --checkpoint "$T/ck" --profile
check "4 emulated GPUs train 2 steps over NCCL (--device auto, the default), validate and save a checkpoint" $?
grep -q '^meshrun: a GPU is present: running on NVIDIA H200 (CPU emulation.*) (--device cpu trains on the CPU)$' "$T/gpu.log"
check "meshrun says it runs on the (emulated) GPU it found" $?
grep "^meshrun: time rank 0's collectives took per step in its turn, on the GPU:" "$T/gpu.log" |
    grep -q ' all-reduce(tp) [0-9]*\.[0-9][0-9] ms, .*send(pp) [0-9]*\.[0-9][0-9] ms'
check "meshrun says how long rank 0's tp sums and pipeline transfers took on the GPU (timed events)" $?
grep -q "^meshrun: profile of rank 0's steps after the first (1), the GPU's time from CUDA events, per step:$" "$T/gpu.log" &&
    grep -Eq '^meshrun:   attention backward +[0-9]+\.[0-9]{3} +[0-9.]+% +[0-9]+\.[0-9] +[0-9]+\.[0-9]{2}$' "$T/gpu.log" &&
    grep -Eq '^meshrun:   collectives in turn +[0-9]+\.[0-9]{3} ' "$T/gpu.log" &&
    grep -q "^meshrun:   all of the above .* (the rest: the GPU idle: the host behind, waits for other streams)$" "$T/gpu.log"
check "meshrun --profile splits rank 0's second step by kind of work on the GPU (timed events)" $?
kb=$(sed -n "s/^meshrun: rank 0's kernels held [0-9.]* MB (\([0-9]*\) bytes) of device memory beside the arena, which the plan does not predict (cuBLASLt's workspace, their scratch at its largest)$/\1/p" "$T/gpu.log")
[ -n "$kb" ] && [ "$kb" -gt 33554432 ] && ! grep -q "kernels held" "$T/cpu2.log"
check "meshrun says what rank 0's kernels held beside the arena on the GPU (${kb:-no} bytes: cuBLASLt's 33554432 and scratch), and nothing on the CPU" $?
run "$T/resume.log" --device cuda --steps 3 --checkpoint "$T/ck" --resume
check "they resume from the checkpoint for a third step" $?
grep -q 'resumed from .* after step 2' "$T/resume.log"
check "meshrun says it resumed after step 2" $?
grep -q '^meshrun: the GPU was asked for: running on NVIDIA H200 (CPU emulation' "$T/resume.log"
check "meshrun --device cuda says the GPU was asked for" $?

# same GPU CPU TOL N: every figure of log GPU next to log CPU's, within
# TOL relative; N figures
same() {
    local bad=0 n=0 step value want
    while read -r step value; do
        want=$(losses "$2" | awk -v s="$step" '$1 == s { print $2; exit }')
        n=$((n + 1))
        if [ -z "$want" ] || ! awk -v g="$value" -v w="$want" -v t="$3" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(d <= t * w) }'; then
            echo "# step $step: ${value} on the GPUs, ${want:-nothing} on the CPU"
            bad=1
        fi
    done < <(losses "$1")
    [ "$n" -eq "$4" ] || { echo "# $n losses on the GPUs, not $4"; bad=1; }
    return "$bad"
}
cat "$T/gpu.log" "$T/resume.log" >"$T/both.log"
same "$T/both.log" "$T/cpu.log" 2e-2 5
check "their 5 losses and validation losses are the CPU's within 2e-2" $?

"$B/meshc" --set mesh.dp=2 --set train.zero=3 --set train.global_batch=4 --set train.log_every=1 \
    examples/gpt-tiny.mesh -o "$T/dp2z3.plan" >/dev/null
check "meshc compiles gpt-tiny on dp 2 with ZeRO-3" $?
PLAN=dp2z3 run "$T/z3cpu.log" --device cpu --steps 2
check "the CPU trains it 2 steps" $?
MESH_EMU_GPUS=2 PLAN=dp2z3 run "$T/z3gpu.log" --device cuda --steps 2
check "2 emulated GPUs train it 2 steps, ZeRO-3 over NCCL" $?
grep -q 'overlap: [0-9]* collectives a step run on a communication thread' "$T/z3gpu.log" &&
    grep -q "^meshrun: overlap: rank 0's collectives on its communication stream ran [0-9.]* ms a step on the GPU; the rank waited for them [0-9.]* ms (its compute stream on the GPU, its host until each was enqueued: [0-9]*% hidden behind compute)$" "$T/z3gpu.log" &&
    awk '/^meshrun: overlap: rank 0.s collectives/ { ran = $11 } END { exit !(ran + 0 > 0) }' "$T/z3gpu.log"
check "meshrun says the collectives overlap compute, and how long they ran on the GPU (timed events), and the rank waited" $?
same "$T/z3gpu.log" "$T/z3cpu.log" 1e-4 3
check "their 3 losses and validation losses are the CPU's within 1e-4" $?
MESH_GPU_SHARED=1 MESH_EMU_GPUS=1 PLAN=dp2z3 run "$T/z3shared.log" --device cuda --steps 2
check "2 ranks sharing 1 emulated GPU train it 2 steps, collectives staged through host memory" $?
same "$T/z3shared.log" "$T/z3cpu.log" 1e-4 3
check "theirs too" $?
MESH_EMU_GPUS=1 PLAN=dp2z3 run "$T/z3auto.log" --steps 2 &&
    grep -qx "meshrun: 2 ranks as threads of one process need a GPU each, and this process sees 1: running on the CPU (--device cuda with MESH_GPU_SHARED=1 shares the GPUs)" "$T/z3auto.log"
check "--device auto with 2 ranks as threads and 1 emulated GPU: the CPU, saying why" $?
same "$T/z3auto.log" "$T/z3cpu.log" 0 3
check "its 3 losses are the CPU's, the same figures" $?

# The Llama and Mixtral blocks on one GPU (rmsnorm, rope, grouped-query
# attention, SwiGLU; a router, top-2 experts, their permutation): small
# ones (tests/gpu/run.sh's train_equiv sizes) at a learning rate that
# moves them (the loss 5.64 to about 4 in 4 steps: at a warm-up's rates a
# rope turning the wrong way changed it by 5e-5 only), 4 steps and a
# validation in fp32, within 1e-4 of the CPU (moe 1e-3: a token whose two
# best experts are nearly tied may pick the other one)
small=(--set model.dim=64 --set model.layers=2 --set model.heads=4 --set model.kv_heads=2 --set model.vocab=256
    --set mesh.dp=1 --set mesh.tp=1 --set mesh.pp=1 --set train.global_batch=8 --set train.seq_len=64
    --set train.precision=fp32 --set train.zero=0 --set 'train.optimizer=adamw(lr: 1e-2)'
    --set 'train.lr_schedule=cosine(warmup: 1, min_lr: 1e-3)' --set train.log_every=1)
"$B/meshc" "${small[@]}" --set model.ffn_dim=192 --set train.schedule=1f1b --set train.virtual_stages=1 \
    examples/llama.mesh -o "$T/llama.plan" >/dev/null 2>&1 &&
    "$B/meshc" "${small[@]}" --set model.ffn_dim=128 --set model.experts=4 --set mesh.ep=1 --set train.micro_batch=4 \
        examples/moe.mesh -o "$T/moe.plan" >/dev/null 2>&1
check "meshc compiles a small Llama and a small Mixtral" $?
for m in llama moe; do
    tol=1e-4
    [ $m = moe ] && tol=1e-3
    # (the moe on the GPU with its products tuned, MESH_GEMM_TUNE=1: its
    # experts' batched products too)
    tune=0 what=""
    [ $m = moe ] && tune=1 what=", the GPU's products tuned"
    PLAN=$m run "$T/$m-cpu.log" --device cpu --steps 4 &&
        MESH_EMU_GPUS=1 MESH_GEMM_TUNE=$tune PLAN=$m run "$T/$m-gpu.log" --device cuda --steps 4 \
            --checkpoint "$T/$m-gpu"
    check "the CPU and 1 emulated GPU train the small $m 4 steps$what" $?
    same "$T/$m-gpu.log" "$T/$m-cpu.log" $tol 5
    check "its 4 losses and validation loss on the GPU are the CPU's within $tol" $?
    # MESH_TF32=1: its fp32 products (the linear layers', the experts',
    # the attention's tiles) on TF32 tensor cores, whose operands the
    # emulated cuBLASLt and mma.m16n8k8 take with 10 bits of mantissa:
    # within 1e-2 of the CPU's losses, not the fp32 run's checkpoint
    # bytes, and meshrun says so (the fp32 run does not)
    MESH_EMU_GPUS=1 MESH_TF32=1 PLAN=$m run "$T/$m-tf32.log" --device cuda --steps 4 --checkpoint "$T/$m-tf32" &&
        same "$T/$m-tf32.log" "$T/$m-cpu.log" 1e-2 5 &&
        ! diff -r "$T/$m-gpu" "$T/$m-tf32" >/dev/null &&
        grep -q "^meshrun: fp32: the products (linear layers, experts, the attention's tiles) on TF32 tensor cores (MESH_TF32=1): " \
            "$T/$m-tf32.log" && ! grep -q "TF32" "$T/$m-gpu.log"
    check "MESH_TF32=1: the small $m's 4 steps within 1e-2 of the CPU's, not fp32's bytes, and meshrun says so" $?
done

# The attention's layouts gpu_bench compares, by environment
# (MESH_ATTN_FWD_ROWS=128: the forward's blocks of 128 query rows;
# MESH_ATTN_BWD_BLOCKS=1: the backward's kernels compiled for more blocks
# an SM, at head size 64; MESH_ATTN_WGMMA=1: the forward on warpgroup
# products, whose bits only the emulation promises to be the same), and
# MESH_GEMM_TUNE=1 (each product's cuBLASLt algorithm timed among those
# with the default's bits; the emulated heuristic offers some without):
# gpt-tiny with one head of 64 in bf16 trains 2 steps to the same
# checkpoint bytes as with the defaults; a value of neither kind is a
# clear error
"$B/meshc" --set model.heads=1 --set train.precision=bf16 --set train.global_batch=4 --set train.micro_batch=4 \
    examples/gpt-tiny.mesh -o "$T/h64.plan" >/dev/null
check "meshc compiles gpt-tiny with one head of 64 in bf16" $?
MESH_EMU_GPUS=1 PLAN=h64 run "$T/h64a.log" --device cuda --steps 2 --checkpoint "$T/h64a" &&
    MESH_EMU_GPUS=1 MESH_ATTN_FWD_ROWS=128 MESH_ATTN_BWD_BLOCKS=1 MESH_GEMM_TUNE=1 PLAN=h64 run "$T/h64b.log" \
        --device cuda --steps 2 --checkpoint "$T/h64b" &&
    diff -r "$T/h64a" "$T/h64b" >/dev/null
check "MESH_ATTN_FWD_ROWS=128 MESH_ATTN_BWD_BLOCKS=1 MESH_GEMM_TUNE=1: 2 steps on 1 emulated GPU to the defaults' checkpoint bytes" $?
# (what the tuning did, in words, once at the end; nothing without it)
grep -q "^meshrun: rank 0's matmul algorithms (MESH_GEMM_TUNE=1): [1-9][0-9]* shapes tuned, .* [0-9]* too small$" \
    "$T/h64b.log" && ! grep -q "matmul algorithms" "$T/h64a.log"
check "meshrun says what MESH_GEMM_TUNE=1 did on rank 0's GPU" $?
MESH_EMU_GPUS=1 MESH_ATTN_WGMMA=1 PLAN=h64 run "$T/h64w.log" --device cuda --steps 2 --checkpoint "$T/h64w" &&
    diff -r "$T/h64a" "$T/h64w" >/dev/null
check "MESH_ATTN_WGMMA=1: 2 steps on 1 emulated GPU to the defaults' checkpoint bytes" $?
# MESH_ATTN_CUDNN=1: the attention on the emulated cuDNN (cudnn.cpp: its
# graphs' meaning, not NVIDIA's engines), forward and backward: 2 steps
# within bf16's 2e-2 of the defaults' losses, and what it did said at the end
MESH_EMU_GPUS=1 MESH_ATTN_CUDNN=1 PLAN=h64 run "$T/h64n.log" --device cuda --steps 2
check "MESH_ATTN_CUDNN=1: 2 steps on 1 emulated GPU" $?
same "$T/h64n.log" "$T/h64a.log" 2e-2 3
check "its 2 losses and validation loss are the defaults' within 2e-2" $?
grep -q "^meshrun: rank 0's attention (MESH_ATTN_CUDNN=1): cuDNN 9.19.0: [1-9][0-9]* forward and [1-9][0-9]* backward calls on it, 0 and 0 on ours; 2 plans built, 0 refused$" \
    "$T/h64n.log" && ! grep -q "rank 0's attention" "$T/h64a.log"
check "meshrun says every attention call ran on cuDNN (2 plans), and nothing without it" $?
# MESH_ATTN_CUDNN=fwd: cuDNN's forward, our backward from its lse
MESH_EMU_GPUS=1 MESH_ATTN_CUDNN=fwd PLAN=h64 run "$T/h64f.log" --device cuda --steps 2 &&
    same "$T/h64f.log" "$T/h64a.log" 2e-2 3 &&
    grep -q "^meshrun: rank 0's attention (MESH_ATTN_CUDNN=fwd): cuDNN 9.19.0: [1-9][0-9]* forward and 0 backward calls on it, 0 and [1-9][0-9]* on ours; 1 plans built, 0 refused; ours because: the forward only (the backward on ours)$" \
        "$T/h64f.log"
check "MESH_ATTN_CUDNN=fwd: 2 steps within 2e-2 of the defaults', every forward on cuDNN and every backward on ours" $?
# MESH_ATTN_CUDNN=1 where no cuDNN loads (MESH_CUDNN_LIB names no
# library, as on a GPU machine without one): the attention runs on mesh's
# kernels, to the defaults' checkpoint bytes, and meshrun says why
MESH_EMU_GPUS=1 MESH_ATTN_CUDNN=1 MESH_CUDNN_LIB="$T/no-libcudnn.so.9" PLAN=h64 run "$T/h64m.log" --device cuda \
    --steps 2 --checkpoint "$T/h64m" &&
    diff -r "$T/h64a" "$T/h64m" >/dev/null &&
    grep -q "^meshrun: rank 0's attention (MESH_ATTN_CUDNN=1): no cuDNN: 0 forward and 0 backward calls on it, [1-9][0-9]* and [1-9][0-9]* on ours; 0 plans built, 0 refused; ours because: no cuDNN (.*no-libcudnn.so.9.*)$" \
        "$T/h64m.log"
check "MESH_ATTN_CUDNN=1 without a cuDNN to load: 2 steps on mesh's kernels to the defaults' checkpoint bytes, meshrun saying why" $?
MESH_EMU_GPUS=1 MESH_ATTN_FWD_ROWS=96 timeout 60 "$B/meshrun_emu" "$T/h64.plan" --data "$T/train.bin" \
    --device cuda --steps 1 >"$T/h64c.log" 2>&1
[ $? -ne 0 ] && grep -q "^meshrun: error: .*MESH_ATTN_FWD_ROWS=96: expected 64 or 128$" "$T/h64c.log" &&
    MESH_EMU_GPUS=1 MESH_GEMM_TUNE=yes timeout 60 "$B/meshrun_emu" "$T/h64.plan" --data "$T/train.bin" \
        --device cuda --steps 1 >"$T/h64d.log" 2>&1
[ $? -ne 0 ] && grep -q "^meshrun: error: .*MESH_GEMM_TUNE=yes: expected 0 or 1$" "$T/h64d.log" &&
    MESH_EMU_GPUS=1 MESH_ATTN_CUDNN=bwd timeout 60 "$B/meshrun_emu" "$T/h64.plan" --data "$T/train.bin" \
        --device cuda --steps 1 >"$T/h64e.log" 2>&1
[ $? -ne 0 ] && grep -q "^meshrun: error: .*MESH_ATTN_CUDNN=bwd: expected 0, 1 or fwd$" "$T/h64e.log" &&
    MESH_EMU_GPUS=1 MESH_TF32=on timeout 60 "$B/meshrun_emu" "$T/h64.plan" --data "$T/train.bin" \
        --device cuda --steps 1 >"$T/h64t.log" 2>&1
[ $? -ne 0 ] && grep -q "^meshrun: error: .*MESH_TF32=on: expected 0 or 1$" "$T/h64t.log" &&
    MESH_EMU_GPUS=1 MESH_DETERMINISTIC=yes timeout 60 "$B/meshrun_emu" "$T/h64.plan" --data "$T/train.bin" \
        --device cuda --steps 1 >"$T/h64g.log" 2>&1
[ $? -ne 0 ] && grep -q "^meshrun: error: .*MESH_DETERMINISTIC=yes: expected 0, 1 or 2$" "$T/h64g.log"
check "MESH_ATTN_FWD_ROWS=96, MESH_GEMM_TUNE=yes, MESH_ATTN_CUDNN=bwd, MESH_TF32=on, MESH_DETERMINISTIC=yes: meshrun stops, naming the variable and what it takes" $?

# The interleaved schedule over NCCL: its transfers on the pipeline's
# channels (comm_nccl_channels), as eager as the CPU's, so that 4
# micro-batches on pp 2 (two stages whose sends went out in one NCCL
# group with a receive the other posted only after its own; found by
# tests/sweep/mesh_sweep.py, refused until then) and pp 4 (the ring's
# last stage to the first) train with the CPU's losses, ordered on the
# stream and with MESH_NCCL_BLOCKING=1; and with the GPUs shared (through
# the host)
inter() { # inter PP NAME [ENV...]: 3 steps on PP emulated GPUs, the losses into $T/NAME.losses
    local pp=$1 name=$2
    shift 2
    env MESH_EMU_GPUS=4 "$@" timeout 120 "$B/meshrun_emu" "$T/inter$pp.plan" --data "$T/train.bin" --device cuda \
        --steps 3 >"$T/$name.log" 2>&1 && grep "^step" "$T/$name.log" | cut -d'|' -f2 >"$T/$name.losses" &&
        [ "$(wc -l <"$T/$name.losses")" = 2 ]
}
ok=1
for pp in 2 4; do
    "$B/meshc" --set model.layers=$((2 * pp)) --set mesh.pp=$pp --set train.schedule=interleaved \
        --set train.virtual_stages=2 --set train.micro_batch=1 --set train.global_batch=$((2 * pp)) \
        --set train.seq_len=32 examples/gpt-tiny.mesh -o "$T/inter$pp.plan" >/dev/null 2>&1 &&
        timeout 120 "$B/meshrun_emu" "$T/inter$pp.plan" --data "$T/train.bin" --device cpu --steps 3 2>&1 |
        grep "^step" | cut -d'|' -f2 >"$T/inter$pp-cpu.losses" &&
        inter $pp inter$pp && inter $pp inter$pp-blocking MESH_NCCL_BLOCKING=1 &&
        cmp -s "$T/inter$pp.losses" "$T/inter$pp-cpu.losses" &&
        cmp -s "$T/inter$pp-blocking.losses" "$T/inter$pp-cpu.losses" || { ok=0; break; }
done
[ $ok = 1 ] && inter 2 inter2-shared MESH_GPU_SHARED=1 &&
    cmp -s "$T/inter2-shared.losses" "$T/inter2-cpu.losses"
check "the interleaved schedule over NCCL on 2 and 4 GPUs (pp 2 and 4): the CPU's losses, ordered and blocking; shared GPUs too" $?

# A GPU too small (EMU_GPU_MEM_MB): meshrun stops, saying how full the
# device is and what the plan and the kernels take (for the plan's arena;
# for cuBLASLt's workspace, which comes first)
oom() { # oom MIB PATTERN
    MESH_EMU_GPUS=2 EMU_GPU_MEM_MB=$1 timeout 60 "$B/meshrun_emu" "$T/dp2z3.plan" --data "$T/train.bin" \
        --device cuda --steps 1 >"$T/oom$1.log" 2>&1
    local rc=$?
    [ "$rc" -eq 1 ] && grep -q "$2" "$T/oom$1.log" && return 0
    echo "# exit $rc:"
    sed 's/^/#   /' "$T/oom$1.log"
    return 1
}
oom 34 '^meshrun: error: .*: rank 0: cuda:0 .*: cudaMalloc: out of device memory allocating [0-9]* bytes (the plan predicts [0-9]* bytes per rank, and the kernels hold 33554432 more; the device has [0-9]* free of 35651584)$'
check "a GPU of 34 MiB: out of memory for the plan's arena, with the plan's bytes, the kernels' and the device's" $?
oom 16 "^meshrun: error: .*: rank 0: cuda:0 .*: kcuda_ctx_create: cudaMalloc (cuBLASLt's workspace): out of device memory allocating 33554432 bytes (the device has [0-9]* free of 16777216)$"
check "a GPU of 16 MiB: out of memory for cuBLASLt's workspace, with the device's bytes" $?

# The device full from the N-th allocation on (EMU_FAIL=malloc:N+: the
# runtime's second try after freeing what it can fails too), for each N
# past cuBLASLt's workspace up to one past the last allocation of a bf16
# step: every failure stops meshrun naming the bytes it could not have,
# the plan's, the kernels' and the device's, wherever it came (the arena,
# the loss's floats, a kernel's scratch, the executor's own buffers);
# and a kernel's scratch is among them; the run past the last one trains
"$B/meshc" --set train.precision=bf16 --set train.global_batch=4 --set train.micro_batch=4 \
    examples/gpt-tiny.mesh -o "$T/oomb.plan" >/dev/null
EMU_FAIL=count MESH_EMU_GPUS=1 timeout 60 "$B/meshrun_emu" "$T/oomb.plan" --data "$T/train.bin" --device cuda \
    --steps 1 >"$T/oomc.log" 2>&1
mallocs=$(sed -n 's/^emu: EMU_FAIL counts: malloc \([0-9]*\) .*/\1/p' "$T/oomc.log")
ok=0 scratch=0
if [ -n "$mallocs" ] && [ "$mallocs" -ge 3 ]; then
    ok=1
    for n in $(seq 2 $((mallocs + 1))); do
        EMU_FAIL=malloc:$n+ MESH_EMU_GPUS=1 timeout 60 "$B/meshrun_emu" "$T/oomb.plan" --data "$T/train.bin" \
            --device cuda --steps 1 >"$T/oomn.log" 2>&1
        rc=$?
        if [ "$n" -gt "$mallocs" ]; then
            [ "$rc" -eq 0 ] && grep -q "^step 1/1 " "$T/oomn.log" && continue
        elif [ "$rc" -eq 1 ] && grep -q "^meshrun: error: .*: rank 0: .*out of device memory allocating [1-9][0-9]* bytes (the plan predicts [0-9]* bytes per rank, and the kernels hold [0-9]* more; the device has [0-9]* free of [0-9]*)$" "$T/oomn.log"; then
            grep -q "the kernels' scratch (cudaMallocAsync): out of device memory" "$T/oomn.log" && scratch=1
            continue
        fi
        echo "# EMU_FAIL=malloc:$n+ of $mallocs, exit $rc:"
        sed 's/^/#   /' "$T/oomn.log"
        ok=0
    done
else
    sed 's/^/#   /' "$T/oomc.log"
fi
[ "$ok" = 1 ] && [ "$scratch" = 1 ]
check "the device full from each of a bf16 step's $mallocs allocations on: meshrun names the bytes, the plan's, the kernels' and the device's; a kernel's scratch among them" $?

# A kernel that faults on one of 2 GPUs (EMU_FAIL, fault.cpp; every kind
# of failure at many points: make gpu-emu-faults): the job stops at once,
# not at the collectives' timeout (a failed rank aborts its worlds before
# its context goes), saying what CUDA said and what it means
t0=$SECONDS
EMU_FAIL=launch:1 MESH_EMU_GPUS=2 timeout 120 "$B/meshrun_emu" "$T/dp2z3.plan" --data "$T/train.bin" \
    --device cuda --steps 1 >"$T/fault.log" 2>&1
rc=$?
gpu=$(sed -n 's/^emu: EMU_FAIL=launch:1: .* fails on device \([0-9]\)$/\1/p' "$T/fault.log")
[ "$rc" -eq 1 ] && [ $((SECONDS - t0)) -lt 30 ] && [ -n "$gpu" ] &&
    grep -q "^meshrun: error: [^:]*: rank $gpu: .*(cudaErrorIllegalAddress[^)]*): a kernel faulted on this GPU (here or earlier" \
        "$T/fault.log" || { echo "# after $((SECONDS - t0)) s:"; sed 's/^/#   /' "$T/fault.log"; false; }
check "a kernel that faults on one of 2 GPUs stops the job at once, naming its rank first, saying a kernel faulted" $?
# the same in a program embedding libmesh whose ranks ignore the failed
# step, go on for 2 more and return MESH_OK (ignoring.c): mesh_run_ranks
# still fails, naming the fault, at once; the later steps are refused, not
# run over what the failure abandoned (the 210th launch of the two
# ranks': 72 into step 2's 138, where the 300th was before the optimizer's
# launches were batched; at the 200th, just before a gradient sum, the
# other rank's error quoting this one's NCCL failure was once in 12 runs
# taken for the cause, until NCCL's failures were passed on as "rank R
# failed: ...", which comm_names_other knows: 16 of 16 since)
"$B/meshc" --set mesh.dp=2 --set train.global_batch=4 examples/gpt-tiny.mesh -o "$T/dp2.plan" >/dev/null
t0=$SECONDS
EMU_FAIL=launch:210 MESH_EMU_GPUS=2 MESH_COLLECTIVE_TIMEOUT_S=60 timeout 120 "$B/ignoring_emu" "$T/dp2.plan" 3 \
    >"$T/ignoring.log" 2>&1
rc=$?
[ "$rc" -eq 1 ] && [ $((SECONDS - t0)) -lt 30 ] &&
    gpu=$(sed -n 's/^emu: EMU_FAIL=launch:210: .* fails on device \([0-9]\)$/\1/p' "$T/ignoring.log") &&
    grep -q "^ignoring: mesh_run_ranks: another rank failed: rank $gpu: its function returned MESH_OK, but a step of it failed: .*a kernel faulted" \
        "$T/ignoring.log" && grep -q "step 3: .*(in an earlier step: this rank takes no more steps)" "$T/ignoring.log" &&
    ! grep -q "^emu: .*\(cannot reach\|not inside\|not (wholly)\)" "$T/ignoring.log" ||
    { echo "# status $rc after $((SECONDS - t0)) s:"; sed 's/^/#   /' "$T/ignoring.log"; false; }
check "ranks that ignore a failed step: mesh_run_ranks still fails at once, naming the fault; no step after it runs" $?

# One rank per process, as torchrun starts them (RANK, WORLD_SIZE,
# LOCAL_RANK, MASTER_ADDR/PORT: the TCP world, over which NCCL's id goes),
# the processes meeting through EMU_NCCL_NODE's files (nccl_node.cpp): a
# GPU each on one machine, then on two (EMU_NCCL_HOST), then two on one
# GPU, then one killed.
PORT=$((20000 + $$ % 20000))
# procs NAME N GPUS PLAN ARGS...: N processes, rank R's output in
# $T/NAME.R.log and its exit status in $T/NAME.R.rc (NO_NODE=1: without
# EMU_NCCL_NODE; MACHINES=M: on M
# emulated machines of GPUS GPUs each, N/M processes a machine, as a job
# of several nodes starts them: each machine's LOCAL_RANK from 0, its
# EMU_NCCL_HOST its own)
procs() {
    local name=$1 n=$2 gpus=$3 plan=$4 r rc=0 node per=$(($2 / ${MACHINES:-1})) host pids=() p
    shift 4
    node=$([ "${NO_NODE:-0}" = 1 ] || echo "$T/node-$name")
    PORT=$((PORT + 1))
    for ((r = 0; r < n; r++)); do
        host=$([ "${MACHINES:-1}" = 1 ] || echo "m$((r / per))")
        (EMU_NCCL_NODE="$node" EMU_NCCL_HOST="$host" MESH_EMU_GPUS=$gpus RANK=$r LOCAL_RANK=$((r % per)) \
            WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT timeout 300 "$B/meshrun_emu" "$T/$plan.plan" \
            --data "$T/train.bin" --val "$T/val.bin" --device cuda "$@" >"$T/$name.$r.log" 2>&1
            s=$?
            echo "$s" >"$T/$name.$r.rc"
            exit "$s") &
        pids+=($!)
    done
    # (each of these processes by its pid: `wait -n` would also return for
    # a job an earlier check left, and leave one of these running)
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    return "$rc"
}
shown() { # shown NAME N: every process's exit status and output, indented; fails (the check it stands in for failed)
    local r
    for ((r = 0; r < $2; r++)); do
        echo "# rank $r (exit status $(cat "$T/$1.$r.rc" 2>/dev/null || echo '?')):"
        sed 's/^/#   /' "$T/$1.$r.log"
    done
    return 1
}
procs z3procs 2 2 dp2z3 --steps 2 || shown z3procs 2
check "2 processes, a GPU each, train dp 2 ZeRO-3 2 steps over NCCL" $?
same "$T/z3procs.0.log" "$T/z3cpu.log" 1e-4 3
check "their 3 losses and validation losses are the CPU's within 1e-4" $?
[ -d "$T/node-z3procs" ] && [ -z "$(ls -A "$T/node-z3procs")" ]
check "the last process out of each world removed its files" $?
# the same under mpirun (the NCCL id over MPI; each process's GPU from
# OMPI_COMM_WORLD_LOCAL_RANK)
if command -v mpirun >/dev/null 2>&1; then
    mpi_env "$T/node-mpi" MESH_EMU_GPUS=2 \
        timeout 300 mpirun -n 2 "$B/meshrun_emu" "$T/dp2z3.plan" --data "$T/train.bin" --val "$T/val.bin" \
        --device cuda --steps 2 >"$T/z3mpi.log" 2>&1 && same "$T/z3mpi.log" "$T/z3cpu.log" 1e-4 3 ||
        { echo "# mpirun:"; sed 's/^/#   /' "$T/z3mpi.log"; false; }
    check "mpirun: 2 processes, a GPU each, train dp 2 ZeRO-3 2 steps over NCCL, within 1e-4 of the CPU" $?
    # a pipeline send that never ends (a link gone) while its rank waits
    # in MPI (the validation loss's sum): the rank's NCCL watchdog sees
    # the error and the job stops within a second or two, naming it, not
    # at the collectives' timeout (60 s here)
    "$B/meshc" --set mesh.pp=2 --set train.precision=bf16 --set train.global_batch=4 --set train.micro_batch=2 \
        --set train.eval_every=1 --set "train.val_data=\"$T/val.bin\"" examples/gpt-tiny.mesh -o "$T/pp2.plan" >/dev/null
    t0=$SECONDS
    mpi_env "$T/node-mpifail" MESH_EMU_GPUS=2 \
        EMU_FAIL=nccl:30 MESH_COLLECTIVE_TIMEOUT_S=60 timeout 120 mpirun -n 2 "$B/meshrun_emu" "$T/pp2.plan" \
        --data "$T/train.bin" --val "$T/val.bin" --device cuda --steps 3 >"$T/mpifail.log" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] && [ $((SECONDS - t0)) -lt 30 ] && grep -q "^emu: EMU_FAIL=nccl:30: " "$T/mpifail.log" &&
        grep -q "^mesh: rank [0-9].*a network failure (EMU_FAIL).*stopping the job" "$T/mpifail.log" ||
        { echo "# status $rc after $((SECONDS - t0)) s:"; sed 's/^/#   /' "$T/mpifail.log"; false; }
    check "mpirun: an NCCL operation that never ends stops the job at once, naming it" $?
else
    echo "ok - # SKIP mpirun: no mpirun (make deps installs Open MPI)"
fi
# the small Mixtral on ep 2: its all-to-alls over NCCL between processes,
# ordered on the stream, their counts checked once back
"$B/meshc" "${small[@]}" --set model.ffn_dim=128 --set model.experts=4 --set mesh.ep=2 --set train.micro_batch=4 \
    examples/moe.mesh -o "$T/moeep2.plan" >/dev/null 2>&1 && PLAN=moeep2 run "$T/moeep2-cpu.log" --device cpu --steps 2
check "meshc compiles the small Mixtral on ep 2, and the CPU trains it 2 steps" $?
procs moeep2procs 2 2 moeep2 --steps 2 || shown moeep2procs 2
check "2 processes, a GPU each, train it 2 steps, the all-to-alls over NCCL" $?
same "$T/moeep2procs.0.log" "$T/moeep2-cpu.log" 1e-3 3
check "their 3 losses and validation losses are the CPU's within 1e-3" $?
MACHINES=2 procs tp2pp2procs 4 2 tp2pp2 --steps 2 || shown tp2pp2procs 4
check "4 processes on 2 emulated machines of 2 GPUs (LOCAL_RANK 0, 1 on each) train tp 2 x pp 2 in bf16 2 steps over NCCL" $?
same "$T/tp2pp2procs.0.log" "$T/cpu2.log" 2e-2 3
check "their 3 losses and validation losses are the CPU's within 2e-2" $?
procs dup 2 1 dp2z3 --steps 2
[ $? -ne 0 ] && grep -q 'Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 0' "$T/dup.0.log" || shown dup 2
check "2 processes on 1 GPU both stop, and rank 0 says why (NCCL's Duplicate GPU)" $?
# rank 1 killed in its first step: rank 0 stops, naming it, long before
# its collective timeout (MESH_COLLECTIVE_TIMEOUT_S=60, timeout 300)
killed() { # killed NAME PLAN: rank 1 gets SIGKILL 3 s in; rank 0's status
    local r pid=()
    PORT=$((PORT + 1))
    for r in 0 1; do
        EMU_NCCL_NODE="$T/node-$1" MESH_EMU_GPUS=2 RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$PORT timeout 300 "$B/meshrun_emu" "$T/$2.plan" --data "$T/train.bin" --device cuda \
            --steps 20 >"$T/$1.$r.log" 2>&1 &
        pid+=($!)
    done
    sleep 3
    pkill -KILL -P "${pid[1]}" # (meshrun_emu, timeout's child)
    wait "${pid[1]}" 2>/dev/null # (not bash's "Killed" line)
    wait "${pid[0]}"
}
t0=$SECONDS
killed killed dp2z3
[ $? -eq 1 ] && [ $((SECONDS - t0)) -lt 60 ] && grep -q 'rank 1 failed' "$T/killed.0.log" || shown killed 2
check "a process killed in its first step stops the other, which names it" $?
# the same on tp 2, whose NCCL calls the host does not wait for (ordered
# on the compute stream): rank 0's wait for its GPU watches the NCCL world
# and the TCP one, and ends at once. (The kill lands there most times; when
# rank 0 is in a host sum waiting for rank 1 instead, that sum names it.)
"$B/meshc" --set mesh.tp=2 --set train.global_batch=4 --set train.precision=fp32 examples/gpt-tiny.mesh \
    -o "$T/tp2.plan" >/dev/null &&
    t0=$SECONDS && { killed killedtp tp2; [ $? -eq 1 ]; } && [ $((SECONDS - t0)) -lt 60 ] &&
    grep -qE '(another rank failed \(|an all-gather of sums: .*)rank 1 failed: its connection closed' \
        "$T/killedtp.0.log" || shown killedtp 2
check "the same on tp 2, its NCCL calls ordered on the stream: the other stops at once, naming it" $?
# rank 1's NCCL communicator fails to form (without EMU_NCCL_NODE the
# emulation refuses an id another process made): rank 0, waiting for the
# world to form, stops at once (its wait polls the TCP world), naming why
t0=$SECONDS
NO_NODE=1 procs nonode 2 2 dp2z3 --steps 1
[ $? -eq 1 ] && [ $((SECONDS - t0)) -lt 30 ] &&
    grep -q 'ncclCommInitRankConfig (rank 0 of 2): another rank failed (rank 1 failed: ncclCommInitRankConfig (rank 1 of 2)' \
        "$T/nonode.0.log" || shown nonode 2
check "a process whose NCCL communicator fails to form stops the other at once, which names it" $?
echo "# $passed passed, $failed failed"
[ "$failed" -eq 0 ]
