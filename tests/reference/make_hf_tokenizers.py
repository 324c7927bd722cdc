#!/usr/bin/env python3
"""Writes the Hugging Face tokenizer fixtures of tests/unit/test_hf_tokenizer.cpp (committed; CI has no
Python and no `tokenizers`).

Three small byte-level BPE tokenizers in the shape of real ones, trained here with the `tokenizers`
library on tests/data/sample.txt and the multilingual lines below (the library is not a Debian
package; a throwaway venv is enough):
  python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
  /tmp/tokvenv/bin/python tests/reference/make_hf_tokenizers.py

  hf_tokenizer_llama3.json  Llama 3's layout: pre_tokenizer Sequence[Split(Llama 3's regex, isolated),
                            ByteLevel(use_regex false)], model BPE with ignore_merges, no normalizer,
                            special tokens <|begin_of_text|>, <|end_of_text|>, <|eot_id|>, a
                            non-special added token "<tool>", a vocabulary word no merge
                            reaches (" unmergeable", for ignore_merges), and Llama 3's post_processor
                            (Sequence[ByteLevel, TemplateProcessing "<|begin_of_text|> $A"])
  hf_tokenizer_qwen2.json   Qwen2's layout: normalizer NFC, Qwen2's regex (single digits), BPE
                            without ignore_merges, special tokens <|endoftext|>, <|im_start|>, <|im_end|>
  hf_tokenizer_gpt2.json    GPT-2's layout: pre_tokenizer ByteLevel(use_regex true, no prefix space)
  hf_tokenizer_ids.json     {tokenizer: {case name: {"text": ..., "ids": [...]}}}: ids of
                            Tokenizer.encode(text, add_special_tokens=False), for varied texts (code,
                            non-Latin scripts, emoji, long white space runs, special tokens inside
                            the text, combining marks that NFC composes)

`--nfc-table` instead prints the generated tables of src/data/unicode_nfc.cpp (combining classes,
full canonical decompositions, primary composites) from Python's unicodedata; it needs no
`tokenizers`.
"""
import json
import os
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "fixtures")

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")

MULTILINGUAL = [
    "Le cœur a ses raisons que la raison ne connaît point. Ça va très bien, merci !",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein. Straße, Größe, Mädchen.",
    "Москва — столица России. Привет, как дела? Всё хорошо.",
    "東京は日本の首都です。今日はいい天気ですね。機械学習とニューラルネットワーク。",
    "北京是中国的首都。我们正在训练一个大型语言模型。你好，世界！",
    "서울은 한국의 수도입니다. 안녕하세요, 만나서 반갑습니다.",
    "العربية لغة جميلة. مرحبا بالعالم! كيف حالك اليوم؟",
    "हिन्दी भारत की राजभाषा है। नमस्ते दुनिया!",
    "Ελληνικά: Γειά σου Κόσμε! Η γλώσσα είναι όμορφη.",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨ 🚀 done",
    "def f(x):\n    return x ** 2  # square\n\nfor i in range(10):\n\tprint(i, f(i))\n",
    "int main() { std::vector<int> v{1, 2, 3}; return v.size() > 2 ? 0 : 1; }",
    "It's, I'm, you're, we've, they'll, he'd, DON'T, I'M, You'Re, WE'VE",
    "3.14159 2,718,281 12345678901234567890 1e-5 0x7FFF 2024-11-24",
]

CASES = [
    ("empty", ""),
    ("space", " "),
    ("newlines", "\n\n\n"),
    ("english", "Hello, world! The quick brown fox jumps over the lazy dog."),
    ("contractions", "I'm sure they'll say it's done; we've, you're, he'd. DON'T SHOUT, I'M HERE, You'Re"),
    ("apostrophes", "''s 'S rock'n'roll ' s O'Brien's cats' toys 'll'd 'ſ"),
    ("numbers", "1 12 123 1234 12345 123456 3.14159 2,718,281 0x7FFF 1e-5 ٣٤٥ ⅫⅯ"),
    ("code_python", "def f(x):\n    return x ** 2  # square\n\nfor i in range(10):\n\tprint(i, f(i))\n"),
    ("code_cpp", "int main() {\r\n  std::vector<int> v{1, 2, 3};\r\n  return v.size() > 2 ? 0 : 1;\r\n}\r\n"),
    ("whitespace_runs", "a  b   c    d\t\te \n \n  \n   x        \t\t\t   \n\n\n    y   "),
    ("trailing_space", "ends with spaces   "),
    ("leading_newlines", "\n\n  indented\n\t\ttabs\n"),
    ("french", "Le cœur a ses raisons que la raison ne connaît point. Ça va ?"),
    ("russian", "Москва — столица России. Привет, как дела?"),
    ("japanese", "東京は日本の首都です。今日はいい天気ですね。"),
    ("chinese", "我们正在训练一个大型语言模型。你好，世界！"),
    ("korean", "안녕하세요, 만나서 반갑습니다."),
    ("arabic", "مرحبا بالعالم! كيف حالك اليوم؟"),
    ("hindi", "नमस्ते दुनिया! हिन्दी भारत की राजभाषा है।"),
    ("emoji", "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨ 🚀!"),
    ("combining", "e\u0301te\u0301 cafe\u0301 n\u0303 A\u030a \u1100\u1161\u11a8 Å ﬁ"),
    ("punctuation", "!!! ??? ... --- ((( ))) [[[ ]]] {{{ }}} <<< >>> @@@ ### $$$ %%% ^^^ &&& ***"),
    ("specials_llama3", "<|begin_of_text|>Hello<|end_of_text|> <|eot_id|>\n<tool> x<tool>y <|begin_of_text"),
    ("specials_qwen2", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<|endoftext|>"),
    ("ignore_merges", "an unmergeable word: unmergeable, Unmergeable and unmergeables"),
    ("mixed", "Mix: English, Русский, 中文, العربية, emoji 🎉, code `x+=1;` and 42 numbers.\n"),
]


def corpus():
    """Fixed text only (the committed sample and the lines above), so that the fixtures reproduce."""
    with open(os.path.join(ROOT, "tests", "data", "sample.txt"), encoding="utf-8") as f:
        sample = f.read()
    return [sample] * 5 + MULTILINGUAL * 20


def llama3_post_processor(bos_id):
    """Meta's Llama 3 tokenizer.json post_processor: <|begin_of_text|> before each sequence (offsets
    untouched by ByteLevel). What the library writes for processors.Sequence([processors.ByteLevel(
    trim_offsets=False), processors.TemplateProcessing(single="<|begin_of_text|> $A",
    pair="<|begin_of_text|> $A <|begin_of_text|> $B:1", special_tokens=[("<|begin_of_text|>", bos_id)])])."""
    bos = "<|begin_of_text|>"
    return {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}},
        ],
    }


