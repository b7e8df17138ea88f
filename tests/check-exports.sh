#!/usr/bin/env bash
# check-exports.sh LIB...: fail unless every global symbol defined in each
# library starts with mesh_ (the public prefix; see docs/c-api.md).
# Static archives are read with `nm -g`: cross-file internals (mesh__) are
# allowed there, and the C++ objects' hidden DW.ref.* COMDAT pointers (the
# Makefile's libmesh.a rule says why). Shared objects are read with `nm -D`
# and must export public names only (mesh_ not followed by _;
# runtime/libmesh.map hides the rest).
# Used by `make check-exports` and by tests/run.sh.
set -u
status=0
for lib in "$@"; do
    case $lib in
        *.so*) syms=$(nm -D --defined-only "$lib") || { status=1; continue; }
               want='^mesh_[^_]' ;;
        *)     syms=$(nm -g --defined-only "$lib") || { status=1; continue; }
               want='^(mesh_|DW\.ref\.)' ;;
    esac
    # nm prints "member.o:" headers and blank lines for archives; symbol
    # lines are "[address] TYPE name".
    bad=$(printf '%s\n' "$syms" | awk -v want="$want" 'NF >= 2 && $NF !~ want { print $NF }')
    if [ -n "$bad" ]; then
        echo "$lib: exported symbols not matching $want:" >&2
        printf '%s\n' "$bad" | sed 's/^/  /' >&2
        status=1
    fi
done
exit $status
