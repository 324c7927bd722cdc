#!/usr/bin/env python3
"""Writes the tokenizer.json fixtures of the SentencePiece-style (Llama 2 / Mistral / Mixtral) and
DeepSeek-V3 tokenizer families for tests/unit/test_hf_tokenizer_families.cpp (committed; CI has no
Python and no `tokenizers`). The byte-level Llama 3 / Qwen2 / GPT-2 fixtures are
make_hf_tokenizers.py's; this script reuses its corpus and texts.

Run (the `tokenizers` library in a side folder; the fixtures were written with tokenizers 0.23.3):
  python3 -m pip install --target /tmp/tok tokenizers
  PYTHONPATH=/tmp/tok python3 tests/reference/make_hf_tokenizer_families.py

Each tokenizer is trained here with the library on tests/data/sample.txt and the multilingual lines
of make_hf_tokenizers.py, then given the exact components of the real files:

  hf_tokenizer_llama2.json    Llama 2 / Mistral 7B v0.1 / Mixtral as transformers' converter writes
                              them (legacy): normalizer Sequence[Prepend("▁"), Replace(" ", "▁")],
                              no pre-tokenizer, BPE with byte_fallback, fuse_unk, unk_token <unk>,
                              <unk> <s> </s> then the 256 <0xNN> byte tokens at ids 0..258, merges
                              as "a b" strings, post_processor TemplateProcessing "<s> $A", decoder
                              Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)]. The
                              alphabet is limited, so emoji and rare characters take the byte fallback.
  hf_tokenizer_mistral.json   the newer (non-legacy) layout: no normalizer, pre_tokenizer
                              Metaspace(replacement "▁", prepend_scheme "first", split false), merges
                              as [a, b] pairs, special tokens [INST] [/INST] besides <unk> <s> </s>.
  hf_tokenizer_spm_unk.json   the other settings: Metaspace(prepend_scheme "always", split true),
                              no byte fallback (unknown characters become <unk>, fused), ignore_merges
                              with a vocabulary word no merge reaches, decoder Metaspace.
  hf_tokenizer_deepseek_v3.json  DeepSeek-V3's layout: normalizer Sequence[], pre_tokenizer Sequence[Split(\\p{N}{1,3}),
                              Split(CJK runs), Split(ASCII-punctuation words | letters with marks |
                              punctuation | white space), ByteLevel(use_regex false)], each Split
                              Isolated, the patterns exactly DeepSeek-V3's; byte-level BPE, its
                              special tokens at ids 0..2, the chat tokens <｜User｜>, <｜Assistant｜>
                              (normalized, not special) and <|EOT|>, and its BOS template.
  hf_tokenizer_families_ids.json  {kind: {case: {"text", "ids", "ids_template", "decoded"}}}: ids of
                              encode(text, add_special_tokens=False) and of add_special_tokens=True,
                              and decode(ids, skip_special_tokens=False); the same for VARIANTS (a
                              fixture with one value changed: "tokenizer", "pointer", "value"); and
                              "llama2_decode": {case: {"ids", "decoded"}} for ids no encoding gives.

`--unicode-table` instead prints the \\p{P}, \\p{S} and \\p{M} range tables of
src/data/unicode_classes.cpp (as Python's `regex` module classifies code points; needs `regex`).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
sys.path.insert(0, HERE)
import make_hf_tokenizers as base  # noqa: E402  (CASES, MULTILINGUAL, corpus)

SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
DEEPSEEK_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
# DeepSeek-V3's tokenizer.json pre_tokenizer, its three Split patterns in order (U+3040 is written
# as the character, as the JSON string holds it).
DEEPSEEK_PATTERNS = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

EXTRA_CASES = [
    ("only_spaces", "     "),
    ("leading_spaces", "   three leading spaces and  two"),
    ("space_newline_space", " \n a \n\n b\n"),
    ("specials_spm", "<s>Hello</s> world<unk> [INST] What is 2+2? [/INST] 4</s>"),
    ("special_first_then_space", "<s> x"),
    ("byte_token_text", "<0x41> and <0x0A> are text, not bytes"),
    ("metaspace_char", "a▁b ▁ c▁▁d ▁"),
    ("rare_chars", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ☃ ☕ \x00\x07 ctrl ǅ ꙮ 𓀀"),
    ("unmergeable", "an unmergeable word, unmergeable"),
    ("digit_groups", "12345678 x1y22z333 a1234b ½²³ ٣٤٥٦ 0.5 10,000,000"),
    ("cjk_kana", "日本語のテキスト、カタカナ゠ー・ひらがなゟ゛ 中文123漢字abc漢 ㈱ 〇"),
    ("punct_words", "'hello \"World\" (x) foo.bar/baz -- ... don't #include <vector> $HOME @user\n\n!?\r\n"),
    ("marks", "\u0301abc e\u0301 \u200dx \u0915\u094d\u0937 1\u0301 .\u0301"),
    ("specials_deepseek", "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜> <｜▁pad▁｜>x"),
    ("chat_deepseek", "<｜User｜>What is 1234*5?<｜Assistant｜>6170<｜end▁of▁sentence｜><|EOT|> <｜User｜"),
]


# (name, fixture, JSON pointer, value): the ids of a fixture with that one value changed.
VARIANTS = [
    ("spm_unk_unfused", "spm_unk", "/model/fuse_unk", False),
    ("llama2_no_byte_fallback", "llama2", "/model/byte_fallback", False),
    ("mistral_never", "mistral", "/pre_tokenizer/prepend_scheme", "never"),
    ("mistral_split", "mistral", "/pre_tokenizer/split", True),
    ("llama2_no_decoder", "llama2", "/decoder", None),
    ("llama2_prepend_only", "llama2", "/normalizer", {"type": "Prepend", "prepend": "▁"}),
    ("mistral_legacy_metaspace", "mistral", "/pre_tokenizer",
     {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}),
    ("mistral_metaspace_decoder", "mistral", "/decoder",
     {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}),
]
VARIANT_CASES = ["space", "only_spaces", "leading_spaces", "whitespace_runs", "emoji", "rare_chars", "chinese",
                 "specials_spm", "special_first_then_space", "metaspace_char"]


def spm_train(unk_only):
    """A SentencePiece-style BPE vocabulary: trained on words split at "▁" (as SentencePiece
    trains), with a limited alphabet."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=500 if unk_only else 600, min_frequency=2,
                                  special_tokens=SPM_SPECIALS, limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(base.corpus(), trainer)
    return json.loads(tok.to_str())


