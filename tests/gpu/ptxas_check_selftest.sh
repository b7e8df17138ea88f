#!/usr/bin/env bash
# tests/gpu/ptxas_check_selftest.sh: tests/gpu/ptxas_check.sh on reports
# written here (ptxas -v's format, CUDA 13), that it passes what keeps to
# its budgets and fails, naming it, each way a build can break them. Needs
# no CUDA (tests/run.sh's scripts section runs it). Prints `ok` or what
# went wrong; exits 1 on any.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/ptxas-selftest.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
bad=0

# kernel MANGLED ARCH REGISTERS SPILL_STORES: one kernel's lines
kernel() {
    printf "ptxas info    : Compiling entry function '%s' for '%s'\n" "$1" "$2"
    printf "ptxas info    : Function properties for %s\n" "$1"
    printf "    %d bytes stack frame, %d bytes spill stores, %d bytes spill loads\n" "$4" "$4" "$4"
    printf "ptxas info    : Used %d registers, used 1 barriers\n" "$3"
}
# report FILE CASE: a report of three kernels, CASE changing one thing
report() {
    local regs=128 spill=0 other=0
    case $2 in over-registers) regs=130 ;; over-spills) spill=8 ;; unbudgeted-spill) other=4 ;; esac
    {
        echo "ptxas info    : 0 bytes gmem"
        kernel _Z15attn_fwd_kernelI13__nv_bfloat16Li64ELi1EEv9attn_args sm_90 "$regs" 0
        kernel _Z15attn_fwd_kernelI6__halfLi128ELi2EEv9attn_args sm_90 255 "$spill"
        kernel _Z10add_kernelPfPKfi sm_90 24 "$other"
        [ "$2" = loss ] && echo "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to the presence of Extern calls in the function '_Z15attn_fwd_kernelI13__nv_bfloat16Li64ELi1EEv9attn_args'"
    } >"$1"
}
budget() {
    echo "# a comment, and a blank line"
    echo
    echo "attn_fwd_kernel<__*, 64, 1>  | 128 | 0 | four blocks"
    echo "attn_fwd_kernel<__*, 128, 2> | 255 | 0 | its spills"
    [ "$1" = stale ] && echo "attn_gone_kernel<*> | 100 | 0 | a kernel since removed"
}
# expect CASE RC TEXT: the check's exit status, and a line of its output
expect() {
    local dir=$T/$1
    mkdir -p "$dir"
    report "$dir/attention.ptxas" "$1"
    budget "$1" >"$dir/budget.txt"
    "$HERE/ptxas_check.sh" "$dir" "$dir/budget.txt" >"$dir/out" 2>&1
    local rc=$?
    if [ "$rc" != "$2" ] || ! grep -qF -- "$3" "$dir/out"; then
        echo "case $1: expected exit $2 and a line with '$3', got exit $rc:"
        sed 's/^/    /' "$dir/out"
        bad=1
    fi
}
expect ok 0 "ptxas_check: ok, 3 kernels (2 with a budget of their own"
expect over-registers 1 "attn_fwd_kernel<__nv_bfloat16, 64, 1> (attention.cu, sm_90): 130 registers, 0 bytes of spill stores; its budget is 128 and 0: four blocks"
expect over-spills 1 "attn_fwd_kernel<__half, 128, 2> (attention.cu, sm_90): 255 registers, 8 bytes of spill stores; its budget is 255 and 0"
expect unbudgeted-spill 1 "add_kernel (attention.cu, sm_90): 4 bytes of spill stores (24 registers), and no budget allows any"
expect stale 1 "the budget 'attn_gone_kernel<*>' names no kernel"
expect loss 1 "ptxas reported a performance loss: ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to the presence of Extern calls in the function 'void attn_fwd_kernel<__nv_bfloat16, 64, 1>(attn_args)'"
mkdir -p "$T/empty"
"$HERE/ptxas_check.sh" "$T/empty" >"$T/empty.out" 2>&1 && { echo "case no-reports: passed"; bad=1; }
grep -q "no ptxas reports" "$T/empty.out" || { echo "case no-reports: no message"; cat "$T/empty.out"; bad=1; }
[ $bad = 0 ] && echo ok
exit $bad
