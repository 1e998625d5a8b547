#!/usr/bin/env python3
"""Writes the fuzzer's seed corpus: small valid .tinyloop files (from `tinyloop make-model`) and malformed ones
derived from them, one defect each, in the spirit of tests/format/corpus_test.cpp. Run once by hand; the output is
committed as tests/fuzz/corpus/model_load/ (CI never regenerates it):

    python3 tests/fuzz/make_corpus.py <build>/bin/tinyloop tests/fuzz/corpus/model_load
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Small dimensions: each valid file stays a few KB, so the fuzzer's inputs (and max_len) stay small.
SMALL = ["--d-model", "16", "--n-heads", "2", "--head-dim", "8", "--ffn", "32", "--vocab", "32", "--max-seq", "16"]
VALID = {
    "valid_grouped_tied": ["--pre", "1", "--loops", "2", "--group-size", "8"],
    "valid_per_row_quantized_head": ["--pre", "0", "--loops", "1", "--group-size", "0", "--quantize-head"],
    "valid_frac4_sign_bit": ["--pre", "1", "--loops", "3", "--group-size", "8", "--frac4", "--sign-bit"],
    "valid_symmetric": ["--pre", "0", "--loops", "2", "--group-size", "16", "--symmetric"],
    "valid_dense": ["--pre", "0", "--loops", "1", "--group-size", "0", "--dense"],
    "valid_int8_grouped": ["--pre", "1", "--loops", "2", "--group-size", "8", "--bits", "8"],
    "valid_int8_per_row_quantized_head": ["--pre", "0", "--loops", "1", "--group-size", "0", "--bits", "8",
                                          "--quantize-head"],
}


def split(blob):
    (n,) = struct.unpack_from("<Q", blob)
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def join(header, data, text=None):
    text = (json.dumps(header, separators=(",", ":")) if text is None else text).encode()
    return struct.pack("<Q", len(text)) + text + data


def edit_header(base, fn):
    header, data = split(base)
    fn(header)
    return join(header, data)


def edit_config(base, fn):
    def apply(header):
        config = json.loads(header["__metadata__"]["config"])
        fn(config)
        header["__metadata__"]["config"] = json.dumps(config)

    return edit_header(base, apply)


def edit_data(base, tensor, index, raw):
    header, data = split(base)
    begin = header[tensor]["data_offsets"][0] + index
    data = data[:begin] + raw + data[begin + len(raw) :]
    return join(header, data)


def add_tensor(base, name, dtype, shape, raw):
    header, data = split(base)
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    return join(header, data + raw)


def last_tensor(header):
    return max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])


def malformed(base):
    header, data = split(base)
    last = last_tensor(header)
    nan_f16, inf_f32 = struct.pack("<H", 0x7E00), struct.pack("<f", float("inf"))
    cases = {
        # ---- truncation and the length prefix ----
        "bad_empty": b"",
        "bad_seven_bytes": base[:7],
        "bad_length_past_end": struct.pack("<Q", len(base)) + base[8:],
        "bad_length_huge": struct.pack("<Q", 1 << 63) + base[8:],
        "bad_truncated_header": base[: 8 + (len(base) - len(data) - 8) // 2],
        "bad_truncated_data": base[: len(base) - 3],
        # ---- header JSON ----
        "bad_header_not_json": join({}, data, text='{"__metadata__": {'),
        "bad_header_array": join({}, data, text="[1, 2, 3]"),
        "bad_header_only_metadata": join({"__metadata__": header["__metadata__"]}, b""),
        "bad_header_duplicate_key": join({}, data, text=json.dumps(header)[:-1] + ', "' + last + '": {}}'),
        "bad_no_metadata": edit_header(base, lambda h: h.pop("__metadata__")),
        "bad_config_not_json": edit_header(base, lambda h: h["__metadata__"].update(config="{d_model: 16")),
        "bad_format_version": edit_header(base, lambda h: h["__metadata__"].update(format_version="2")),
        # ---- config values (some load fine: the claimed dimensions then bound what the target does) ----
        "cfg_max_seq_huge": edit_config(base, lambda c: c.update(max_seq=1 << 20)),
        "cfg_loops_max": edit_config(base, lambda c: c.update(loops=1024)),
        "bad_cfg_negative_d_model": edit_config(base, lambda c: c.update(d_model=-16)),
        "bad_cfg_odd_head_dim": edit_config(base, lambda c: c.update(head_dim=7)),
        "bad_cfg_group_not_dividing": edit_config(base, lambda c: c.update(group_size=5)),
        "bad_cfg_bits_8": edit_config(base, lambda c: c.update(bits=8)),
        "bad_cfg_vocab_huge": edit_config(base, lambda c: c.update(vocab=1 << 22)),
        "bad_cfg_nan_rope_theta": edit_header(
            base, lambda h: h["__metadata__"].update(config=h["__metadata__"]["config"].replace("10000.0", "NaN"))),
        # ---- tensor entries ----
        "bad_offsets_past_end": edit_header(base, lambda h: h[last].update(data_offsets=[0, len(data) + 64])),
        "bad_offsets_reversed": edit_header(base, lambda h: h[last].update(data_offsets=[16, 8])),
        "bad_offsets_overlap": edit_header(
            base, lambda h: h[last].update(data_offsets=[0, h[last]["data_offsets"][1] - h[last]["data_offsets"][0]])),
        "bad_shape_mismatch": edit_header(base, lambda h: h[last].update(shape=[h[last]["shape"][0] * 2] + h[last]["shape"][1:])),
        "bad_shape_negative": edit_header(base, lambda h: h[last].update(shape=[-1] + h[last]["shape"][1:])),
        "bad_dtype_unknown": edit_header(base, lambda h: h[last].update(dtype="Q4")),
        "bad_dtype_wrong": edit_header(base, lambda h: h[last].update(dtype="F16")),
        "bad_missing_tensor": edit_header(base, lambda h: h.pop(last)),
        "bad_unknown_tensor": edit_header(base, lambda h: h.update({"extra.weight": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})),
        # ---- act-order input permutations (k_perm; loop.mlp_gate has K = d_model = 16) ----
        "kperm_reversed": add_tensor(base, "loop.mlp_gate.k_perm", "I32", [16], struct.pack("<16i", *range(15, -1, -1))),
        "bad_kperm_repeat": add_tensor(base, "loop.mlp_gate.k_perm", "I32", [16], struct.pack("<16i", *([3] * 16))),
        "bad_kperm_out_of_range": add_tensor(base, "loop.mlp_gate.k_perm", "I32", [16],
                                             struct.pack("<16i", *range(1, 17))),
        # ---- values ----
        "bad_nan_scale": edit_data(base, "loop.mlp_up.scales", 2, nan_f16),
        "bad_inf_norm": edit_data(base, "final_norm.weight", 4, inf_f32),
    }
    return cases


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    cli, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in VALID.items():
            path = os.path.join(tmp, name + ".tinyloop")
            subprocess.run([cli, "make-model", "--out", path, *SMALL, *args], check=True, stdout=subprocess.DEVNULL)
            shutil.copy(path, os.path.join(out, name + ".tinyloop"))
        with open(os.path.join(out, "valid_grouped_tied.tinyloop"), "rb") as f:
            base = f.read()
    for name, blob in malformed(base).items():
        with open(os.path.join(out, name + ".tinyloop"), "wb") as f:
            f.write(blob)
    # The committed test fixture too: the real tiny preset (88 KB), with its larger dimensions.
    shutil.copy(os.path.join(ROOT, "tests", "data", "tiny.tinyloop"), os.path.join(out, "valid_tiny_preset.tinyloop"))


if __name__ == "__main__":
    main()
