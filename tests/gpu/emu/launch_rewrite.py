#!/usr/bin/env python3
"""launch_rewrite.py IN OUT: copy a CUDA source for the CPU emulation
(tests/gpu/emu), rewriting its kernel launches and nothing else:

    KERNEL<<<CONFIG>>>(ARGS)
        -> ::emu::launcher(KERNEL, "KERNEL", __FILE__, __LINE__, CONFIG)(ARGS)

KERNEL is an expression ending in a name, optionally qualified (a::b) and
with template arguments (k<T, 4>); CONFIG is the 2 to 4 launch parameters
(grid, block, shared memory bytes, stream), kept as written. Either may
span lines; every newline is kept, and a #line directive names IN
(normalized), so that diagnostics and __LINE__ point at the original.
Comments and string literals are left alone. A `<<<` that is not a launch
stops the build.

OUT is written whole (a temporary file, renamed): make may write one file
twice at once under two names. selftest.cu includes
"../../../kernels/cuda/kcuda_ptx.h", relative to its copy in
$(BUILD)/emu-gen/tests/gpu/emu/, and g++ names that header (and those it
includes) so in selftest.o's dependencies; make then remakes the copy by
that name too, beside the kernels' remaking it by its own.
"""
import os
import sys


def skip_literal_or_comment(s, i):
    """If s[i:] starts a comment or a string/char literal, the index after
    it; else i."""
    if s.startswith("//", i):
        j = s.find("\n", i)
        return len(s) if j < 0 else j
    if s.startswith("/*", i):
        j = s.find("*/", i + 2)
        if j < 0:
            raise SystemExit("unterminated comment")
        return j + 2
    if s[i] in "\"'":
        q, j = s[i], i + 1
        while j < len(s) and s[j] != q:
            j += 2 if s[j] == "\\" else 1
        return j + 1
    return i


def kernel_start(s, i, line):
    """The start of the kernel expression that ends before s[i] ('<<<')."""
    j = i - 1
    while j >= 0 and s[j].isspace():
        j -= 1
    if j >= 0 and s[j] == ">":  # template arguments: match the '<'
        depth = 0
        while j >= 0:
            c = s[j]
            if c in ">)]":
                depth += 1
            elif c in "<([":
                depth -= 1
                if depth == 0 and c == "<":
                    break
            j -= 1
        j -= 1
        while j >= 0 and s[j].isspace():
            j -= 1
    end = j + 1
    while j >= 0 and (s[j].isalnum() or s[j] in "_:"):
        j -= 1
    start = j + 1
    if start == end:
        raise SystemExit("line %d: `<<<` does not follow a kernel name" % line)
    return start


def config_end(s, i, line):
    """The index of the '>>>' that closes the '<<<' ending at i."""
    depth = 0
    while i < len(s):
        k = skip_literal_or_comment(s, i)
        if k != i:
            i = k
            continue
        c = s[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(">>>", i):
            return i
        i += 1
    raise SystemExit("line %d: `<<<` without `>>>`" % line)


def rewrite(s):
    out, i, last = [], 0, 0
    while i < len(s):
        k = skip_literal_or_comment(s, i)
        if k != i:
            i = k
            continue
        if s.startswith("<<<", i):
            line = s.count("\n", 0, i) + 1
            start = kernel_start(s, i, line)
            end = config_end(s, i + 3, line)
            kernel = s[start:i]
            name = " ".join(kernel.split())
            after = end + 3
            while after < len(s) and s[after].isspace():
                after += 1
            if after >= len(s) or s[after] != "(":
                raise SystemExit("line %d: a launch without its arguments" % line)
            out.append(s[last:start])
            out.append('::emu::launcher(%s, "%s", __FILE__, __LINE__, %s)'
                       % (kernel, name, s[i + 3:end]))
            i = last = end + 3
            continue
        i += 1
    out.append(s[last:])
    return "".join(out)


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: launch_rewrite.py IN OUT")
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        text = f.read()
    try:
        body = rewrite(text)
    except SystemExit as e:
        raise SystemExit("%s: %s" % (src, e))
    tmp = "%s.tmp%d" % (dst, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        f.write('#line 1 "%s"\n' % os.path.normpath(src))
        f.write(body)
    os.replace(tmp, dst)


if __name__ == "__main__":
    main()
