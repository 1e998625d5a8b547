#!/usr/bin/env python3
"""Writes the seed corpora of the request-line, checkpoint-import, INT4-import and tokenizer fuzz targets (the model
loader's comes from make_corpus.py). Run by hand; the output is committed under tests/fuzz/corpus/ (CI never
regenerates it):

    python3 tests/fuzz/make_seed_corpora.py <build>/tests/import/looped_checkpoints tests/fuzz/corpus \
        [<build>/tests/text/tokenizer_cases]

The tokenizer seeds (only with the third argument: tests/text/make_tokenizer_cases.py's folder) are fuzz_tokenizer's
mode byte followed by a tokenizer.json (0), the SentencePiece model (1) or a test text (2).

The import seeds are the converter tests' checkpoints (tests/import/make_looped_checkpoints.py) in the fuzz target's
layout: config.json, quantize_config.json and model.safetensors joined by its separator line.
"""
import json
import os
import random
import struct
import sys

SEPARATOR = b"\n@@file@@\n"  # fuzz_import.cpp's kSeparator

REQUESTS = {
    "tokens": b'{"tokens": [72, 101, 108, 108, 111], "n_context": 2}',
    "context_continuation": b'{"context": [72, 101], "continuation": [108, 108, 111]}',
    "text": b'{"text": " world", "context_text": "Hello,"}',
    "text_escapes": b'{"text": "caf\\u00e9 \\"q\\" \\\\ \\n\\t", "context_text": "\\ud83d\\ude00"}',
    "lines": b'{"tokens": [1, 2, 3]}\n\n{"tokens": [1, 2,]}\n{"text": "x"}\r\n   \n{"context": [5], "continuation": [6]}',
    "empty_context": b'{"context": [], "continuation": [1, 2]}',
    "bos": b'{"context": [], "continuation": [1, 2], "bos": 10}\n{"context_text": "", "text": "x", "bos": -1}',
    "empty_tokens": b'{"tokens": []}',
    "nested": b'{"tokens": [[[[[[[[1]]]]]]]]}',
    "nul_junk": b'{"tokens": [1, 2]}\x00junk',
    "big_numbers": b'{"tokens": [2147483647, -2147483648, 2147483648, 1e3, 1.5, -0.0], "n_context": 18446744073709551615}',
    "unknown_key": b'{"tokens": [1, 2], "id": "doc-7"}',
    "not_object": b'[1, 2, 3]',
}


def write(folder, name, data):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def import_seeds(checkpoints, out):
    quantize_config = json.dumps({"bits": 4, "group_size": 32, "desc_act": False, "sym": False}).encode()
    for variant in ["gptq_per_row", "awq", "gptq_act_order", "gptq", "dense_f16_tied", "dense_bf16_untied_gqa",
                    "gptq8_per_row"]:
        folder = os.path.join(checkpoints, variant)
        config, weights = read(os.path.join(folder, "config.json")), read(os.path.join(folder, "model.safetensors"))
        write(out, variant, config + SEPARATOR + SEPARATOR + weights)
        if variant == "gptq_per_row":
            write(out, variant + "_quantize_config", config + SEPARATOR + quantize_config + SEPARATOR + weights)
    bad = os.path.join(checkpoints, "bad")
    for variant in sorted(os.listdir(bad)):
        folder = os.path.join(bad, variant)
        if os.path.exists(os.path.join(folder, "model.safetensors")):
            write(out, "bad_" + variant, read(os.path.join(folder, "config.json")) + SEPARATOR + SEPARATOR +
                  read(os.path.join(folder, "model.safetensors")))
    config = read(os.path.join(checkpoints, "gptq_per_row", "config.json"))
    write(out, "config_only", config)
    write(out, "config_nul_junk", config + b"\x00junk")


def int4_seeds(out):
    rng = random.Random(5)
    # fuzz_int4_import.cpp's layout: flags, k (kind, value), n (kind, value), group, then the arrays' raw bytes.
    for name, flags, k, n, group in [("gptq_grouped", 0x01, 64, 32, 4), ("awq_grouped", 0x02, 64, 32, 4),
                                     ("gptq_per_row", 0x01, 32, 16, 0), ("gptq_g_idx", 0x11, 64, 16, 4),
                                     ("gptq_g_idx_raw", 0x31, 32, 8, 2), ("no_qweight", 0x41, 32, 8, 2)]:
        head = bytes([flags, 3, (k - 1) % 256, 3, (n - 1) % 256, group])
        body = bytes(rng.randrange(256) for _ in range(4 * k * n))
        # Scales as finite halves: overwrite the body's middle with 0x3c00 (1.0) patterns.
        body = body[: len(body) // 2] + struct.pack("<H", 0x3C00) * (len(body) // 4)
        write(out, name, head + body)


def tokenizer_seeds(cases_dir, out):
    for name in ["gpt2", "llama3", "qwen2"]:
        data = json.dumps(json.loads(read(os.path.join(cases_dir, name, "tokenizer.json"))), separators=(",", ":"))
        write(out, "json_" + name, b"\x00" + data.encode())
    for name in ["wordpiece", "bad_regex", "merge_not_in_vocab", "duplicate_id", "truncated", "deep"]:
        write(out, "json_bad_" + name, b"\x00" + read(os.path.join(cases_dir, "bad", name + ".json")))
    write(out, "sentencepiece", b"\x01" + read(os.path.join(cases_dir, "sentencepiece", "tokenizer.model")))
    cases = json.loads(read(os.path.join(cases_dir, "cases.json")))
    for case in cases["gpt2"]["cases"]:
        if case["name"] != "corpus":
            write(out, "text_" + case["name"], b"\x02" + case["text"].encode())
    write(out, "text_not_utf8", b"\x02caf\xe9 \xed\xa0\x80 \xc0\xaf")


def main():
    checkpoints, out = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:
        tokenizer_seeds(sys.argv[3], os.path.join(out, "tokenizer"))
    for name, data in REQUESTS.items():
        write(os.path.join(out, "requests"), name, data)
    import_seeds(checkpoints, os.path.join(out, "import"))
    int4_seeds(os.path.join(out, "int4_import"))


if __name__ == "__main__":
    main()
