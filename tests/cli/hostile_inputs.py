#!/usr/bin/env python3
"""The tinyloop tool against hostile input: each case checks the exit status, the message and, outside sanitizer
builds, that the memory the process peaked at (ru_maxrss) stays bounded by the work asked for.

    hostile_inputs.py TOOL MODEL WORK_DIR [--sanitized]

Standard library only. Exits 1 naming every case that failed.
"""
import json
import os
import struct
import subprocess
import sys

TOOL, MODEL, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(WORK, exist_ok=True)
SANITIZED = "--sanitized" in sys.argv[4:]  # ASan's quarantine and shadow memory make RSS meaningless
MIB = 1 << 20
failures = []


def write_input(path, *parts):
    """Writes the parts (bytes, or (bytes, count) for a repeat) in pieces: this process never holds a big input, since
    ru_maxrss counts what the child held before it exec'd the tool too, and that is a copy of this process."""
    with open(path, "wb") as f:
        for part in parts:
            data, count = part if isinstance(part, tuple) else (part, 1)
            step = max(1, (1 << 16) // max(1, len(data)))
            while count > 0:
                f.write(data * min(step, count))
                count -= step


def run(args, stdin=b""):
    """(exit status, stdout, stderr, peak RSS in bytes) of the tool; a signal is a negative status. `stdin`: bytes,
    or a tuple of write_input's parts."""
    write_input(os.path.join(WORK, "stdin"), *(stdin if isinstance(stdin, tuple) else (stdin,)))
    with open(os.path.join(WORK, "stdin"), "rb") as f_in, open(os.path.join(WORK, "stdout"), "wb") as f_out, \
            open(os.path.join(WORK, "stderr"), "wb") as f_err:
        p = subprocess.Popen([TOOL] + args, stdin=f_in, stdout=f_out, stderr=f_err)
        try:
            _, status, usage = os.wait4(p.pid, 0)
        except BaseException:
            p.kill()
            raise
        p.returncode = os.waitstatus_to_exitcode(status)
    out = open(os.path.join(WORK, "stdout"), "rb").read().decode(errors="replace")
    err = open(os.path.join(WORK, "stderr"), "rb").read().decode(errors="replace")
    return p.returncode, out, err, usage.ru_maxrss * 1024


def check(name, ok, detail):
    print(("ok     " if ok else "FAILED ") + name + ("" if ok else ": " + detail))
    if not ok:
        failures.append(name)


def expect(name, args, stdin=b"", rc=1, says=(), max_rss=None):
    status, out, err, rss = run(args, stdin)
    problems = []
    if status != rc:
        problems.append(f"exit status {status}, expected {rc}")
    for text in says:
        if text not in out + err:
            problems.append(f"no {text!r} in the output")
    if max_rss is not None and not SANITIZED and rss > max_rss:
        problems.append(f"peaked at {rss / MIB:.0f} MiB, over {max_rss / MIB:.0f} MiB")
    check(f"{name} (peak {rss / MIB:.0f} MiB)", not problems,
          "; ".join(problems) + f"\nstdout: {out[:2000]}\nstderr: {err[:2000]}")
    return out


batch = ["score-batch", MODEL, "--backend", "cpu", "--threads", "1"]

# A value nested 100k deep: once a stack overflow in the error path, now refused by its line.
deep = (b'{"tokens":', (b"[", 100000), b"1", (b"]", 100000), b'}\n{"tokens": [1, 2]}\n')
expect("nested_json", batch, deep, says=[
    '"line":1,"error":"the request nests arrays and objects deeper than 64 levels', '"index":1,"nll_sum"'])
deep_context = (b'{"tokens": [1, 2], "n_context": ', (b"[", 100000), (b"]", 100000), b"}\n")
expect("nested_n_context", batch, deep_context, says=["deeper than 64 levels"])

# Endless and over-long input: refused at the line limit, having read no more than it.
expect("dev_zero", ["score-batch", MODEL, "--backend", "cpu", "--input", "/dev/zero"],
       says=["line 1 is longer than the limit of 4194304 bytes"], max_rss=48 * MIB)
expect("ten_megabyte_line", batch, (b'{"tokens": [', (b"1,", 5 * MIB), b"1]}\n"),
       says=["line 1 is longer than the limit of 4194304 bytes"], max_rss=48 * MIB)
# Lines under the byte limit are parsed at a cost bounded by the limits: over 2^20 values are refused by their count,
# fewer by the model's max_seq.
expect("over_a_million_values", batch, (b'{"tokens": [', (b"1,", MIB + 16), b"1]}\n"),
       says=["holds more than 1048576 values"], max_rss=48 * MIB)
expect("a_million_values", batch, (b'{"tokens": [', (b"1,", MIB - 8), b"1]}\n"),
       says=["n_tokens = 1048569 is outside [2, max_seq = 128]"], max_rss=160 * MIB)

# NUL ends nlohmann's input: what follows must not be accepted.
expect("nul_then_junk", batch, b'{"tokens":[1,2]}\x00junk\n', says=["control byte 0x00 at byte 16"])

# Small defects, each named.
expect("empty_tokens", batch, b'{"tokens":[]}\n', says=["n_tokens = 0 is outside [2, max_seq = 128]"])
expect("empty_context", batch, b'{"context": [], "continuation": [1, 2]}\n', says=['\\"context\\" is empty'])
expect("empty_context_text", batch, b'{"context_text": "", "text": "ab"}\n', says=['\\"context_text\\" is empty'])
expect("negative_threads", batch[:-2] + ["--threads", "-1"], b'{"tokens":[1,2]}\n', rc=2,
       says=["must be 0 (all) or a positive count, not -1"])

# One bad line among good ones: every line gets its own output line, in order.
mixed = b'{"tokens": [1, 2, 3]}\nnot json\n\n{"tokens": [1, 999]}\n{"text": "hi"}\n'
out = expect("mixed_lines", batch, mixed, says=["2 of 4 requests failed"])
lines = [json.loads(line) for line in out.splitlines()]
check("mixed_lines_output", [("error" in j, j.get("line")) for j in lines] ==
      [(False, None), (True, 2), (True, 4), (False, None)] and [j["index"] for j in lines] == [0, 1, 2, 3],
      f"output lines: {lines}")

# The output is checked before any work: a path that cannot be written fails at once.
expect("unwritable_output", batch + ["--output", os.path.join(WORK, "no_such_dir", "out.jsonl")],
       b'{"tokens": [1, 2]}\n', says=["cannot open output file"])


# The largest header (16 MiB) of small values: refused by its value count, at a fraction of the ~20x its size a
# parse of it would cost.
def header_file(path, *parts):
    size = sum(len(p[0]) * p[1] if isinstance(p, tuple) else len(p) for p in parts)
    write_input(path, struct.pack("<Q", size + (8 - size % 8) % 8), *parts, b" " * ((8 - size % 8) % 8))


small_values = os.path.join(WORK, "small_values.tinyloop")
header_file(small_values, b'{"a": [', (b"0,", 8 * MIB - 16), b"0]}")
expect("header_of_small_values", ["info", small_values], says=["holds more than 262144 values"], max_rss=48 * MIB)
# As many values as allowed, in a 16 MiB header: parsed within a small multiple of its size.
many = os.path.join(WORK, "many_values.tinyloop")
values = 262144 - 8
header_file(many, b'{"__metadata__": {"pad": "', (b"x", 16 * MIB - 4 * values - 64), b'"}, "a": [',
            (b"[0],", values // 2 - 1), b"[0]]}")
expect("header_at_value_limit", ["info", many], says=["__metadata__ has no 'format'"], max_rss=128 * MIB)

if failures:
    print(f"{len(failures)} case(s) failed: {', '.join(failures)}")
    sys.exit(1)
print("all cases passed")
