#!/usr/bin/env python3
"""Writes small tokenizers and the ids they must give, for the tokenizer tests (tests/text, tests/capi, tests/cli,
python/tests, rust/tinyloop/tests). Deterministic: the same files on every run. Needs Debian's python3-regex (the
split patterns' \\p{L} and lookahead) and python3-sentencepiece.

    python3 make_tokenizer_cases.py OUT_DIR

The reference ids are computed here, independently of the library: a pure-Python byte-level BPE (GPT-2's encoder.py
algorithm over the `regex` module's split) for the tokenizer.json files, and Debian's SentencePiece Python binding for
the tokenizer.model. Written:

  OUT_DIR/<name>/tokenizer.json   byte-level BPE tokenizers whose merges are trained here on CORPUS:
      gpt2         ByteLevel pre-tokenizer (GPT-2's regex), merges as "a b" strings, <|endoftext|> in the vocab too
      gpt2_prefix  the same with add_prefix_space true
      llama3       Split (Llama 3's regex) + ByteLevel without regex, merges as ["a", "b"] pairs, ignore_merges, a
                   whole word only the vocabulary has, added tokens one of which is a prefix of another, one not
                   special
      qwen2        NFC normalizer, Split (Qwen2's regex: single digits) + ByteLevel
  OUT_DIR/sentencepiece/tokenizer.model   a BPE SentencePiece model with byte fallback (Llama 2's settings)
  OUT_DIR/cases.json   {name: {"file", "n_ids", "cases": [{"name", "text", "ids", "decoded"}]}}
  OUT_DIR/cases.tsv    the same, one case a line: tokenizer, case name, text as hex, ids (space-separated),
                       decoded text as hex (for the C and Rust tests, which read no JSON)
  OUT_DIR/ckpt_<name>/ a tiny dense looped checkpoint (config.json, model.safetensors; vocab 600) with <name>'s
                       tokenizer file, for `tinyloop import`; ckpt_none has no tokenizer; ckpt_both has gpt2's
                       tokenizer.json and the tokenizer.model (the JSON wins); ckpt_wordpiece has a WordPiece
                       tokenizer.json (refused); ckpt_small_vocab a vocab of 300, which the tokenizers exceed
  OUT_DIR/bad/*.json   tokenizer.json files to refuse (tests/text checks each one's status and message)
  OUT_DIR/cli/         corpus.txt, <name>.ids (its reference ids by each tokenizer), not_utf8.txt (Latin-1),
                       long.txt (over 256 KiB) and sentencepiece_long.ids (its ids, the text encoded whole)
"""
import collections
import io
import json
import os
import random
import struct
import sys
import unicodedata

import regex

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = """The quick brown fox jumps over the lazy dog. It's the dog's day; they're sure we'll see what I'd say.
Tokenizers split text into pieces, and the pieces into tokens. A byte-level BPE never meets an unknown character:
every byte has a token, and merges join the frequent pairs into longer tokens, the tokens into words.
def tokenize(text):
    return [vocab[piece] for piece in split(text)]  # one id per piece

Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 1234 2024-12-06 3.14159 1,000,000 and 99 bottles.
Accents: café, naïve, résumé, Ångström, façade, über, Straße, coöperate, jalapeño, São Paulo.
Chinese: 中文文本的分词很重要。日本語のテキストも、ひらがなとカタカナ。 한국어 문장도 있습니다.
Emoji: I ❤️ tokenizers 🤖🎉 and 👩‍👩‍👧 families; the end 🔚.
Whitespace   runs	and tabs		stay, and lines
end with newlines

and blank lines.
The the THE tHe; token tokens tokenizer tokenizers tokenized; in the beginning was the word, and the word was text.
"""

