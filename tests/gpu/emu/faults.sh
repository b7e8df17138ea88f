#!/usr/bin/env bash
# tests/gpu/emu/faults.sh BUILD [POINTS]: what meshrun --device cuda does
# when a GPU or NCCL call fails, swept over a training run on the
# emulation (BUILD/meshrun_emu; the failures are injected by EMU_FAIL,
# fault.cpp).
#
# Three models: gpt-tiny on dp 2 with ZeRO-3 and on tp 2 x pp 2, ranks as
# threads, and on pp 2 under mpirun, one rank per process (FAULT_PLANS:
# some of dp2z3 tp2pp2 pp2mpi; default all). For each, a clean run of 4
# steps is the reference (its losses, and a checkpoint after every step). Then, for each kind of call
# (malloc, create, launch, matmul, nccl: fault.cpp) and POINTS of its
# calls (default 4) spread over a run that resumes after step 1 and trains
# steps 2 and 3, the run is made again with that call failing. It passes
# when:
#   - the call was made and failed (a point past the run's calls would
#     test nothing);
#   - meshrun ends with status 1 and a "meshrun: error:" line that names a
#     rank (under mpirun: or status 3 and a "mesh: ... stopping the job"
#     line naming one, a rank's MPI_Abort), or with status 0 and the
#     reference's losses (a failure survived must change nothing);
#   - it ends before the collectives' timeout (MESH_COLLECTIVE_TIMEOUT_S:
#     FAULT_TIMEOUT_S, default 20 s; longer than a whole run takes, 60 for
#     an ASan build): the ranks stop when one fails, not when they give up
#     waiting for it;
#   - it did not crash (no signal), and a process whose GPU did not fault
#     freed every device allocation it made (no "never freed" line);
#   - the checkpoint folder it leaves is sound: a clean run resumed from its
#     latest checkpoint trains on to step 4 with the reference's losses
#     (step 4's among them: a log without losses proves nothing).
# Ends with `# N passed, N failed`; exits 1 if any failed.
set -u
B=${1:?usage: faults.sh BUILD [POINTS]}
POINTS=${2:-4}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1 MESH_COLLECTIVE_TIMEOUT_S=${FAULT_TIMEOUT_S:-20}
. "$(dirname "$0")/checks.sh" # check, losses, mpi_env

# run LOG ARGS...: meshrun_emu on $PLAN with $GPUS emulated GPUs, its output
# in LOG; its status. Ranks as threads, or with LAUNCH=mpirun one process
# each (a node folder of their own each time: a killed job leaves its
# files)
NODES=0
run() {
    local log=$1
    shift
    if [ "${LAUNCH:-}" = mpirun ]; then
        NODES=$((NODES + 1))
        mpi_env "$T/node-$NODES" MESH_EMU_GPUS=$GPUS timeout 120 mpirun -n "$GPUS" "$B/meshrun_emu" "$T/$PLAN.plan" \
            --data "$T/train.bin" --val "$T/val.bin" --device cuda "$@" >"$log" 2>&1
    else
        MESH_EMU_GPUS=$GPUS timeout 120 "$B/meshrun_emu" "$T/$PLAN.plan" --data "$T/train.bin" \
            --val "$T/val.bin" --device cuda "$@" >"$log" 2>&1
    fi
}

# sound LOG LAST: the losses LOG has are the reference's (each step's it
# has), step LAST's among them
sound() {
    local step value want bad=0
    losses "$1" | grep -q "^$2 " || { echo "#   no loss for step $2"; bad=1; }
    while read -r step value; do
        want=$(awk -v s="$step" '$1 == s { print $2; exit }' "$T/$PLAN.ref")
        [ "$value" = "$want" ] || { echo "#   step $step: $value, the reference's ${want:-none}"; bad=1; }
    done < <(losses "$1")
    return "$bad"
}

