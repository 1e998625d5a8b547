#!/usr/bin/env python3
"""`tinyloop score`'s perplexity conventions against a recomputation apart from them: the windows or chunks are laid
out here from each convention's own description (Hugging Face's loop, llama-perplexity's chunks), each is scored
alone with a plain `score --tokens FILE --per-token OUT` (one window: the tl_score path, not tl_score_batch's), the
tokens each convention scores are picked from those NLLs, and the tool's per-token output, totals, running
perplexities and standard error must agree. Also: the progress lines' running perplexity, and the usage errors.

    perplexity_conventions.py TOOL MODEL TEXT WORK_DIR

The model must be byte-level with max_seq >= 128 (tests/data/tiny.tinyloop). Standard library only. Exits 1 naming
every check that failed.
"""
import json
import math
import os
import re
import statistics
import subprocess
import sys

TOOL, MODEL, TEXT, WORK = sys.argv[1:5]
os.makedirs(WORK, exist_ok=True)
N_TOKENS = 600
with open(TEXT, "rb") as f:
    TOKENS = list(f.read(N_TOKENS))
assert len(TOKENS) == N_TOKENS, "the text is too short"
TOKEN_FILE = os.path.join(WORK, "tokens.txt")
with open(TOKEN_FILE, "w") as f:
    f.write(" ".join(map(str, TOKENS)) + "\n")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}")


