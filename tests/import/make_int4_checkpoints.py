#!/usr/bin/env python3
"""Writes GPTQ-layout and AWQ-layout INT4 tensors of a few linear layers, with their expected dequantized values,
for the import.* tests (tests/import/import_test.cpp). Standard library only; a fixed seed, so the files are the
same on every run.

    python3 make_int4_checkpoints.py OUT_DIR      ->  OUT_DIR/gptq.safetensors, OUT_DIR/awq.safetensors

Each file holds, for each layer L (named after its shape, e.g. "k128_n64_g32"):
  L.qweight   I32   GPTQ: [K/8, N] (8 consecutive K rows per int32, low nibble first)
                    AWQ:  [K, N/8] (8 columns per int32, nibble i holding column 8c + AWQ_ORDER[i])
  L.qzeros    I32   [G, N/8] (GPTQ: columns in order, each nibble = zero - 1; AWQ: AWQ_ORDER, the zero itself)
  L.scales    F16   [G, N]
  L.g_idx     I32   [K] (GPTQ only): k // group_size, what GPTQ writes without act-order; for the act-order layer
                    (GPTQ, named "..._actorder") the group of each row after its rows were shuffled (make_act_order)
  L.expected  F32   [K, N] W[k, n] = (q[k, n] - z[g, n]) * s[g, n], computed here from the unpacked integers
  L.zero      I32   [G, N] the zero points z as the checkpoint's own dequantization reads them
G = K / group_size (1 for per row). The expected values come from this script's own plain loops: the codes and
zeros are drawn first, packed as each layout does, then unpacked again with loops that share nothing with the
packing code, and the unpacked values must equal the drawn ones.
"""
import json
import os
import random
import struct
import sys

SEED = 20240607
# (K, N, group_size); group_size 0 = per row.
SHAPES = [(128, 64, 32), (256, 40, 128), (96, 24, 0)]

# AutoAWQ's packing order (awq/utils/packing_utils.py AWQ_ORDER; awq/modules/linear/gemm.py order_map): nibble i of
# a word holds column 8c + AWQ_ORDER[i].
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def to_half(x):
    """The nearest FP16 value (as a Python float) and its bit pattern."""
    bits = struct.unpack("<H", struct.pack("<e", x))[0]
    return struct.unpack("<e", struct.pack("<H", bits))[0], bits


def pack(values, bits=4):
    """32 / bits codes, values[i] in bits bits*i .. bits*i + bits - 1, as a signed int32 (what the checkpoint's int32
    tensor holds): 8 nibbles at 4 bits, 4 bytes at 8 bits."""
    word = 0
    for i, v in enumerate(values):
        assert 0 <= v < (1 << bits)
        word |= v << (bits * i)
    return word - (1 << 32) if word >= (1 << 31) else word


def unpack(word, i, bits=4):
    return ((word & 0xFFFFFFFF) >> (bits * i)) & ((1 << bits) - 1)


def pack8(values):
    return pack(values, 4)


def nibble(word, i):
    return unpack(word, i, 4)


