#!/usr/bin/env bash
# tests/gpu/emu/run.sh BUILD [ORDER...]: the CUDA kernels' tests on the CPU
# emulation, as `make gpu-emu` (BUILD=build) and `make gpu-emu-tsan`
# (BUILD=build-tsan) run them: the emulator's self-tests
# (BUILD/emu_selftest) with the emulator's default settings and (but under
# TSan) again with those of gpu_tests' reversed run (below), then every
# case of tests/gpu/gpu_tests*.c (BUILD/gpu_tests_emu) once per ORDER, the
# order in which a block's threads run between barriers: forward (first
# to last) and/or reverse (default: both; each hides the other's reads of
# another thread's unsynchronized writes); then the executor's and NCCL's
# unit tests and meshrun (below), and (but under TSan) the benchmark at
# --tiny sizes (BUILD/gpu_bench_emu). Ends with `N passed, N failed`
# over all runs (a run that fails without counting a failure, a crash,
# counts as 1); exits 1 if any failed.
set -u
B=${1:?usage: run.sh BUILD [ORDER...]}
shift
orders=("$@")
[ ${#orders[@]} -gt 0 ] || orders=(forward reverse)
passed=0
failed=0
LAST=$(mktemp) # the last run's output
trap 'rm -f "$LAST"' EXIT

# run LABEL COMMAND...: runs it, adds its last `# N passed, N failed`
run() {
    local label=$1 out rc p f t0
    shift
    out=$(mktemp)
    echo "== $label: $*"
    t0=$(date +%s%N)
    "$@" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    read -r p f < <(sed -n 's/^# \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$out" | tail -n 1)
    cp "$out" "$LAST"
    rm -f "$out"
    p=${p:-0} f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "# $label exited with status $rc"
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    t0=$((($(date +%s%N) - t0) / 100000000))
    echo "== $label: $((t0 / 10)).$((t0 % 10)) s"
}

# verdict STATUS WHAT: one case of this script's own, "ok - WHAT" when
# STATUS is 0, else "not ok - WHAT"
verdict() {
    if [ "$1" = 0 ]; then
        echo "ok - $2"
        passed=$((passed + 1))
    else
        echo "not ok - $2"
        failed=$((failed + 1))
    fi
}

# (the cases that check one setting of EMU_CP_ASYNC or EMU_WARPS skip
# under the other, and count as passed; under TSan, where each case takes
# about a second, and gpu_tests runs forward only, the second run is left
# out, and the first runs only the cases TSan adds to: selftest.cu)
run "emulator self-tests" "$B/emu_selftest"
if [ "${EMU_TSAN:-0}" != 1 ]; then
    run "emulator self-tests, threads reverse, warps serial, cp.async early" \
        env EMU_ORDER=reverse EMU_WARPS=serial EMU_CP_ASYNC=early "$B/emu_selftest"
fi
for o in "${orders[@]}"; do
    case $o in
    forward | reverse) ;;
    *) echo "run.sh: unknown order $o" >&2; exit 2 ;;
    esac
    # with the threads forward, the warps abreast and cp.async copies
    # landing at the wait; reversed, the warps one at a time (each runs
    # ahead of the others to its next barrier) and the copies landing as
    # issued (README, emu/ptx.h)
    # (under TSan, 12 of the random shapes of t_sweep, not 30: the shapes
    # are for the numbers, which the other runs check; the races are the
    # kernels' own)
    # (and under TSan not the fp16 cases: the bf16 ones' code, one template,
    # another type; the other runs check their numbers; nor the optimizer's
    # batched calls, *_many: their bits against the single calls' over
    # half a million elements, some 90 s there, with no shared memory but
    # the block sums the global_norm cases race-check; nor the products
    # with cuBLASLt's algorithms tuned, _tuned, nor the attention on
    # cuDNN: what runs on the emulated GPU there is the emulator's own
    # cuBLASLt and cuDNN, not a kernel of kernels/cuda (the kernels cuDNN's
    # refusals fall back to are the attention cases'), some 35 s there)
    warps=abreast cp=late sweep=30 skip=""
    [ "$o" = reverse ] && warps=serial cp=early
    [ "${EMU_TSAN:-0}" = 1 ] && sweep=12 skip="_f16 _many _tuned attention_cudnn"
    run "gpu_tests, threads $o, warps $warps, cp.async $cp" env OPENBLAS_NUM_THREADS=1 \
        EMU_ORDER="$o" EMU_WARPS=$warps EMU_CP_ASYNC=$cp GPU_TESTS_SWEEP=$sweep GPU_TESTS_SKIP="$skip" \
        "$B/gpu_tests_emu"
done
# the attention cases whose dq atomics take turns again with each block
# started after a random delay (EMU_JITTER_US): the key tiles' atomics
# arrive in a new order each run, so a turn not taken shows as bits that
# differ on the same inputs ("dq twice"; not every run: a sum of 2-byte
# values may round alike); the other attention cases have no atomics or
# (dq_atomic) no order to keep
if [ "${EMU_TSAN:-0}" != 1 ]; then
    run "gpu_tests attention in turns, blocks jittered" env OPENBLAS_NUM_THREADS=1 EMU_JITTER_US=2000 \
        "$B/gpu_tests_emu" attention_dq_turns_bf16 attention_dq_turns_f16
fi
# the executor's GPU path and the NCCL communicator (unit_tests_emu, when
# built): the unit tests that need a GPU, or 4 (MESH_EMU_GPUS: ranks as
# threads, a GPU each, over the emulated NCCL); one that skips fails.
skipped() {
    if grep -q '^SKIP' "$LAST"; then
        echo "# a GPU test skipped on the emulation"
        failed=$((failed + 1))
    fi
}
if [ -x "$B/unit_tests_emu" ]; then
    if [ "${EMU_TSAN:-0}" != 1 ]; then
        run "the executor on the GPU" env OPENBLAS_NUM_THREADS=1 "$B/unit_tests_emu" \
            device_cuda_probe_says_why device_cuda_round_trips exec_cuda_trains_as_the_cpu \
            parallel_cuda_ranks_share_a_gpu
        skipped
        run "the executor on 4 GPUs, over NCCL" env OPENBLAS_NUM_THREADS=1 MESH_EMU_GPUS=4 "$B/unit_tests_emu" \
            parallel_cuda_ranks_over_nccl parallel_cuda_deterministic_dp_is_bit_identical
        skipped
        # (each NCCL launch held 20 ms on its stream: what the overlap hid, timed on the GPU; 3 steps of dp 2)
        run "the overlap timed on 2 GPUs, NCCL's launches held 20 ms" env OPENBLAS_NUM_THREADS=1 MESH_EMU_GPUS=2 \
            EMU_NCCL_LAG_US=20000 "$B/unit_tests_emu" parallel_cuda_overlap_timed_on_the_gpu \
            parallel_cuda_turns_timed_on_the_gpu
        skipped
    else # (under TSan the whole executor tests take too long: 2 steps of dp 2 ZeRO-3, about 25 s)
        run "the executor on 2 GPUs, over NCCL, 2 steps" env OPENBLAS_NUM_THREADS=1 MESH_EMU_GPUS=2 \
            "$B/unit_tests_emu" parallel_cuda_nccl_under_tsan
        skipped
    fi
    NCCL_TESTS=(comm_nccl_available_says_why comm_nccl_one_rank_calls comm_nccl_world_over_threads
        comm_nccl_failure_aborts_the_world comm_nccl_world_times_out_without_its_ranks
        comm_nccl_world_names_a_rank_without_its_gpu comm_nccl_queue_on_its_own_world comm_nccl_ranks_over_threads
        comm_nccl_failed_rank_stops_the_others comm_nccl_ordered_calls_follow_the_stream
        comm_nccl_queue_ordered_on_the_gpu comm_nccl_ring_channels)
    run "the NCCL communicator on 4 GPUs" env MESH_EMU_GPUS=4 "$B/unit_tests_emu" "${NCCL_TESTS[@]}"
    skipped
    # again, every world meeting through a node's files, as processes' do
    # (nccl_node.cpp); the last rank out of each removes its folder (not
    # under TSan: the communicator's code is the run's above, and the
    # files are the emulator's own; 24 s there)
    # (a folder not there before: the worlds make it, which shows they used it)
    if [ "${EMU_TSAN:-0}" != 1 ]; then
        NODE=$(mktemp -d)/node
        run "the NCCL communicator on 4 GPUs, through EMU_NCCL_NODE's files" \
            env MESH_EMU_GPUS=4 EMU_NCCL_NODE="$NODE" "$B/unit_tests_emu" "${NCCL_TESTS[@]}"
        skipped
        if [ ! -d "$NODE" ]; then
            echo "# no world made EMU_NCCL_NODE's folder: the files were not used"
            failed=$((failed + 1))
        elif [ -n "$(ls -A "$NODE")" ]; then
            echo "# worlds left files behind in EMU_NCCL_NODE: $(ls "$NODE")"
            failed=$((failed + 1))
        fi
        rm -rf "$(dirname "$NODE")"
    fi
fi
# meshrun --device cuda as a user runs it, on 4 GPUs: ranks as threads,
# then one per process (tests/gpu/emu/meshrun.sh)
if [ -x "$B/meshrun_emu" ] && [ -x "$B/meshc" ] && [ "${EMU_TSAN:-0}" != 1 ]; then
    run "meshrun on 4 GPUs" bash "$(dirname "$0")/meshrun.sh" "$B"
fi
# tests/gpu/run.sh's runs under CUDA's compute-sanitizer (step 7c there:
# tests/gpu/sanitize.sh), through the stand-in its rehearsal uses
# (compute-sanitizer here): a clean run must read as 0 errors, and a
# kernel that faults (the self-test's misaligned ldmatrix, which the
# emulator fails as a GPU would) as 1 error, with the kernel and why
if [ "${EMU_TSAN:-0}" != 1 ]; then
    OUT=$(mktemp -d) REHEARSE=1
    . "$(dirname "$0")/../sanitize.sh"
    SANITIZER=$(find_sanitizer)
    # (a clean run's line, then the faulting one's)
    san_ok=$(sanitize clean memcheck 300 OPENBLAS_NUM_THREADS=1 GPU_TESTS_SWEEP=2 "$B/gpu_tests_emu" rope)
    rc_ok=$?
    san_bad=$(sanitize fault memcheck 300 "$B/emu_selftest" ldmatrix_misaligned)
    rc_bad=$?
    echo "# clean: $san_ok (status $rc_ok)"
    echo "# faulting: $san_bad (status $rc_bad)"
    [ $rc_ok = 0 ] && [ "$san_ok" = "memcheck: 0 errors" ] && [ $rc_bad = 1 ] &&
        [[ $san_bad == "memcheck: 1 error; first: Error: kernel k_ldsm_bad "*"cudaErrorMisalignedAddress] at (the emulation: tests/gpu/emu)" ]]
    verdict $? "compute-sanitizer's reports read (tests/gpu/sanitize.sh, through the emulation's stand-in)"
    rm -rf "$OUT"
    # tests/gpu/run.sh's gpu_tests step, rehearsed with a case that
    # crashes (GPU_TESTS_ABORT=moe_bf16) and a kernel that faults in each
    # process (EMU_FAIL=launch:700): each stops gpu_tests, the step runs
    # the cases after it again in a new process, and so counts every case
    # (the first run's plan), the stoppers as failed, moe_bf16 among them
    OUT=$(mktemp -d)
    GPU_TESTS_ABORT=moe_bf16 EMU_FAIL=launch:700 MESH_GPU_STEPS=gpu_tests MESH_GPU_REHEARSE=1 MESH_GPU_BUILD="$B" \
        OUT="$OUT" "$(dirname "$0")/../run.sh" >"$OUT/run.log" 2>&1
    planned=$(sed -n 's/^1\.\.\([0-9]*\)$/\1/p' "$OUT/run.log" | head -n 1)
    line=$(sed -n 's/^FAIL *gpu_tests: //p' "$OUT/run.log" | tail -n 1)
    echo "# run.sh's gpu_tests step, $planned cases planned: $line"
    p=${line%% passed*} f=${line#*passed, }
    f=${f%% failed*}
    [[ $p =~ ^[0-9]+$ ]] && [[ $f =~ ^[0-9]+$ ]] && [ $((p + f)) = "${planned:-x}" ] && [ "$f" -ge 2 ] &&
        [[ $line == *" runs, each after the case that stopped the one before"*"ended the process:"*moe_bf16* ]]
    verdict $? "run.sh's gpu_tests step runs the cases after a crash and after faults again, counting every case"
    rm -rf "$OUT"
fi
# the benchmark (tests/gpu/gpu_bench.c, which only a GPU machine measures
# with) at --tiny sizes: it runs every kernel it times, cuBLASLt's and
# cuBLAS's products too, and the attention on the emulated cuDNN, and writes
# its JSON; one case, passed when it exits 0 with a JSON summary that parses
# and every row ran what it names (its figures measure nothing)
if [ -x "$B/gpu_bench_emu" ] && [ "${EMU_TSAN:-0}" != 1 ]; then
    BENCH_JSON=$(mktemp)
    run "gpu_bench --tiny" env OPENBLAS_NUM_THREADS=1 "$B/gpu_bench_emu" --tiny --json "$BENCH_JSON"
    grep -q '^JSON {' "$LAST" && python3 -c 'import json, sys; d = json.load(open(sys.argv[1]));
assert (d["tiny"] and len(d["gemm"]) == 6 and len(d["gemm_bwd"]) == 5 and d["gemm_tune"]["shapes"] >= 11 and
    len(d["gemm_fp32"]) == 2 and
    len(d["attention"]) == 18 and d["attention_cudnn"].startswith("cuDNN 9.19.0: 6 forward and 6 backward calls on it, 0 and 0 on ours") and
    "not taken" not in str(d["attention"]) and len(d["memory"]) == 11)' "$BENCH_JSON"
    verdict $? "gpu_bench --tiny ran every row and wrote its JSON"
    rm -f "$BENCH_JSON"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