# The texts each tokenizer is checked on: (name, text).
CASES = [
    ("empty", ""),
    ("hello", "Hello world"),
    ("contractions", "Hello, world! How's it going? I'll be there; we've done it. THEY'RE HERE, AREN'T THEY'D?"),
    ("accents", "café naïve résumé Ångström façade über Straße"),
    ("decomposed", "cafe\u0301 na\u0131\u0308ve A\u030angstro\u0308m"),  # combining marks: NFC composes them
    ("cjk", "日本語のテキスト、中文文本。한국어 문장"),
    ("emoji", "I ❤️ tokenizers 🤖🎉👩‍👩‍👧!"),
    ("whitespace", "a  b   c    d\t\te  \u00a0f\u3000g     "),
    ("newlines", "line one\nline two\r\nline three\n\n\nend\n"),
    ("leading_space", "   indented text"),
    ("only_space", "    "),
    ("numbers", "12345 3.14159 1,000,000 x2 2024-12-06 007"),
    ("code", "def f(x):\n    return x**2  # square\n\tpass\n"),
    ("repeats", "aaaaaaaaaaaaaaaaaaaaa bbbbbbbb abababababab ......!!!!"),
    ("long_word", "supercalifragilisticexpialidocious"),
    ("space_long_word", "say supercalifragilisticexpialidocious twice: supercalifragilisticexpialidocious"),
    ("nul", "a\u0000b\u0000"),
    ("controls", "bell\u0007 escape\u001b[0m del\u007f"),
    ("specials", "<|endoftext|>Hello<|endoftext|> world <|endoftext|><|endoftext|>"),
    ("special_partial", "<|endoftext <|endoftext|x <|endoftext|>"),
    ("llama_specials", "<|begin_of_text|>Hi<|eot_id|><think>hmm</think><think></think> tinyloop! tinyloop"),
    ("qwen_specials", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"),
    ("corpus", CORPUS),
]

SEED = 20261206


def bytes_to_unicode():
    """GPT-2's table: byte -> the character that stands for it."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, dict(zip(bs, map(chr, cs)))


BYTE_ORDER, BYTE_CHAR = bytes_to_unicode()
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


def isolated(pattern, text):
    """The tokenizers library's Split with behavior "Isolated": each match and each stretch between matches."""
    out, start = [], 0
    for m in regex.finditer(pattern, text):
        if m.start() == m.end():
            continue
        if m.start() > start:
            out.append(text[start:m.start()])
        out.append(m.group())
        start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


def byte_chars(piece):
    return "".join(BYTE_CHAR[b] for b in piece.encode("utf-8"))


def train_merges(pattern, n_merges):
    """Frequent-pair BPE training on CORPUS's pieces (ties: the larger pair, so the result is deterministic)."""
    words = collections.Counter()
    for piece in isolated(pattern, CORPUS):
        words[tuple(byte_chars(piece))] += 1
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        (a, b), _count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        merged = collections.Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


class ReferenceBpe:
    """A byte-level BPE tokenizer.json as the tokenizers library runs it (add_special_tokens=False)."""

    def __init__(self, pattern, n_merges, split_regex, nfc=False, prefix_space=False, ignore_merges=False,
                 pair_merges=False, added=(), extra_words=(), endoftext_in_vocab=False):
        self.split_regex = split_regex  # True: Split(pattern) + ByteLevel(use_regex false); False: ByteLevel's regex
        self.pattern = pattern
        self.nfc = nfc
        self.prefix_space = prefix_space
        self.ignore_merges = ignore_merges
        self.pair_merges = pair_merges
        self.merges = train_merges(pattern, n_merges)
        self.ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self.vocab = {}
        for b in BYTE_ORDER:
            self.vocab[BYTE_CHAR[b]] = len(self.vocab)
        for a, b in self.merges:
            self.vocab.setdefault(a + b, len(self.vocab))
        for word in extra_words:  # tokens no merge reaches: only ignore_merges finds them
            self.vocab.setdefault(byte_chars(word), len(self.vocab))
        self.added = []  # (content, id, special)
        for content, special in added:
            if endoftext_in_vocab and content == "<|endoftext|>":
                self.vocab[content] = len(self.vocab)
                self.added.append((content, self.vocab[content], special))
            else:
                self.added.append((content, len(self.vocab) + len(self.added), special))
        self.n_ids = max([len(self.vocab)] + [i + 1 for _, i, _ in self.added])

    def tokenizer_json(self):
        byte_level = {"type": "ByteLevel", "add_prefix_space": self.prefix_space, "trim_offsets": True,
                      "use_regex": not self.split_regex}
        if self.split_regex:
            pre = {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": self.pattern}, "behavior": "Isolated", "invert": False},
                byte_level]}
        else:
            pre = byte_level
        merges = [[a, b] for a, b in self.merges] if self.pair_merges else [f"{a} {b}" for a, b in self.merges]
        return {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": s} for c, i, s in self.added],
            "normalizer": {"type": "NFC"} if self.nfc else None,
            "pre_tokenizer": pre,
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": self.ignore_merges, "vocab": self.vocab, "merges": merges},
        }

    def split_added(self, text):
        """[(text, None) | (None, id)]: added tokens matched literally, leftmost first, the longest at a position."""
        out, start, i = [], 0, 0
        while i < len(text):
            best = None
            for content, token_id, _ in self.added:
                if text.startswith(content, i) and (best is None or len(content) > len(best[0])):
                    best = (content, token_id)
            if best is None:
                i += 1
                continue
            out.append((text[start:i], None))
            out.append((None, best[1]))
            i += len(best[0])
            start = i
        out.append((text[start:], None))
        return out

    def bpe(self, chars):
        """GPT-2's encoder.py: merge the lowest-ranked pair everywhere, until no pair has a rank."""
        if self.ignore_merges and chars in self.vocab:
            return [chars]
        word = list(chars)
        while len(word) > 1:
            pairs = set(zip(word, word[1:]))
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            first, second = best
            out, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    out.extend(word[i:])
                    break
                out.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    out.append(first + second)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            word = out
        return word

    def encode(self, text):
        ids = []
        for segment, token_id in self.split_added(text):
            if token_id is not None:
                ids.append(token_id)
                continue
            if not segment:
                continue
            if self.nfc:
                segment = unicodedata.normalize("NFC", segment)
            pieces = isolated(self.pattern, segment) if self.split_regex else [segment]
            if self.prefix_space:
                pieces = [p if p.startswith(" ") else " " + p for p in pieces]
            if not self.split_regex:
                pieces = [q for p in pieces for q in isolated(GPT2_PATTERN, p)]
            for piece in pieces:
                ids.extend(self.vocab[t] for t in self.bpe(byte_chars(piece)))
        return ids

    def decode(self, ids):
        by_id = {i: t for t, i in self.vocab.items()}
        added = {i: c for c, i, _ in self.added}
        out = b""
        for i in ids:
            if i in added:
                out += added[i].encode("utf-8")
            else:
                out += bytes(CHAR_BYTE[c] for c in by_id[i])
        return out


