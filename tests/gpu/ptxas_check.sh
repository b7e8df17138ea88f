#!/usr/bin/env bash
# tests/gpu/ptxas_check.sh: the CUDA kernels' registers and spills, as
# ptxas reported them when `make CUDA=1` compiled them, against the
# budgets in tests/gpu/ptxas_budget.txt. A GPU is not needed: what it
# checks is the machine code's resources, which decide how many blocks
# an SM runs and whether a loop goes through local memory.
#
#   tests/gpu/ptxas_check.sh OBJDIR [BUDGET]
#
# OBJDIR holds the reports: each kernels/cuda/NAME.cu's ptxas -v output,
# written by the Makefile's rule beside its object as NAME.ptxas.
# BUDGET (default tests/gpu/ptxas_budget.txt) has lines
#
#   KERNEL | MAX_REGISTERS | MAX_SPILL_STORES | WHY
#
# KERNEL a glob over c++filt's name without the arguments (e.g.
# `attn_fwd_kernel<*, 64, 1>`), compiled for any architecture; the first
# line that matches a kernel is its budget. Fails, naming each:
#   - a kernel over its budget's registers or spill stores;
#   - a kernel that no line names and spills at all;
#   - any line of ptxas's that reports a performance loss (C7515 and the
#     like: wgmma serialised);
#   - a budget line that names no kernel (a stale budget);
#   - no reports at all.
# Prints one line per kernel it checked with a budget, then `ok` or the
# failures; exits 1 on any failure.
set -u
OBJ=${1:?usage: ptxas_check.sh OBJDIR [BUDGET]}
BUDGET=${2:-$(dirname "$0")/ptxas_budget.txt}

shopt -s nullglob
reports=("$OBJ"/*.ptxas)
if [ ${#reports[@]} -eq 0 ]; then
    echo "ptxas_check: no ptxas reports in $OBJ (make CUDA=1 writes them beside the kernels' objects)"
    exit 1
fi

# one record a kernel: FILE<TAB>ARCH<TAB>MANGLED<TAB>REGISTERS<TAB>SPILL_STORES
records=$(awk -v OFS='\t' '
    function flush() { if (name != "") print file, arch, name, regs, spill; name = "" }
    FNR == 1 { flush() }
    /Compiling entry function/ {
        flush()
        split($0, q, "\047"); file = FILENAME; name = q[2]; arch = q[4]; regs = -1; spill = -1
        next
    }
    name != "" && /bytes spill stores/ { for (i = 1; i < NF; i++) if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) == "stores,") spill = $i }
    name != "" && /Used [0-9]+ registers/ { for (i = 1; i < NF; i++) if ($i == "Used") regs = $(i + 1) }
    END { flush() }
' "${reports[@]}")
if [ -z "$records" ]; then
    echo "ptxas_check: no kernels in the reports of $OBJ (built without -Xptxas -v?)"
    exit 1
fi
demangled=$(cut -f3 <<<"$records" | c++filt)

# the budgets: pattern, registers, spills, why
pats=() maxr=() maxs=() why=() used=()
while IFS='|' read -r p r s w; do
    p=$(sed 's/^ *//; s/ *$//' <<<"$p")
    [ -z "$p" ] || [ "${p:0:1}" = "#" ] && continue
    pats+=("$p")
    maxr+=("$(tr -d ' ' <<<"$r")")
    maxs+=("$(tr -d ' ' <<<"$s")")
    why+=("$(sed 's/^ *//' <<<"$w")")
    used+=(0)
done <"$BUDGET"

fails=0 checked=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
while IFS=$'\t' read -r file arch _ regs spill <&3 && IFS= read -r full <&4; do
    kernel=${full%%(*} # without the arguments, nor the return type
    kernel=${kernel#void }
    where="$(basename "$file" .ptxas).cu, $arch"
    if [ "$regs" -lt 0 ] || [ "$spill" -lt 0 ]; then
        fail "$kernel ($where): no registers or spills in ptxas's report"
        continue
    fi
    b=-1
    for i in "${!pats[@]}"; do
        # shellcheck disable=SC2053 # the budget's pattern is a glob
        if [[ $kernel == ${pats[$i]} ]]; then b=$i; break; fi
    done
    if [ $b -lt 0 ]; then
        [ "$spill" -eq 0 ] || fail "$kernel ($where): $spill bytes of spill stores ($regs registers), and no budget allows any"
        continue
    fi
    used[$b]=1
    checked=$((checked + 1))
    if [ "$regs" -gt "${maxr[$b]}" ] || [ "$spill" -gt "${maxs[$b]}" ]; then
        fail "$kernel ($where): $regs registers, $spill bytes of spill stores; its budget is ${maxr[$b]} and ${maxs[$b]}: ${why[$b]}"
    else
        echo "ok $kernel ($where): $regs registers (at most ${maxr[$b]}), $spill bytes of spill stores (at most ${maxs[$b]})"
    fi
done 3<<<"$records" 4<<<"$demangled"

# (ptxas names the function in the line itself)
while IFS= read -r line; do
    fail "ptxas reported a performance loss: $line"
done < <(grep -h "Performance Loss" "${reports[@]}" | c++filt)
for i in "${!pats[@]}"; do
    [ "${used[$i]}" = 1 ] || fail "the budget '${pats[$i]}' names no kernel in $OBJ's reports (stale?)"
done
total=$(wc -l <<<"$records")
if [ $fails -gt 0 ]; then
    echo "ptxas_check: $fails failures over $total kernels ($checked with a budget of their own)"
    exit 1
fi
echo "ptxas_check: ok, $total kernels ($checked with a budget of their own; the others spill nothing)"
