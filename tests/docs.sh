#!/usr/bin/env bash
# tests/docs.sh: the shell sessions and files shown in the documentation
# must be what meshc and the repository really have. Part of `make test`
# (tests/run.sh, section docs/); also runs on its own:
#
#   MESHC=build/meshc tests/docs.sh [DOC.md ...]
#
# checks each DOC given, by default docs/language.md and docs/parallelism.md.
#
# A fenced code block whose first line starts with `$ ` is a shell session.
# The line right before its opening fence must be a marker that says what
# the session runs on:
#
#   <!-- check: FILE as NAME -->   FILE (a path from the repository root)
#                                  is copied into an empty scratch folder
#                                  as NAME: `<!-- check: docs/tutorial/step2.mesh
#                                  as gpt2.mesh -->` for `$ meshc gpt2.mesh`
#   <!-- check: FILE -->           FILE is copied to the same path in the
#                                  scratch folder, as if run from the
#                                  repository root: `$ meshc examples/gpt2.mesh`
#   <!-- check: none -->           the scratch folder starts empty
#   <!-- check: skip (REASON) -->  not run (machine-dependent output, ...);
#                                  printed as SKIP, counted as no case
#
# The block's `$ ` lines run in order, in one bash in the scratch folder
# (so `cd` carries over, and `$ echo $?` prints the previous command's
# status), with `meshc` on PATH standing for $MESHC and MESH_PATH unset.
# Each `$ ` line is followed by its command's stdout and stderr together
# (2>&1: meshc flushes stdout before its closing count, so the order is a
# terminal's); output that does not end in a newline gets the line
# `\ no newline at end of output`. The result must equal the block.
#
# Any other code block may be tied to a file:
#
#   <!-- file: FILE -->      the block is FILE, byte for byte (a tutorial
#                            step shown whole)
#   <!-- excerpt: FILE -->   the block's lines occur in FILE, whole and
#                            consecutive (a fragment of a file)
#
# The tutorial's step files live in docs/tutorial/; one that no marker
# names fails as an orphan, so a renamed step cannot silently go unchecked.
#
# Prints one line per block, `PASS NAME` or `FAIL NAME` followed by a diff
# indented four spaces, where NAME is DOC:LINE (the line of the opening
# fence), e.g. docs/language.md:1140. Exits 1 if any block failed, 2 if it
# could not run at all.
#
# Environment:
#   MESHC                   the meshc to test (default: build/meshc)
#   MESH_UPDATE_GOLDEN=1    rewrite the sessions in the document from what
#                           the commands print now (review the diff, and
#                           the prose around it!); file and excerpt blocks
#                           are only compared, never rewritten
#   MESH_TEST_TIMEOUT=SECS  limit per block (default: 60)
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MESHC=${MESHC:-$ROOT/build/meshc}
case $MESHC in
    /*) ;;
    */*) MESHC=$PWD/$MESHC ;;
    *) MESHC=$(command -v "$MESHC") ;;
esac
if [ ! -x "$MESHC" ] || [ -d "$MESHC" ]; then
    echo "tests/docs.sh: meshc not found: ${MESHC:-(empty)} (set MESHC)" >&2
    exit 2