def make_layer(rng, layout, k, n, group_size, bits=4):
    """bits=8 (GPTQ only): symmetric 8-bit GPTQ, codes 0..255 (0 is -128 after the zero point, which GPTQ's rounding
    gives a group's most negative weight when it is the largest in magnitude), zero points 128 (stored as 127), 4 codes
    per int32, low byte first."""
    if bits == 8:
        return make_layer8(rng, k, n, group_size)
    gs = group_size if group_size else k
    groups = k // gs
    q = [[rng.randrange(16) for _ in range(n)] for _ in range(k)]  # q[k][n]
    if layout == "gptq":
        # v1 stores zero - 1 in a nibble, read back as nibble + 1: zero points 1..16.
        z = [[rng.randrange(1, 17) for _ in range(n)] for _ in range(groups)]
    else:
        z = [[rng.randrange(16) for _ in range(n)] for _ in range(groups)]
    s_val, s_bits = random_scales(rng, groups, n)

    # Pack as the layout does.
    if layout == "gptq":
        qweight = [[pack8([q[8 * r + i][c] for i in range(8)]) for c in range(n)] for r in range(k // 8)]
        qzeros = [[pack8([z[g][8 * c + i] - 1 for i in range(8)]) for c in range(n // 8)] for g in range(groups)]
        qweight_shape, qzeros_shape = [k // 8, n], [groups, n // 8]
    else:
        qweight = [[pack8([q[r][8 * c + AWQ_ORDER[i]] for i in range(8)]) for c in range(n // 8)] for r in range(k)]
        qzeros = [[pack8([z[g][8 * c + AWQ_ORDER[i]] for i in range(8)]) for c in range(n // 8)]
                  for g in range(groups)]
        qweight_shape, qzeros_shape = [k, n // 8], [groups, n // 8]

    # Unpack again with plain loops, independently of the packing above, and check the round trip.
    uq = [[0] * n for _ in range(k)]
    uz = [[0] * n for _ in range(groups)]
    if layout == "gptq":
        for r in range(k // 8):
            for c in range(n):
                for i in range(8):
                    uq[8 * r + i][c] = nibble(qweight[r][c], i)
        for g in range(groups):
            for c in range(n // 8):
                for i in range(8):
                    uz[g][8 * c + i] = nibble(qzeros[g][c], i) + 1
    else:
        # AWQ_REVERSE_ORDER[j] is the nibble that holds column 8c + j.
        reverse = [AWQ_ORDER.index(j) for j in range(8)]
        assert reverse == [0, 4, 1, 5, 2, 6, 3, 7]
        for r in range(k):
            for c in range(n // 8):
                for j in range(8):
                    uq[r][8 * c + j] = nibble(qweight[r][c], reverse[j])
        for g in range(groups):
            for c in range(n // 8):
                for j in range(8):
                    uz[g][8 * c + j] = nibble(qzeros[g][c], reverse[j])
    assert uq == q and uz == z, "pack/unpack round trip"

    expected = [[(uq[kk][c] - uz[kk // gs][c]) * s_val[kk // gs][c] for c in range(n)] for kk in range(k)]
    name = f"k{k}_n{n}_" + (f"g{group_size}" if group_size else "row")
    tensors = {
        f"{name}.qweight": ("I32", qweight_shape, [x for row in qweight for x in row]),
        f"{name}.qzeros": ("I32", qzeros_shape, [x for row in qzeros for x in row]),
        f"{name}.scales": ("F16", [groups, n], [x for row in s_bits for x in row]),
        f"{name}.expected": ("F32", [k, n], [x for row in expected for x in row]),
        f"{name}.zero": ("I32", [groups, n], [x for row in uz for x in row]),
    }
    if layout == "gptq":
        tensors[f"{name}.g_idx"] = ("I32", [k], [kk // gs for kk in range(k)])
    return tensors


def random_scales(rng, groups, n):
    s_val, s_bits = [], []
    for _ in range(groups):
        row_v, row_b = [], []
        for _ in range(n):
            magnitude = 2.0 ** rng.uniform(-12.0, -1.0)
            v, b = to_half(-magnitude if rng.random() < 0.05 else magnitude)  # a few negative scales too
            row_v.append(v)
            row_b.append(b)
        s_val.append(row_v)
        s_bits.append(row_b)
    return s_val, s_bits


def make_layer8(rng, k, n, group_size):
    gs = group_size if group_size else k
    groups = k // gs
    q = [[rng.randrange(256) for _ in range(n)] for _ in range(k)]
    q[0][0] = 0  # at least one -128
    z = [[128] * n for _ in range(groups)]
    s_val, s_bits = random_scales(rng, groups, n)
    qweight = [[pack([q[4 * r + i][c] for i in range(4)], 8) for c in range(n)] for r in range(k // 4)]
    qzeros = [[pack([z[g][4 * c + i] - 1 for i in range(4)], 8) for c in range(n // 4)] for g in range(groups)]
    # Unpacked again with plain loops.
    uq = [[unpack(qweight[kk // 4][c], kk % 4, 8) for c in range(n)] for kk in range(k)]
    uz = [[unpack(qzeros[g][c // 4], c % 4, 8) + 1 for c in range(n)] for g in range(groups)]
    assert uq == q and uz == z, "pack/unpack round trip"
    expected = [[(uq[kk][c] - uz[kk // gs][c]) * s_val[kk // gs][c] for c in range(n)] for kk in range(k)]
    name = f"k{k}_n{n}_" + (f"g{group_size}" if group_size else "row") + "_int8"
    return {
        f"{name}.qweight": ("I32", [k // 4, n], [x for row in qweight for x in row]),
        f"{name}.qzeros": ("I32", [groups, n // 4], [x for row in qzeros for x in row]),
        f"{name}.scales": ("F16", [groups, n], [x for row in s_bits for x in row]),
        f"{name}.expected": ("F32", [k, n], [x for row in expected for x in row]),
        f"{name}.zero": ("I32", [groups, n], [x for row in uz for x in row]),
        f"{name}.g_idx": ("I32", [k], [kk // gs for kk in range(k)]),
    }


def make_act_order(tensors, name, perm, group_size):
    """Reorders the K rows of a GPTQ layer made by make_layer as act-order (desc_act) leaves them: row k of the result
    is row perm[k] of the original, codes, g_idx and expected values alike (so every group still has group_size rows,
    now scattered over K). The tensors are renamed to name + "_actorder"."""
    dtype, shape, words = tensors[f"{name}.qweight"]
    k, n = shape[0] * 8, shape[1]
    q = [[nibble(words[(kk // 8) * n + c], kk % 8) for c in range(n)] for kk in range(k)]
    shuffled = [q[perm[kk]] for kk in range(k)]
    qweight = [pack8([shuffled[8 * r + i][c] for i in range(8)]) for r in range(k // 8) for c in range(n)]
    expected = tensors[f"{name}.expected"][2]
    out = {}
    for key, value in tensors.items():
        out[key.replace(name + ".", name + "_actorder.")] = value
    out[f"{name}_actorder.qweight"] = (dtype, shape, qweight)
    out[f"{name}_actorder.g_idx"] = ("I32", [k], [perm[kk] // group_size for kk in range(k)])
    out[f"{name}_actorder.expected"] = ("F32", [k, n],
                                        [x for kk in range(k) for x in expected[perm[kk] * n:(perm[kk] + 1) * n]])
    return out


def write_safetensors(path, tensors, metadata=None, misalign=False):
    """tensors: name -> (dtype, shape, values): a list (F16 and BF16 values are bit patterns), or an array of the
    stored items with tobytes() (numpy, little-endian: checkpoint_matrix.py). Tensors in name order, back to back.
    misalign=True pads the header to an odd length instead of a multiple of 8, so that the data section and every
    tensor start at an odd offset: other writers need not align tensors, and readers must cope
    (make_looped_checkpoints.py uses it)."""
    fmt = {"I32": "<%di", "F16": "<%dH", "BF16": "<%dH", "F32": "<%df"}
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        dtype, shape, values = tensors[name]
        blob = values.tobytes() if hasattr(values, "tobytes") else struct.pack(fmt[dtype] % len(values), *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((len(text) + 1) % 2 if misalign else -len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for layout in ("gptq", "awq"):
        rng = random.Random(f"{SEED}-{layout}")
        tensors = {}
        for k, n, group_size in SHAPES:
            tensors.update(make_layer(rng, layout, k, n, group_size))
        if layout == "gptq":
            k, n, group_size = SHAPES[0]
            layer = make_layer(rng, layout, k, n, group_size)
            perm = list(range(k))
            rng.shuffle(perm)
            tensors.update(make_act_order(layer, f"k{k}_n{n}_g{group_size}", perm, group_size))
        write_safetensors(os.path.join(out, f"{layout}.safetensors"), tensors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
