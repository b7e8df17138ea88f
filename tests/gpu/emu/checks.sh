# tests/gpu/emu/checks.sh: what meshrun.sh and faults.sh share (sourced):
# the TAP count and a meshrun log's losses.
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