fi
cd "$ROOT" || exit 2
UPDATE=${MESH_UPDATE_GOLDEN:-0}
LIMIT=${MESH_TEST_TIMEOUT:-60}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mesh-docs.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/bin" "$TMP/blocks"
ln -s "$MESHC" "$TMP/bin/meshc"
[ $# -gt 0 ] || set -- docs/language.md docs/parallelism.md

failed=0
named=" " # the FILEs markers name, space-separated, for the orphan check

pass() { echo "PASS $1"; }

# fail NAME [DETAIL_FILE]: the detail is indented four spaces.
fail() {
    echo "FAIL $1"
    failed=$((failed + 1))
    if [ $# -ge 2 ] && [ -s "$2" ]; then
        sed 's/^/    /' "$2"
    fi
}

# blocks DOC: write each fenced block's body to $TMP/blocks/N and print a
# manifest line per block that has a marker or starts with `$ `:
#   block <TAB> N <TAB> FENCE_LINE <TAB> CLOSE_LINE <TAB> SESSION <TAB> MARKER
# (SESSION 1 if the first line starts with `$ `, MARKER `-` if none), and
#   stray <TAB> LINE <TAB> MARKER
# for a marker that is not right before an opening fence.
blocks() {
    awk -v dir="$TMP/blocks" '
        function marker(s) {
            if (s !~ /^<!--[ \t]*(check|file|excerpt)[ \t]*:.*-->[ \t]*$/) return ""
            sub(/^<!--[ \t]*/, "", s)
            sub(/[ \t]*-->[ \t]*$/, "", s)
            return s
        }
        infence && /^```[ \t]*$/ {
            infence = 0
            close(body)
            if (mark != "" || session)
                printf "block\t%d\t%d\t%d\t%d\t%s\n", n, start, NR, session, (mark == "" ? "-" : mark)
            next
        }
        infence {
            if (NR == start + 1) session = (substr($0, 1, 2) == "$ ")
            print > body
            next
        }
        /^```/ {
            infence = 1; n++; start = NR; session = 0
            mark = pend; pend = ""
            body = dir "/" n
            printf "" > body
            next
        }
        {
            if (pend != "") printf "stray\t%d\t%s\n", pendline, pend
            pend = marker($0); pendline = NR
        }
        END {
            if (pend != "") printf "stray\t%d\t%s\n", pendline, pend
            if (infence) printf "unclosed\t%d\n", start
        }' "$1"
}

# input FILE: a file a marker names must be one of the repository's.
input() {
    named="$named$1 "
    case /$1/ in
        //* | */../* | *" "*)
            echo "$1: not a path inside the repository" >"$TMP/detail"
            return 1 ;;
    esac
    if [ ! -f "$1" ]; then
        echo "$1: no such file (named by the marker)" >"$TMP/detail"
        return 1
    fi
}

# session NAME BODY MARKER_ARG: run a `$ ` block, compare, maybe update.
session() {
    local name=$1 body=$2 arg=$3 file dest rc scratch=$TMP/scratch
    case $arg in
        skip*) echo "SKIP $name ${arg#skip}"; return ;;
    esac
    rm -rf "$scratch" && mkdir "$scratch"
    if [ "$arg" != none ]; then
        file=${arg%% as *}
        dest=$file
        [ "$file" = "$arg" ] || dest=${arg#* as }
        input "$file" || { fail "$name" "$TMP/detail"; return; }
        case $dest in
            /* | ../* | */../* | "" | *" "*)
                echo "bad name in <!-- check: $arg -->: '$dest'" >"$TMP/detail"
                fail "$name" "$TMP/detail"
                return ;;
        esac
        mkdir -p "$scratch/$(dirname "$dest")" && cp "$file" "$scratch/$dest"
    fi
    sed -n 's/^\$ //p' "$body" >"$TMP/commands"
    # shellcheck disable=SC2016 # the inner bash expands these
    PATH=$TMP/bin:$PATH timeout "$LIMIT" env -u MESH_PATH bash -c '
        cd "$1" || exit 1
        st=0
        while IFS= read -r cmd <&3; do
            printf "\$ %s\n" "$cmd"
            (exit "$st")
            eval "$cmd" >"$2" 2>&1 </dev/null
            st=$?
            cat "$2"
            if [ -s "$2" ] && [ -n "$(tail -c 1 "$2")" ]; then
                printf "\n\\\\ no newline at end of output\n"
            fi
        done 3<"$3"' _ "$scratch" "$TMP/one.out" "$TMP/commands" >"$TMP/actual" 2>&1 </dev/null
    rc=$?
    [ $rc -ne 124 ] || echo "(timed out after ${LIMIT}s)" >>"$TMP/actual"
    if cmp -s "$body" "$TMP/actual"; then
        pass "$name"
    elif [ "$UPDATE" = 1 ] && [ $rc -ne 124 ]; then
        cp "$TMP/actual" "$body.new"
        pass "$name"
    else
        diff -u --label "$name" --label actual "$body" "$TMP/actual" >"$TMP/detail"
        fail "$name" "$TMP/detail"
    fi
}

# whole NAME BODY FILE: the block is FILE, byte for byte.
whole() {
    input "$3" || { fail "$1" "$TMP/detail"; return; }
    if cmp -s "$2" "$3"; then
        pass "$1"
    else
        diff -u --label "$1" --label "$3" "$2" "$3" >"$TMP/detail"
        fail "$1" "$TMP/detail"
    fi
}

# excerpt NAME BODY FILE: the block's lines occur, consecutive, in FILE.
# On failure, the diff is against the lines of FILE from the first one equal
# to the block's first line (or a note that there is none).
excerpt() {
    local at
    input "$3" || { fail "$1" "$TMP/detail"; return; }
    at=$(awk 'NR == FNR { b[++m] = $0; next }
              { f[++n] = $0 }
              END {
                  if (m == 0) { print "empty"; exit }
                  first = 0
                  for (i = 1; i + m - 1 <= n; i++) {
                      for (j = 1; j <= m && f[i + j - 1] == b[j]; j++) ;
                      if (j > m) { print "found"; exit }
                      if (!first && f[i] == b[1]) first = i
                  }
                  print first
              }' "$2" "$3")
    case $at in
        found) pass "$1"; return ;;
        empty) echo "the block is empty" >"$TMP/detail" ;;
        0) echo "the block's first line is not a line of $3" >"$TMP/detail" ;;
        *) tail -n +"$at" "$3" | head -n "$(wc -l <"$2")" >"$TMP/window"
           diff -u --label "$1" --label "$3:$at" "$2" "$TMP/window" >"$TMP/detail" ;;
    esac
    fail "$1" "$TMP/detail"
}

# rewrite DOC: replace the bodies listed in $TMP/rewrites (FENCE CLOSE per
# line, body in $TMP/blocks/N.new in the same order) with the new output.
rewrite() {
    awk -v list="$TMP/rewrites" '
        BEGIN { while ((getline l < list) > 0) { split(l, a, "\t"); from[a[1]] = a[2]; file[a[1]] = a[3] } }
        skip_to && FNR < skip_to { next }
        { skip_to = 0; print }
        FNR in from {
            while ((getline l < file[FNR]) > 0) print l
            skip_to = from[FNR]
        }' "$1" >"$TMP/doc.new" && cat "$TMP/doc.new" >"$1"
}

for doc in "$@"; do
    if [ ! -f "$doc" ]; then
        fail "$doc (no such file)"
        continue
    fi
    rm -f "$TMP"/blocks/* "$TMP/rewrites" "$TMP/rewrites.full"
    blocks "$doc" >"$TMP/manifest"
    cases=0
    while IFS=$'\t' read -r kind n fence close is_session mark; do
        case $kind in
            stray) # n is the marker's line, fence the marker
                fail "$doc:$n (marker not right before a code block: <!-- $fence -->)"
                continue ;;
            unclosed) fail "$doc:$n (code block never closed)"; continue ;;
        esac
        name=$doc:$fence
        body=$TMP/blocks/$n
        cases=$((cases + 1))
        what=${mark%%[[:space:]:]*} # check, file, excerpt, or - (none)
        arg=${mark#*:}
        arg=${arg#"${arg%%[![:space:]]*}"}
        case $is_session:$what in
            1:-) echo "a \`\$ \` block needs a <!-- check: ... --> marker on the line before it" >"$TMP/detail"
                 fail "$name" "$TMP/detail" ;;
            1:check) session "$name" "$body" "$arg"
                     [ ! -e "$body.new" ] || printf '%s\t%s\t%s\n' "$fence" "$close" "$body.new" >>"$TMP/rewrites.full" ;;
            0:check) echo "<!-- $mark --> is for a block that starts with \`\$ \`" >"$TMP/detail"
                     fail "$name" "$TMP/detail" ;;
            *:file) whole "$name" "$body" "$arg" ;;
            *:excerpt) excerpt "$name" "$body" "$arg" ;;
        esac
    done <"$TMP/manifest"
    [ "$cases" -gt 0 ] || fail "$doc (no checked code blocks: are the markers gone?)"
    if [ -s "$TMP/rewrites.full" ]; then
        mv "$TMP/rewrites.full" "$TMP/rewrites"
        rewrite "$doc"
        echo "UPDATED $doc ($(wc -l <"$TMP/rewrites") block(s) rewritten: review with git diff)"
    fi
done

# Orphans: a tutorial step that no marker of docs/language.md names.
case " $* " in
    *" docs/language.md "*)
        for f in docs/tutorial/*.mesh; do
            [ -e "$f" ] || continue
            case $named in
                *" $f "*) ;;
                *) fail "$f (orphan: no marker in docs/language.md names it)" ;;
            esac
        done ;;
esac

[ "$failed" -eq 0 ]