def add_llama3_post_processor(path):
    """The llama3 fixture's post_processor (tests/unit/test_hf_tokenizer.cpp expects <|begin_of_text|>
    before each document from preprocess_data, ids built by hand from this template: the `tokenizers`
    library was not at hand when it was added). Run alone: make_hf_tokenizers.py --post-processor."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    bos_id = next(t["id"] for t in j["added_tokens"] if t["content"] == "<|begin_of_text|>")
    j["post_processor"] = llama3_post_processor(bos_id)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))


def build(kind):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    elif kind == "qwen2":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        specials = ["<|endoftext|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    if kind == "llama3":
        tok.add_tokens(["<tool>"])
    return tok


def nfc_table():
    out = []
    w = out.append
    ver = unicodedata.unidata_version
    # ccc ranges
    ranges = []
    for cp in range(0x110000):
        c = unicodedata.combining(chr(cp))
        if c:
            if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == c:
                ranges[-1][1] = cp
            else:
                ranges.append([cp, cp, c])
    decomp = []
    flat = []
    comp = []
    for cp in range(0x110000):
        if 0xAC00 <= cp <= 0xD7A3 or 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        d = unicodedata.normalize("NFD", ch)
        if d != ch:
            decomp.append((cp, len(flat), len(d)))
            flat.extend(ord(x) for x in d)
        m = unicodedata.decomposition(ch)
        if m and not m.startswith("<"):
            parts = [int(x, 16) for x in m.split()]
            if len(parts) == 2 and unicodedata.normalize("NFC", ch) == ch:
                comp.append((parts[0], parts[1], cp))
    comp.sort()
    def rows(items, per):
        for i in range(0, len(items), per):
            w("    " + " ".join(items[i:i + per]))
    w(f"// Generated by tests/reference/make_hf_tokenizers.py --nfc-table from Python's unicodedata (Unicode {ver}).")
    w("// clang-format off")
    w("constexpr CombiningRange kCombining[] = {")
    rows([f"{{0x{a:X}, 0x{b:X}, {c}}}," for a, b, c in ranges], 6)
    w("};")
    w("constexpr char32_t kDecompositionData[] = {")
    rows([f"0x{x:X}," for x in flat], 10)
    w("};")
    w("constexpr Decomposition kDecompositions[] = {")
    rows([f"{{0x{a:X}, {o}, {n}}}," for a, o, n in decomp], 6)
    w("};")
    w("constexpr Composition kCompositions[] = {")
    rows([f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}," for a, b, c in comp], 5)
    w("};")
    w("// clang-format on")
    print("\n".join(out))
    print(len(ranges), len(decomp), len(flat), len(comp), file=sys.stderr)


def main():
    if "--nfc-table" in sys.argv[1:]:
        nfc_table()
        return
    if "--post-processor" in sys.argv[1:]:
        add_llama3_post_processor(os.path.join(OUT, "hf_tokenizer_llama3.json"))
        return
    ids = {}
    for kind in ("llama3", "qwen2", "gpt2"):
        tok = build(kind)
        path = os.path.join(OUT, f"hf_tokenizer_{kind}.json")
        tok.save(path, pretty=False)
        if kind == "llama3":
            # A vocabulary word no merge sequence reaches (real Llama 3 has such): with ignore_merges
            # a piece that is a whole token is taken as it is, without, it would come out in bytes.
            with open(path, encoding="utf-8") as f:
                j = json.load(f)
            # Its id follows the model's vocabulary; the added token "<tool>" moves up one, as the
            # library itself numbers added tokens after the model's.
            model_size = len(j["model"]["vocab"])
            j["model"]["vocab"]["\u0120unmergeable"] = model_size
            for t in j["added_tokens"]:
                if t["content"] == "<tool>":
                    t["id"] = model_size + 1
            with open(path, "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
            add_llama3_post_processor(path)
            from tokenizers import Tokenizer
            tok = Tokenizer.from_file(path)
        print(f"wrote {os.path.relpath(path)} ({os.path.getsize(path)} bytes, vocab {tok.get_vocab_size()})")
        ids[kind] = {}
        for name, text in CASES:
            enc = tok.encode(text, add_special_tokens=False).ids
            ids[kind][name] = {"text": text, "ids": enc}
    path = os.path.join(OUT, "hf_tokenizer_ids.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(ids, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