# trial KIND N: the run with the N-th call of KIND failing, judged
trial() {
    local kind=$1 n=$2 d="$T/ck-$1-$2" log="$T/$1-$2.log" rc why=""
    mkdir -p "$d"
    cp -r "$T/$PLAN.ck/step-00000001" "$d/"
    echo step-00000001 >"$d/latest"
    local t1=$SECONDS
    EMU_FAIL="$kind:$n" run "$log" --steps 3 --checkpoint "$d" --resume
    rc=$?
    local took=$((SECONDS - t1))
    local injected=0
    grep -q "^emu: EMU_FAIL=$kind:$n: " "$log" && injected=1
    case $rc in
    0) sound "$log" 3 || why="ran on with other losses" ;;
    1) grep -q '^meshrun: error: .*rank [0-9]' "$log" || why="no 'meshrun: error:' line naming a rank" ;;
    3) # mpirun: a rank stopped the job (MPI_Abort), saying why
        [ "${LAUNCH:-}" = mpirun ] && grep -q '^mesh: .*rank [0-9].*stopping the job' "$log" ||
            why="exited with 3 without a 'mesh: ... stopping the job' line naming a rank" ;;
    124) why="did not end within 120 s" ;;
    *) why="exited with $rc" ;;
    esac
    if [ "$rc" -ne 124 ] && [ "$took" -ge "$MESH_COLLECTIVE_TIMEOUT_S" ]; then
        why="${why:+$why; }took $took s: a rank waited for the collectives' timeout"
    fi
    [ "$injected" -eq 1 ] || why="${why:+$why; }no failure was injected (call $n of $kind never came): nothing tested"
    if grep -q "^emu: .* never freed" "$log"; then why="${why:+$why; }device memory never freed"; fi
    # the checkpoint it left: a clean run resumes from it to step 4
    local latest
    latest=$(cat "$d/latest" 2>/dev/null)
    if ! run "$log.resume" --steps 4 --checkpoint "$d" --resume; then
        why="${why:+$why; }resuming from its checkpoint ($latest) failed"
        sed 's/^/#   /' "$log.resume" | tail -n 5
    elif ! sound "$log.resume" 4; then
        why="${why:+$why; }its checkpoint ($latest) resumes to other losses"
    fi
    if [ -n "$why" ]; then
        echo "# $PLAN $kind:$n (injected $injected, status $rc): $why"
        sed 's/^/#   /' "$log" | grep -v '^#   meshrun: \(bytes\|time\|overlap\)' | tail -n 12
    fi
    check "$PLAN: $kind call $n fails (status $rc in $took s; the checkpoint left: $latest)" \
        "$([ -z "$why" ] && echo 0 || echo 1)"
    grep -m1 '^meshrun: error: \|^mesh: .*stopping the job' "$log" |
        sed -e 's/^meshrun: error: [^:]*: /#   said: /' -e 's/^mesh: /#   said: /'
}

"$B/meshrun_emu" tokenize examples/data/devils-dictionary.txt -o "$T/train.bin" --val "$T/val.bin" >/dev/null

# most: of the counts' lines (one per process), each kind's largest
most() {
    awk '{ for (i = 1; i < NF; i += 2) { if (!($i in n)) k[++kinds] = $i; if ($(i + 1) > n[$i]) n[$i] = $(i + 1) } }
         END { for (j = 1; j <= kinds; j++) printf "%s%s %d", (j > 1 ? " " : ""), k[j], n[k[j]]; print "" }'
}

# sweep PLAN GPUS MESHC-SETTINGS...: the reference, the calls counted,
# then every kind's POINTS trials
sweep() {
    PLAN=$1 GPUS=$2
    shift 2
    case " ${FAULT_PLANS:-$PLAN} " in *" $PLAN "*) ;; *) return 0 ;; esac
    "$B/meshc" "$@" --set train.global_batch=4 --set train.log_every=1 --set train.eval_every=1 --set "train.val_data=\"$T/val.bin\"" \
        --set train.checkpoint_every=1 --set "train.checkpoint_dir=\"$T/$PLAN.ck\"" examples/gpt-tiny.mesh \
        -o "$T/$PLAN.plan" >/dev/null
    check "$PLAN: meshc compiles it" $?
    run "$T/$PLAN.log" --steps 4 && losses "$T/$PLAN.log" >"$T/$PLAN.ref"
    check "$PLAN: the reference run trains 4 steps with a checkpoint after each" $?
    rm -rf "$T/count.ck"
    cp -r "$T/$PLAN.ck" "$T/count.ck"
    echo step-00000001 >"$T/count.ck/latest"
    local counts=""
    EMU_FAIL=count run "$T/count.log" --steps 3 --checkpoint "$T/count.ck" --resume &&
        counts=$(sed -n 's/^emu: EMU_FAIL counts: //p' "$T/count.log" | most) && sound "$T/count.log" 3
    [ -n "$counts" ]
    check "$PLAN: the calls of a run resumed for steps 2 and 3: $counts" $?
    set -- $counts
    while [ $# -ge 2 ]; do
        local kind=$1 total=$2 i n last=0
        shift 2
        for ((i = 0; i < POINTS; i++)); do
            # the first call, the last, and evenly between
            n=$((POINTS > 1 ? 1 + i * (total - 1) / (POINTS - 1) : 1))
            [ "$total" -gt 0 ] && [ "$n" -gt "$last" ] || continue
            last=$n
            trial "$kind" "$n"
        done
    done
}

sweep dp2z3 2 --set mesh.dp=2 --set train.zero=3
sweep tp2pp2 4 --set mesh.tp=2 --set mesh.pp=2 --set train.precision=bf16 --set train.micro_batch=2
# one rank per process under mpirun: the NCCL world over MPI, whose
# launcher ends the job when a process fails
if command -v mpirun >/dev/null 2>&1; then
    LAUNCH=mpirun sweep pp2mpi 2 --set mesh.pp=2 --set train.precision=bf16 --set train.micro_batch=2
else
    echo "ok - # SKIP mpirun: no mpirun (make deps installs Open MPI)"
fi

echo "# $passed passed, $failed failed"
[ "$failed" -eq 0 ]
