#!/usr/bin/env python3
"""Writes tests/reference/fixtures/gpt2_tokens.json: GPT-2 BPE ids of varied texts (committed; CI has no
Python and no tiktoken).

Two independent references must agree on every text, or nothing is written:
  1. tiktoken (OpenAI's GPT-2 encoding), built from the local encoder.json / vocab.bpe after checking
     their SHA-256 against the hashes tiktoken pins for the published GPT-2 files;
  2. a plain-Python transcription of GPT-2's encoder.py (byte-to-unicode table, the pre-tokenisation
     regex, BPE by merge rank), using the `regex` module for \\p{L} / \\p{N}.
Both encode text only ("ordinary" encoding): "<|endoftext|>" inside a text is plain characters.

Usage (tiktoken and regex are not Debian packages; a throwaway venv is enough):
  python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tiktoken
  /tmp/tokvenv/bin/python tests/reference/make_tokenizer_fixture.py [--gpt2-dir ../shared/data/gpt2]

`--unicode-table` instead prints the C++ range tables of src/data/gpt2_tokenizer.cpp (\\p{L}, \\p{N}
and \\s as the `regex` module classifies code points).
"""
import argparse
import hashlib
import json
import os
import sys

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The hashes tiktoken_ext/openai_public.py pins for the published GPT-2 files.
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

CASES = [
    ("empty", ""),
    ("space", " "),
    ("newline", "\n"),
    ("english", "Hello, world! The quick brown fox jumps over the lazy dog."),
    ("contractions", "I'm sure they'll say it's done; we've, you're, he'd, can't, won't. DON'T SHOUT'S"),
    ("apostrophes", "''s 'S rock'n'roll ' s O'Brien's cats' toys 'll'd"),
    ("code", "def foo(x):\n    return x**2 + 3.14  # comment\n\tif (a && b) { c++; }\n"),
    ("cpp", "for (int i = 0; i < n; ++i) {\n  out[i] = std::max(in[i], 0.0f);\n}\n"),
    ("numbers", "1234567890 3.14159 -42 1,000,000 0x1F 1e-5 ٣٤٥ ²³ ½ Ⅻ 二〇二四"),
    ("whitespace", "a  b   c\n\n\nd \t\n e   "),
    ("leading_ws", "   leading spaces\n\n  and\r\nwindows\r\n\r\nlines"),
    ("unicode_ws", "no\u00a0break\u3000ideographic\u2003em\u2028line"),
    ("letters", "café naïve Straße Ωmega ΣΦΔ 中文分词 日本語 한국어 Привет мир ἀρχή"),
    ("combining", "e\u0301 cafe\u0301 n\u0303o"),
    ("emoji", "👍🏽 😀 👨‍👩‍👧 🇫🇷 ✨🚀"),
    ("special_text", "<|endoftext|> is text here"),
    ("punctuation", "!!! ??? ... --- *** ((())) \"quoted\" «guillemets» „German“ — – …"),
    ("mixed", "GPT-2's BPE: 50,257 tokens (50,000 merges + 256 bytes + 1 <|endoftext|>).\n"),
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class PlainGPT2:
    """GPT-2's encoder.py algorithm, written out."""

    def __init__(self, encoder_json, vocab_bpe):
        with open(encoder_json, encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(vocab_bpe, encoding="utf-8") as f:
            lines = f.read().split("\n")
        merges = [tuple(line.split()) for line in lines[1:] if line.strip()]
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.pattern = regex.compile(PATTERN)
        self.cache = {}

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = list(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            first, second = best
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        self.cache[token] = word
        return word

    def encode(self, text):
        ids = []
        for piece in self.pattern.findall(text):
            mapped = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(mapped))
        return ids


def check_sha256(path, expected):
    with open(path, "rb") as f:
        actual = hashlib.sha256(f.read()).hexdigest()
    if actual != expected:
        sys.exit(f"{path}: sha256 {actual}, expected {expected} (not the published GPT-2 file)")


def tiktoken_encoding(encoder_json, vocab_bpe):
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=vocab_bpe, encoder_json_file=encoder_json)
    return tiktoken.Encoding(name="gpt2_local", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def ranges(predicate):
    out, start = [], None
    for cp in range(0x110000 + 1):
        inside = cp <= 0x10FFFF and not (0xD800 <= cp <= 0xDFFF) and predicate(chr(cp))
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            out.append((start, cp - 1))
            start = None
    return out


def print_unicode_table():
    classes = [("kLetterRanges", regex.compile(r"\p{L}")), ("kNumberRanges", regex.compile(r"\p{N}")),
               ("kSpaceRanges", regex.compile(r"\s"))]
    print(f"// Generated by tests/reference/make_tokenizer_fixture.py --unicode-table (regex {regex.__version__}).")
    for name, pattern in classes:
        rs = ranges(lambda ch: pattern.match(ch) is not None)
        print(f"constexpr CodeRange {name}[] = {{")
        line = " "
        for lo, hi in rs:
            item = f" {{0x{lo:X}, 0x{hi:X}}},"
            if len(line) + len(item) > 110:
                print(line)
                line = " "
            line += item
        print(line)
        print("};")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpt2-dir", default=os.path.join(ROOT, "..", "shared", "data", "gpt2"))
    parser.add_argument("--sample", default=os.path.join(ROOT, "tests", "data", "sample.txt"))
    parser.add_argument("--out", default=os.path.join(HERE, "fixtures", "gpt2_tokens.json"))
    parser.add_argument("--unicode-table", action="store_true")
    args = parser.parse_args()
    if args.unicode_table:
        print_unicode_table()
        return

    encoder_json = os.path.join(args.gpt2_dir, "encoder.json")
    vocab_bpe = os.path.join(args.gpt2_dir, "vocab.bpe")
    check_sha256(encoder_json, ENCODER_JSON_SHA256)
    check_sha256(vocab_bpe, VOCAB_BPE_SHA256)
    plain = PlainGPT2(encoder_json, vocab_bpe)
    tik = tiktoken_encoding(encoder_json, vocab_bpe)

    cases = list(CASES)
    with open(args.sample, encoding="utf-8") as f:
        cases.append(("sample_txt", f.read()))

    out = []
    for name, text in cases:
        a = tik.encode_ordinary(text)
        b = plain.encode(text)
        if a != b:
            sys.exit(f"{name}: tiktoken and the plain encoder.py disagree:\n{a}\n{b}")
        if tik.decode(a) != text:
            sys.exit(f"{name}: does not round-trip")
        out.append({"name": name, "text": text, "ids": a})

    fixture = {
        "generator": "tests/reference/make_tokenizer_fixture.py",
        "reference": f"tiktoken {getattr(__import__('tiktoken'), '__version__', '?')} == plain encoder.py "
                     f"(regex {regex.__version__})",
        "eod": 50256,
        "cases": out,
    }
    # One case per line keeps the committed file small and its diffs readable.
    with open(args.out, "w", encoding="utf-8") as f:
        head = {k: v for k, v in fixture.items() if k != "cases"}
        f.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in out))
        f.write("\n]}\n")
    print(f"wrote {args.out}: {len(out)} cases, {sum(len(c['ids']) for c in out)} ids")


if __name__ == "__main__":
    main()