def run(args):
    """(exit status, stdout, stderr) of the tool."""
    p = subprocess.run([TOOL] + args, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def read_per_token(path):
    """{position: (token, nll)} from a --per-token file."""
    rows = {}
    with open(path) as f:
        for line in f:
            position, token, nll = line.split("\t")
            rows[int(position)] = (int(token), float(nll))
    return rows


def score(args, name):
    """Scores TOKEN_FILE on the CPU with `args`: (the JSON report, the per-token rows)."""
    per_token = os.path.join(WORK, name + ".tsv")
    rc, out, err = run(["score", MODEL, "--tokens", TOKEN_FILE, "--backend", "cpu", "-q", "--json",
                        "--per-token", per_token] + args)
    if rc != 0:
        raise SystemExit(f"score {args}: exit {rc}: {err}")
    return json.loads(out), read_per_token(per_token)


def nll_alone(tokens):
    """Each token's NLL (but the first's) with `tokens` scored alone, as one window: {index in tokens: nll}."""
    path = os.path.join(WORK, "alone.txt")
    with open(path, "w") as f:
        f.write(" ".join(map(str, tokens)) + "\n")
    per_token = os.path.join(WORK, "alone.tsv")
    rc, _, err = run(["score", MODEL, "--tokens", path, "--backend", "cpu", "-q", "--per-token", per_token])
    if rc != 0:
        raise SystemExit(f"scoring {len(tokens)} tokens alone: exit {rc}: {err}")
    return {p: nll for p, (_, nll) in read_per_token(per_token).items()}


def close(a, b, rel=1e-5, abs_tol=0.0):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def compare(name, report, rows, expected):
    """The tool's per-token rows and totals against `expected` {position: nll}."""
    check(sorted(rows) == sorted(expected),
          f"{name}: scored positions differ: tool {len(rows)}, expected {len(expected)}, "
          f"first difference {sorted(set(rows) ^ set(expected))[:5]}")
    check(all(rows[p][0] == TOKENS[p] for p in rows), f"{name}: a per-token row names the wrong token")
    worst = max((abs(rows[p][1] - expected[p]) for p in rows if p in expected), default=0.0)
    check(worst <= 1e-5, f"{name}: per-token NLLs differ from the recomputation by up to {worst}")
    nll = [expected[p] for p in sorted(expected)]
    total = math.fsum(nll)
    check(report["tokens_scored"] == len(nll), f"{name}: tokens_scored {report['tokens_scored']}, expected {len(nll)}")
    check(close(report["nll_sum"], total), f"{name}: nll_sum {report['nll_sum']}, recomputed {total}")
    ppl = math.exp(total / len(nll))
    check(close(report["perplexity"], ppl), f"{name}: perplexity {report['perplexity']}, recomputed {ppl}")
    se = ppl * statistics.stdev(nll) / math.sqrt(len(nll))
    check(close(report["perplexity_stderr"], se, 1e-4),
          f"{name}: perplexity_stderr {report['perplexity_stderr']}, recomputed {se}")
    return nll


# ---- The default windows, and stride = window - 1, which is the same convention ----
default, default_rows = score(["--window", "64"], "default")
check(default["convention"] == {"name": "windows", "window": 64}, f"default: convention {default['convention']}")
same, same_rows = score(["--window", "64", "--stride", "63"], "stride63")
check(same["convention"] == {"name": "stride", "window": 64, "stride": 63}, f"stride 63: {same['convention']}")
check(same_rows == default_rows, "--stride 63 --window 64 scores other NLLs than the default windows of 64")
check(same["windows"] == default["windows"] == 10, f"windows: {same['windows']} and {default['windows']}, not 10")
check(close(same["nll_sum"], default["nll_sum"], 1e-12), "--stride 63 --window 64: another nll_sum")


# ---- Hugging Face's sliding window ----
def hugging_face(n, window, stride):
    """The guide's loop: (begin, end, trg_len) per window; the last trg_len tokens of each are the targets (the first
    window's first token has no prediction, as the model shifts its labels)."""
    windows, prev_end = [], 0
    for begin in range(0, n, stride):
        end = min(begin + window, n)
        windows.append((begin, end, end - prev_end))
        prev_end = end
        if end == n:
            break
    return windows


for window, stride in [(64, 24), (128, 50), (64, 1)]:
    name = f"stride {stride}, window {window}"
    if window == 128:
        report, rows = score(["--stride", str(stride)], f"stride{stride}")  # the window is the model's max_seq, 128
    else:
        report, rows = score(["--window", str(window), "--stride", str(stride)], f"stride{stride}")
    check(report["convention"] == {"name": "stride", "window": window, "stride": stride},
          f"{name}: convention {report['convention']}")
    windows = hugging_face(N_TOKENS, window, stride)
    check(report["windows"] == len(windows), f"{name}: {report['windows']} windows, expected {len(windows)}")
    expected = {}
    for begin, end, trg_len in windows:
        if stride == 1 and begin % 37 != 0 and end != N_TOKENS:
            continue  # stride 1: 537 windows; every 37th and the last are recomputed, the others only counted
        alone = nll_alone(TOKENS[begin:end])
        for p in range(max(1, end - begin - trg_len), end - begin):
            expected[begin + p] = alone[p]
    if stride == 1:
        check(len(rows) == N_TOKENS - 1, f"{name}: {len(rows)} tokens scored, not {N_TOKENS - 1}")
        worst = max(abs(rows[p][1] - nll) for p, nll in expected.items())
        check(worst <= 1e-5, f"{name}: NLLs differ from the recomputation by up to {worst}")
    else:
        nll = compare(name, report, rows, expected)
        check(len(nll) == N_TOKENS - 1, f"{name}: {len(nll)} tokens scored, not every one but the first")
        check(report["perplexity"] != default["perplexity"], f"{name}: the same perplexity as the default windows")


# ---- llama-perplexity ----
def llama_chunks(n, ctx, bos=None):
    """llama-perplexity's chunks, from its description: floor(n / ctx) chunks of ctx tokens, each scored alone (its
    first token replaced by BOS when the model has one), the logits of positions ctx/2 .. ctx - 2 scored against the
    tokens after them. {position: nll}, and the NLLs chunk by chunk."""
    expected, per_chunk = {}, []
    for c in range(n // ctx):
        chunk = TOKENS[c * ctx:(c + 1) * ctx]
        if bos is not None:
            chunk = [bos] + chunk[1:]
        alone = nll_alone(chunk)
        first = ctx // 2
        per_chunk.append([alone[j + 1] for j in range(first, ctx - 1)])
        for j in range(first, ctx - 1):
            expected[c * ctx + j + 1] = alone[j + 1]
    return expected, per_chunk


def check_llama_text(name, out, per_chunk):
    """The [k] running perplexities and the Final estimate line, against the per-chunk NLLs."""
    values = re.findall(r"\[(\d+)\]([0-9.]+),", out.split("\n")[0])
    check([int(k) for k, _ in values] == list(range(1, len(per_chunk) + 1)),
          f"{name}: the first line is not [1]..[{len(per_chunk)}]: {out.splitlines()[0][:200]}")
    nll = []
    for (k, value), chunk in zip(values, per_chunk):
        nll += chunk
        running = math.exp(math.fsum(nll) / len(nll))
        check(close(float(value), running, 1e-6, 6e-5), f"{name}: [{k}]{value}, recomputed {running:.6f}")
    m = re.search(r"^Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)$", out, re.M)
    check(m is not None, f"{name}: no 'Final estimate: PPL = x +/- y' line:\n{out}")
    if m:
        ppl = math.exp(math.fsum(nll) / len(nll))
        se = ppl * statistics.stdev(nll) / math.sqrt(len(nll))
        check(close(float(m.group(1)), ppl, 1e-6, 6e-5) and close(float(m.group(2)), se, 1e-4, 6e-6),
              f"{name}: {m.group(0)}; recomputed PPL = {ppl:.4f} +/- {se:.5f}")


for ctx, bos in [(64, None), (None, None), (64, 7)]:
    args = ["--llama-perplexity"] + (["--ctx", str(ctx)] if ctx else [])
    args += ["--bos", str(bos)] if bos is not None else []
    name = " ".join(args)
    report, rows = score(args, "llama")
    ctx = ctx or 128  # the default: 512 capped at max_seq
    chunks = N_TOKENS // ctx
    check(report["convention"] == {"name": "llama-perplexity", "ctx": ctx, "chunks": chunks,
                                   "scored_per_chunk": ctx // 2 - 1, "bos": bos},
          f"{name}: convention {report['convention']}")
    check(report["windows"] == chunks, f"{name}: {report['windows']} chunks, expected {chunks}")
    expected, per_chunk = llama_chunks(N_TOKENS, ctx, bos)
    compare(name, report, rows, expected)
    check(report["tokens_scored"] == chunks * (ctx // 2 - 1), f"{name}: {report['tokens_scored']} tokens scored")
    check(len(report["running_perplexity"]) == chunks, f"{name}: running_perplexity {report['running_perplexity']}")
    rc, out, err = run(["score", MODEL, "--tokens", TOKEN_FILE, "--backend", "cpu", "-q"] + args)
    check(rc == 0, f"{name} (text report): exit {rc}: {err}")
    check_llama_text(name, out, per_chunk)
    check(f"tokens        {chunks * (ctx // 2 - 1)} scored ({N_TOKENS} in, {chunks} chunks)" in out,
          f"{name}: the report's tokens line:\n{out}")


# ---- Progress lines: the running perplexity, the last one the result's ----
for args, unit, passes in [(["--window", "64"], "windows", 10), (["--window", "64", "--stride", "24"], "windows",
                            len(hugging_face(N_TOKENS, 64, 24))),
                           (["--llama-perplexity", "--ctx", "64"], "chunks", 9)]:
    name = "progress of " + " ".join(args)
    rc, out, err = run(["score", MODEL, "--tokens", TOKEN_FILE, "--backend", "cpu", "--progress-interval", "0"] + args)
    check(rc == 0, f"{name}: exit {rc}: {err}")
    lines = re.findall(r"^progress (\d+)/(\d+) tokens .*, PPL ([0-9.]+) over (\d+) (window|chunk)s?$", err, re.M)
    # On the CPU a report follows each window (each sequence of tl_score_batch).
    check(len(lines) == passes and [int(line[3]) for line in lines] == list(range(1, passes + 1)),
          f"{name}: expected a line per {unit[:-1]} (1..{passes}):\n{err}")
    result = re.search(r"^perplexity +([0-9.]+)$", out, re.M)
    check(bool(lines) and result is not None and lines[-1][2] == result.group(1) and lines[-1][0] == lines[-1][1],
          f"{name}: the last progress line's perplexity is not the result's:\n{err}\n{out}")


# ---- Usage errors (exit 2) and a text too short for llama-perplexity (exit 1) ----
for args, message in [
        (["--stride", "0"], r"--stride 0: the stride S must satisfy 1 <= S <= window - 1"),
        (["--stride", "-5"], r"--stride -5: the stride S must satisfy"),
        (["--window", "64", "--stride", "64"], r"--stride 64: the stride must be at most the window length - 1 = 63"),
        (["--stride", "128"], r"--stride 128: the stride must be at most the window length - 1 = 127 \(the window is "
                              r"the model's max_seq"),
        (["--window", "200", "--stride", "5"], r"--window 200 is outside \[2, max_seq = 128\]"),
        (["--window", "1", "--stride", "1"], r"--window 1 is outside \[2, max_seq = 128\]"),
        (["--llama-perplexity", "--ctx", "63"], r"--ctx 63: llama-perplexity's context must be even"),
        (["--llama-perplexity", "--ctx", "2"], r"--ctx 2: llama-perplexity's context must be at least 4"),
        (["--llama-perplexity", "--ctx", "256"], r"--ctx 256: above the model's max_seq = 128"),
        (["--llama-perplexity", "--bos", "256"], r"--bos 256 is outside the vocabulary \[0, 256\)"),
        (["--ctx", "64"], r"--ctx requires --llama-perplexity"),
        (["--bos", "1"], r"--bos requires --llama-perplexity"),
        (["--llama-perplexity", "--stride", "8"], r"--stride excludes --llama-perplexity"),
        (["--llama-perplexity", "--window", "64"], r"--window excludes --llama-perplexity")]:
    rc, out, err = run(["score", MODEL, "--tokens", TOKEN_FILE, "--backend", "cpu", "-q"] + args)
    check(rc == 2 and re.search("^tinyloop: " + message, err, re.M) is not None,
          f"{' '.join(args)}: exit {rc} (expected 2), stderr:\n{err}")
# The model-free checks come before the model is loaded.
rc, _, err = run(["score", os.path.join(WORK, "no-such-model"), "--tokens", TOKEN_FILE, "--stride", "0"])
check(rc == 2 and "--stride 0" in err, f"--stride 0 with a model that does not exist: exit {rc}, {err}")
rc, _, err = run(["score", MODEL, "--tokens", TOKEN_FILE, "--backend", "cpu", "-q", "--max-tokens", "255",
                  "--llama-perplexity"])
check(rc == 1 and "needs at least 256 tokens (two chunks" in err and "the input has 255" in err,
      f"llama-perplexity on 255 tokens with chunks of 128: exit {rc}, {err}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all conventions agree with their recomputation")
