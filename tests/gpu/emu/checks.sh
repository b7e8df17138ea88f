# tests/gpu/emu/checks.sh: what meshrun.sh and faults.sh share (sourced):
# the TAP count, a meshrun log's losses and mpirun's environment.
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

# mpi_env NODE CMD...: CMD with Open MPI's settings for a root user on one
# oversubscribed machine (shared memory between the processes, waits that
# yield the 2 cores) and the emulated NCCL's node folder NODE
mpi_env() {
    local node=$1
    shift
    env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
        OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 EMU_NCCL_NODE="$node" "$@"
}