def spm_json(kind):
    j = spm_train(kind == "spm_unk")
    model = j["model"]
    trained = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    vocab = {t: i for i, t in enumerate(SPM_SPECIALS)}
    if kind != "spm_unk":
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in trained:
        if t not in vocab:
            vocab[t] = len(vocab)
    if kind == "spm_unk":
        vocab["▁unmergeable"] = len(vocab)  # no merge reaches it: only ignore_merges gives it
    merges = model["merges"]
    if kind == "llama2":
        merges = [" ".join(m) for m in merges]  # the legacy "a b" form
    model.update({"vocab": vocab, "merges": merges, "unk_token": "<unk>", "fuse_unk": True,
                  "byte_fallback": kind != "spm_unk", "ignore_merges": kind == "spm_unk"})
    specials = SPM_SPECIALS + (["[INST]", "[/INST]"] if kind == "mistral" else [])
    added = []
    for s in specials:
        if s not in vocab:
            vocab[s] = len(vocab)
        added.append({"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    j["added_tokens"] = added
    metaspace_decoder = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    sequence_decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    if kind == "llama2":
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        j["pre_tokenizer"] = None
        j["decoder"] = sequence_decoder
    elif kind == "mistral":
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        j["decoder"] = sequence_decoder
    else:
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
        j["decoder"] = metaspace_decoder
    bos = "<s>"
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}}}
    return j


