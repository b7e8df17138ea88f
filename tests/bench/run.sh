#!/usr/bin/env bash
# tests/bench/run.sh: `make bench` — meshc compile times, measured side by
# side in one run (best of 3 wall-clock runs each; machines are noisy, so
# read the ratios, not the absolute times). Not a test: nothing here fails
# on a number.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
MESHC=${MESHC:-build/meshc}

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
    t=$(best_of_3 "$MESHC" "$f") || exit 1
    check=$("$MESHC" "$f" 2>/dev/null | sed -n 's/^  check: *//p')
    printf '%-44s %10s  %s\n' "$f" "$t" "$check"
done
t=$(best_of_3 "$MESHC" --stats tests/bench/gpt3-175b.mesh) || exit 1
printf '%-44s %10s\n' "gpt3-175b --stats" "$t"
"$MESHC" --stats tests/bench/gpt3-175b.mesh 2>/dev/null | sed -n '1,4p;/^pipeline/p'
