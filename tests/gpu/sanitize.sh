# shellcheck shell=bash
# tests/gpu/sanitize.sh: running a program under CUDA's compute-sanitizer
# and reading its report, for tests/gpu/run.sh (step 7c there), which
# sources it; tests/gpu/emu/run.sh checks it against the emulation's
# stand-in (tests/gpu/emu/compute-sanitizer).
#
# find_sanitizer: the tool's path ($MESH_GPU_SANITIZER; rehearsing,
#   REHEARSE=1, the stand-in; else the toolkit's, $CUDA_DIR/bin, or PATH's).
# sanitize NAME TOOL SECONDS [VAR=VALUE...] CMD...: see below. It writes
#   under $OUT/sanitize, and caps SECONDS by run.sh's `cap` where defined.

SANITIZE_STAND_IN=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/emu/compute-sanitizer

find_sanitizer() {
    local c
    if [ -n "${MESH_GPU_SANITIZER:-}" ]; then
        [ -x "$MESH_GPU_SANITIZER" ] && { echo "$MESH_GPU_SANITIZER"; return 0; }
        return 1
    fi
    if [ "${REHEARSE:-0}" = 1 ]; then
        echo "$SANITIZE_STAND_IN"
        return 0
    fi
    for c in ${CUDA_DIR:+"$CUDA_DIR/bin/compute-sanitizer"} "$(command -v compute-sanitizer 2>/dev/null)" \
        /usr/local/cuda/bin/compute-sanitizer; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    return 1
}

# sanitize NAME TOOL SECONDS [VAR=VALUE...] CMD...: CMD under the tool, its
# environment with the VAR=VALUEs; the report in $OUT/sanitize/NAME-TOOL.log,
# CMD's output in .out beside it. Prints one line: "TOOL: N errors" (with
# the first and where it was), "TOOL: timed out after S s..." or "TOOL:
# could not check: ..."; returns 0 clean, 1 errors (or CMD failed under it),
# 2 not checked.
sanitize() {
    local name=$1 tool=$2 secs=$3 dir=$OUT/sanitize log out rc n first t envs=()
    shift 3
    while [ $# -gt 0 ] && [[ $1 == *=* ]]; do envs+=("$1"); shift; done
    mkdir -p "$dir"
    log=$dir/$name-$tool.log
    out=$dir/$name-$tool.out
    rm -f "$log"
    t=$secs
    declare -F cap >/dev/null && t=$(cap "$secs")
    local -a opts=(--tool "$tool" --log-file "$log" --print-limit 20)
    [ "$tool" = racecheck ] && opts+=(--racecheck-report hazard)
    env "${envs[@]}" timeout -k 5 "$t" "$SANITIZER" "${opts[@]}" "$@" >"$out" 2>&1
    rc=$?
    # (an error's first line is the report's first unindented one but the
    # tool's own; where it was, the first "at" line after it)
    first=$(awk -v own='COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|Target application' '
        e == "" && /^========= [^ ]/ && $0 !~ own { e = substr($0, 11); next }
        e != "" && /^=========  +at / { sub(/^=========  +at /, ""); at = $0; exit }
        END { if (e != "") print e (at != "" ? " at " at : "") }' "$log" 2>/dev/null)
    n=$(sed -n 's/^========= ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" 2>/dev/null | tail -n 1)
    if grep -q -i 'device not supported' "$log" "$out" 2>/dev/null; then
        echo "$tool: could not check: compute-sanitizer does not support this GPU here ($(cat "$log" "$out" 2>/dev/null | grep -m 1 -i 'device not supported'))"
        return 2
    fi
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        if [ -n "$first" ]; then echo "$tool: timed out after $t s, errors before: first: $first"; return 1; fi
        echo "$tool: timed out after $t s, no error before"
        return 2
    fi
    if [ -z "$n" ]; then
        echo "$tool: could not check: no summary from $SANITIZER (exit $rc): $(head -n 3 "$log" "$out" 2>/dev/null | tr '\n' ' ' | cut -c 1-300)"
        return 2
    fi
    if [ "$n" -gt 0 ]; then
        echo "$tool: $n error$([ "$n" = 1 ] || echo s); first: $first"
        return 1
    fi
    if [ "$rc" -ne 0 ]; then
        echo "$tool: 0 errors, but the program failed under it (exit $rc; $out)"
        return 1
    fi
    echo "$tool: 0 errors"
}