def bpe_tokenizers():
    llama_added = [("<|begin_of_text|>", True), ("<|eot_id|>", True), ("<think>", True), ("<think></think>", True),
                   (" tinyloop", False)]
    return {
        "gpt2": ReferenceBpe(GPT2_PATTERN, 300, split_regex=False, added=[("<|endoftext|>", True)],
                             endoftext_in_vocab=True),
        "gpt2_prefix": ReferenceBpe(GPT2_PATTERN, 300, split_regex=False, prefix_space=True,
                                    added=[("<|endoftext|>", True)], endoftext_in_vocab=True),
        "llama3": ReferenceBpe(LLAMA3_PATTERN, 320, split_regex=True, ignore_merges=True, pair_merges=True,
                               added=llama_added, extra_words=[" supercalifragilisticexpialidocious", "aaaaaaa"]),
        "qwen2": ReferenceBpe(QWEN2_PATTERN, 280, split_regex=True, nfc=True,
                              added=[("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True)]),
    }


def train_sentencepiece():
    import sentencepiece as spm

    model = io.BytesIO()
    lines = [line for line in CORPUS.split("\n") if line.strip()] * 4
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=400, model_type="bpe", byte_fallback=True,
        character_coverage=1.0, split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", add_dummy_prefix=True, num_threads=1, minloglevel=2,
        unk_surface=" \u2047 ")
    return model.getvalue()


def write_safetensors(path, tensors):
    """tensors: name -> (shape, F32 values)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        shape, values = tensors[name]
        blob = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def write_checkpoint(folder, vocab=600, files=()):
    """A dense looped model: D 16, 2 heads of 8, FFN 32, 0 pre blocks + 1 looped twice, tied head."""
    os.makedirs(folder, exist_ok=True)
    d, f, rng = 16, 32, random.Random(f"{SEED}-{os.path.basename(folder)}")
    config = {"hidden_size": d, "num_attention_heads": 2, "intermediate_size": f, "vocab_size": vocab,
              "num_pre_layers": 0, "num_loops": 2, "num_hidden_layers": 1, "max_position_embeddings": 256,
              "tie_word_embeddings": True, "hidden_act": "silu"}
    with open(os.path.join(folder, "config.json"), "w") as out:
        json.dump(config, out)

    def normal(rows, cols, std):
        return [rows, cols] if cols else [rows], [rng.gauss(0, std) for _ in range(rows * (cols or 1))]

    tensors = {"model.embed_tokens.weight": normal(vocab, d, 1.0), "model.norm.weight": ([d], [1.0] * d)}
    layer = "model.layers.0."
    tensors[layer + "input_layernorm.weight"] = ([d], [1.0] * d)
    tensors[layer + "post_attention_layernorm.weight"] = ([d], [1.0] * d)
    for name, rows, cols in [("self_attn.q_proj", d, d), ("self_attn.k_proj", d, d), ("self_attn.v_proj", d, d),
                             ("self_attn.o_proj", d, d), ("mlp.gate_proj", f, d), ("mlp.up_proj", f, d),
                             ("mlp.down_proj", d, f)]:
        tensors[layer + name + ".weight"] = normal(rows, cols, cols ** -0.5)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    for name, data in files:
        with open(os.path.join(folder, name), "wb") as out:
            out.write(data)


def bad_tokenizers(good):
    """name -> a tokenizer.json (as an object or as raw text) that must be refused."""
    def edit(change):
        j = json.loads(json.dumps(good))
        change(j)
        return j

    def drop_byte(j):
        del j["model"]["vocab"][BYTE_CHAR[ord("A")]]
    return {
        "wordpiece": edit(lambda j: j["model"].update(type="WordPiece")),
        "unigram": edit(lambda j: j["model"].update(type="Unigram")),
        "metaspace": edit(lambda j: j.update(pre_tokenizer={"type": "Metaspace", "replacement": "\u2581"})),
        "nfkc": edit(lambda j: j.update(normalizer={"type": "NFKC"})),
        "lowercase_sequence": edit(lambda j: j.update(normalizer={"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Lowercase"}]})),
        "byte_fallback": edit(lambda j: j["model"].update(byte_fallback=True)),
        "dropout": edit(lambda j: j["model"].update(dropout=0.1)),
        "split_removed": edit(lambda j: j.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]})),
        "no_byte_level": edit(lambda j: j.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": "\\s+"},
                                                                 "behavior": "Isolated", "invert": False})),
        "bad_regex": edit(lambda j: j.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]})),
        "rstrip": edit(lambda j: j["added_tokens"][0].update(rstrip=True)),
        "wordpiece_decoder": edit(lambda j: j.update(decoder={"type": "WordPiece", "prefix": "##"})),
        "merge_not_in_vocab": edit(lambda j: j["model"]["merges"].append("Q Z")),
        "merge_three_parts": edit(lambda j: j["model"]["merges"].append("a b c")),
        "merge_number": edit(lambda j: j["model"]["merges"].append(7)),
        "missing_byte": edit(drop_byte),
        "duplicate_id": edit(lambda j: j["model"]["vocab"].update({"duplicate": 5})),
        "negative_id": edit(lambda j: j["model"]["vocab"].update({"negative": -1})),
        "huge_id": edit(lambda j: j["model"]["vocab"].update({"huge": 1 << 22})),
        "no_merges": edit(lambda j: j["model"].pop("merges")),
        "added_empty": edit(lambda j: j["added_tokens"][0].update(content="")),
        "not_an_object": [1, 2, 3],
        "truncated": json.dumps(good)[:1000],
        "deep": "[" * 100 + "]" * 100,
    }


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "bad"), exist_ok=True)
    cases, rows = {}, []
    files = {}
    for name, tok in bpe_tokenizers().items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        data = json.dumps(tok.tokenizer_json(), ensure_ascii=False, indent=1).encode("utf-8")
        files[name] = ("tokenizer.json", data)
        with open(os.path.join(out, name, "tokenizer.json"), "wb") as f:
            f.write(data)
        entries = []
        for case_name, text in CASES:
            ids = tok.encode(text)
            decoded = tok.decode(ids)
            if not tok.prefix_space:  # else each piece gained a space
                assert decoded == (unicodedata.normalize("NFC", text) if tok.nfc else text).encode(), (name, case_name)
            entries.append({"name": case_name, "text": text, "ids": ids, "decoded": decoded.decode("utf-8")})
        cases[name] = {"file": f"{name}/tokenizer.json", "n_ids": tok.n_ids, "cases": entries}

    import sentencepiece as spm

    sp_data = train_sentencepiece()
    os.makedirs(os.path.join(out, "sentencepiece"), exist_ok=True)
    with open(os.path.join(out, "sentencepiece", "tokenizer.model"), "wb") as f:
        f.write(sp_data)
    files["sentencepiece"] = ("tokenizer.model", sp_data)
    sp = spm.SentencePieceProcessor(model_proto=sp_data)
    entries = []
    for case_name, text in CASES:
        ids = sp.encode(text)
        entries.append({"name": case_name, "text": text, "ids": ids, "decoded": sp.decode(ids)})
    cases["sentencepiece"] = {"file": "sentencepiece/tokenizer.model", "n_ids": sp.get_piece_size(),
                              "cases": entries}

    for name, entry in cases.items():
        for case in entry["cases"]:
            rows.append("\t".join([name, case["name"], case["text"].encode().hex(),
                                   " ".join(map(str, case["ids"])), case["decoded"].encode().hex()]))
    # For the CLI tests (check_text_cli.cmake): the corpus, its reference ids by each tokenizer, a text that is not
    # UTF-8.
    os.makedirs(os.path.join(out, "cli"), exist_ok=True)
    with open(os.path.join(out, "cli", "corpus.txt"), "wb") as f:
        f.write(CORPUS.encode())
    for name, entry in cases.items():
        (corpus,) = [c for c in entry["cases"] if c["name"] == "corpus"]
        with open(os.path.join(out, "cli", name + ".ids"), "w") as f:
            f.write(" ".join(map(str, corpus["ids"])) + "\n")
    # A text long enough that the library encodes it with SentencePiece in pieces (over 256 KiB), and the ids of the
    # whole text.
    long_text = "".join(c["text"] for c in cases["gpt2"]["cases"] if c["name"] not in ("nul", "controls")) * 400
    with open(os.path.join(out, "cli", "long.txt"), "wb") as f:
        f.write(long_text.encode())
    with open(os.path.join(out, "cli", "sentencepiece_long.ids"), "w") as f:
        f.write(" ".join(map(str, sp.encode(long_text))) + "\n")
    with open(os.path.join(out, "cli", "not_utf8.txt"), "wb") as f:
        f.write(b"caf\xe9 au lait")  # Latin-1
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out, "cases.tsv"), "w", encoding="utf-8") as f:
        f.write("\n".join(rows) + "\n")

    for name, (file_name, data) in files.items():
        write_checkpoint(os.path.join(out, f"ckpt_{name}"), files=[(file_name, data)])
    write_checkpoint(os.path.join(out, "ckpt_none"))
    write_checkpoint(os.path.join(out, "ckpt_both"), files=[files["gpt2"], files["sentencepiece"]])
    gpt2 = json.loads(files["gpt2"][1])
    wordpiece = dict(gpt2, model=dict(gpt2["model"], type="WordPiece"))
    write_checkpoint(os.path.join(out, "ckpt_wordpiece"), files=[("tokenizer.json", json.dumps(wordpiece).encode())])
    write_checkpoint(os.path.join(out, "ckpt_small_vocab"), vocab=300, files=[files["gpt2"]])

    for name, bad in bad_tokenizers(gpt2).items():
        with open(os.path.join(out, "bad", name + ".json"), "w", encoding="utf-8") as f:
            f.write(bad if isinstance(bad, str) else json.dumps(bad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