def deepseek_json():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])  # as DeepSeek-V3's file has it
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DEEPSEEK_PATTERNS] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, special_tokens=DEEPSEEK_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(base.corpus(), trainer)
    # Its chat tokens: "<｜User｜>" / "<｜Assistant｜>" are normalized and not special, "<|EOT|>" special.
    tok.add_tokens([AddedToken(t, normalized=True, special=False) for t in ("<｜User｜>", "<｜Assistant｜>")])
    tok.add_special_tokens([AddedToken("<|EOT|>", normalized=False, special=True)])
    bos = DEEPSEEK_SPECIALS[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    return json.loads(tok.to_str())


def write_fixtures():
    from tokenizers import Tokenizer

    cases = list(base.CASES) + EXTRA_CASES
    out = {}
    for kind in ("llama2", "mistral", "spm_unk", "deepseek_v3"):
        j = deepseek_json() if kind == "deepseek_v3" else spm_json(kind)
        text = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
        tok = Tokenizer.from_str(text)  # the library reads back what is committed
        path = os.path.join(OUT, f"hf_tokenizer_{kind}.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path)} ({os.path.getsize(path)} bytes, vocab {tok.get_vocab_size()})")
        out[kind] = {}
        for name, t in cases:
            ids = tok.encode(t, add_special_tokens=False).ids
            out[kind][name] = {"text": t, "ids": ids,
                               "ids_template": tok.encode(t, add_special_tokens=True).ids,
                               "decoded": tok.decode(ids, skip_special_tokens=False)}
    # Variants: a fixture with one value changed (the test makes the same edit), on the texts where
    # the setting matters.
    texts = dict(cases)
    for name, kind, pointer, value in VARIANTS:
        j = json.loads(open(os.path.join(OUT, f"hf_tokenizer_{kind}.json"), encoding="utf-8").read())
        parent = j
        keys = pointer.strip("/").split("/")
        for k in keys[:-1]:
            parent = parent[k]
        parent[keys[-1]] = value
        tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
        out[name] = {"tokenizer": kind, "pointer": pointer, "value": value}
        for case in VARIANT_CASES:
            ids = tok.encode(texts[case], add_special_tokens=False).ids
            out[name][case] = {"text": texts[case], "ids": ids,
                               "ids_template": tok.encode(texts[case], add_special_tokens=True).ids,
                               "decoded": tok.decode(ids, skip_special_tokens=False)}
    # Decoding ids no encoding gives: byte tokens that are not UTF-8 (one U+FFFD each), bytes amid text.
    tok = Tokenizer.from_file(os.path.join(OUT, "hf_tokenizer_llama2.json"))
    v = tok.get_vocab()
    b = lambda x: v[f"<0x{x:02X}>"]  # noqa: E731
    out["llama2_decode"] = {}
    for name, ids in (("invalid_utf8", [b(0xE2), b(0x82), v["▁a"], b(0xFF)]),
                      ("euro", [v["▁a"], b(0xE2), b(0x82), b(0xAC), v["b"]]),
                      ("specials", [1, v["▁"], v["▁a"], 2, 0]),
                      ("leading_spaces", [v["▁"], v["▁"], v["▁a"]])):
        out["llama2_decode"][name] = {"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)}
    path = os.path.join(OUT, "hf_tokenizer_families_ids.json")
    with open(path, "w", encoding="utf-8") as f:  # one case a line: small, and diffs stay readable
        f.write("{\n" + ",\n".join(
            json.dumps(kind, ensure_ascii=False) + ": {\n" + ",\n".join(
                json.dumps(name, ensure_ascii=False) + ": " + json.dumps(case, ensure_ascii=False,
                                                                         separators=(",", ":"))
                for name, case in kinds.items()) + "}"
            for kind, kinds in out.items()) + "}\n")
    print(f"wrote {os.path.relpath(path)} ({os.path.getsize(path)} bytes)")


def unicode_table():
    import regex

    def ranges(pattern):
        rs = []
        for cp in range(0x110000):
            if 0xD800 <= cp <= 0xDFFF:
                continue
            if pattern.match(chr(cp)):
                if rs and rs[-1][1] == cp - 1:
                    rs[-1][1] = cp
                else:
                    rs.append([cp, cp])
        return rs

    print(f"// Generated by tests/reference/make_hf_tokenizer_families.py --unicode-table (regex {regex.__version__}).")
    print("// clang-format off")
    for name, cls in (("kPunctuationRanges", r"\p{P}"), ("kSymbolRanges", r"\p{S}"), ("kMarkRanges", r"\p{M}")):
        print(f"constexpr CodeRange {name}[] = {{")
        line = " "
        for lo, hi in ranges(regex.compile(cls)):
            item = f" {{0x{lo:X}, 0x{hi:X}}},"
            if len(line) + len(item) > 110:
                print(line)
                line = " "
            line += item
        print(line)
        print("};")
    print("// clang-format on")


if __name__ == "__main__":
    if "--unicode-table" in sys.argv[1:]:
        unicode_table()
    else:
        write_fixtures()
