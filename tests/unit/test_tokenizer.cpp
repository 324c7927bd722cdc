// Tokenizers: GPT-2's pre-tokenisation and BPE against ids from the reference implementation
// (tests/reference/fixtures/gpt2_tokens.json, made by tiktoken and a plain encoder.py that agree),
// a tiny hand-made BPE vocabulary, and the ByteLevel tokenizer. The real GPT-2 files live in
// ../shared/data/gpt2 beside the checkout; tests that need them skip when it is absent.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/tokenizer.hpp"
#include "paths.hpp"

namespace fs = std::filesystem;
using namespace parallel;

namespace {

using parallel::testing::source_dir;

using parallel::testing::gpt2_dir;

bool have_gpt2() { return fs::exists(gpt2_dir() / "encoder.json") && fs::exists(gpt2_dir() / "vocab.bpe"); }

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : gpt2_pretokenize(text)) out.emplace_back(p);
  return out;
}

// GPT-2's byte-to-unicode mapping, written independently of the library's, as UTF-8.
std::string mapped(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    int cp = b;
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    if (!printable) {
      int n = 0;
      for (int c = 0; c < b; ++c) {
        const bool p = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
        if (!p) ++n;
      }
      cp = 256 + n;
    }
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("parallel_tokenizer_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A byte-level vocabulary: the 256 bytes (ids 0..255 in byte order), then the merges' results,
// then <|endoftext|>. Written in GPT-2's file formats.
struct TinyVocab {
  fs::path vocab;
  fs::path merges;
};

TinyVocab write_tiny_vocab(const fs::path& dir,
                           const std::vector<std::pair<std::string, std::string>>& merges,
                           const std::string& merges_header = "#version: 0.2\n",
                           const std::string& eol = "\n") {
  nlohmann::json vocab = nlohmann::json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[mapped(std::string(1, static_cast<char>(b)))] = id++;
  std::string merges_text = merges_header;
  for (const auto& [l, r] : merges) {
    const std::string token = mapped(l + r);
    if (!vocab.contains(token)) vocab[token] = id++;
    merges_text += mapped(l) + " " + mapped(r) + eol;
  }
  vocab["<|endoftext|>"] = id++;
  TinyVocab files{dir / "vocab.json", dir / "merges.txt"};
  write_file(files.vocab, vocab.dump());
  write_file(files.merges, merges_text);
  return files;
}

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(ByteLevelTokenizer, IdsAreBytes) {
  ByteLevelTokenizer t;
  EXPECT_EQ(t.vocab_size(), 257);
  EXPECT_EQ(t.eod(), 256);
  EXPECT_EQ(t.name(), "ByteLevel");
  const std::string text = "Hé\n\xff";
  const std::vector<int32_t> ids = t.encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{'H', 0xC3, 0xA9, '\n', 0xFF}));
  EXPECT_EQ(t.decode(ids), text);
  const std::vector<int32_t> with_eod = {'a', 256};
  EXPECT_EQ(t.decode(with_eod), "a<|endoftext|>");
  const std::vector<int32_t> bad = {257};
  EXPECT_THROW(t.decode(bad), Error);
  EXPECT_TRUE(t.encode("").empty());
}

TEST(ByteLevelTokenizer, MadeByName) {
  auto t = make_tokenizer("ByteLevel");
  EXPECT_EQ(t->vocab_size(), 257);
  EXPECT_NE(error_of([] { make_tokenizer("bert"); }).find("unknown tokenizer type 'bert'"),
            std::string::npos);
  // GPT-2 without files says which files it needs.
  EXPECT_NE(error_of([] { make_tokenizer("GPT2BPETokenizer"); }).find("data.vocab_file"), std::string::npos);
}

TEST(Gpt2Pretokenize, FollowsThePattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(""), V{});
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("Hello, world!"), (V{"Hello", ",", " world", "!"}));
  // \s+(?!\S) leaves the last space of a run to prefix the next word.
  EXPECT_EQ(pieces("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(pieces("a \n\nb"), (V{"a", " \n", "\n", "b"}));
  EXPECT_EQ(pieces("a\nb"), (V{"a", "\n", "b"}));
  // Trailing whitespace is one piece.
  EXPECT_EQ(pieces("x  \n"), (V{"x", "  \n"}));
  EXPECT_EQ(pieces(" "), (V{" "}));
  EXPECT_EQ(pieces("  x"), (V{" ", " x"}));
  // Contractions are case-sensitive and split greedily.
  EXPECT_EQ(pieces("I'm they'll it's"), (V{"I", "'m", " they", "'ll", " it", "'s"}));
  EXPECT_EQ(pieces("DON'T"), (V{"DON", "'", "T"}));
  EXPECT_EQ(pieces("''s"), (V{"''", "s"}));
  EXPECT_EQ(pieces("'sun"), (V{"'s", "un"}));
  // Letters, numbers and other characters form separate runs; one leading space joins each.
  EXPECT_EQ(pieces("abc123 456def"), (V{"abc", "123", " 456", "def"}));
  EXPECT_EQ(pieces("x+=1;"), (V{"x", "+=", "1", ";"}));
  EXPECT_EQ(pieces(" ..."), (V{" ..."}));
  // Unicode: letters of any script, numbers beyond ASCII, combining marks are "other".
  EXPECT_EQ(pieces("Straße Ωmega 中文"), (V{"Straße", " Ωmega", " 中文"}));
  EXPECT_EQ(pieces("٣٤٥ ½"), (V{"٣٤٥", " ½"}));
  EXPECT_EQ(pieces("e\xCC\x81x"), (V{"e", "\xCC\x81", "x"}));
  // Only a literal space prefixes a word: other whitespace stays apart.
  EXPECT_EQ(pieces("a\xC2\xA0\xC2\xA0"
                   "b"),
            (V{"a", "\xC2\xA0", "\xC2\xA0", "b"}));
  // Invalid UTF-8 bytes are "other" characters.
  EXPECT_EQ(pieces("a\xff\xfe"
                   "b"),
            (V{"a", "\xff\xfe", "b"}));
  EXPECT_EQ(pieces(" \xC3"), (V{" \xC3"}));
}

TEST(Gpt2Pretokenize, PiecesConcatenateToTheInput) {
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a",        "Z",    " ",        "  ",  "\n",   "\t", "'",
                                             "s",        "ll",   "1",        ".",   "é",    "中", "😀",
                                             "\xC2\xA0", "\xff", "\xE2\x80", "'re", "\r\n", "½"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    std::string joined;
    for (std::string_view p : gpt2_pretokenize(text)) {
      EXPECT_FALSE(p.empty());
      joined += p;
    }
    EXPECT_EQ(joined, text);
  }
}

TEST(Gpt2Pretokenize, UnicodeClasses) {
  for (char32_t c : {U'a', U'Z', U'é', U'ß', U'Ω', U'Ж', U'中', U'한', U'ἀ', U'ª'})
    EXPECT_TRUE(unicode_is_letter(c)) << static_cast<uint32_t>(c);
  for (char32_t c : {U'0', U'9', U'٣', U'²', U'½', U'Ⅻ', U'〇'})
    EXPECT_TRUE(unicode_is_number(c)) << static_cast<uint32_t>(c);
  for (char32_t c :
       {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', U'\u0085', U'\u00A0', U'\u2003', U'\u3000', U'\u2028'})
    EXPECT_TRUE(unicode_is_space(c)) << static_cast<uint32_t>(c);
  for (char32_t c : {U'1', U'_', U'\u0301', U'😀', U'-', U'\u200B'}) EXPECT_FALSE(unicode_is_letter(c));
  EXPECT_FALSE(unicode_is_number(U'a'));
  EXPECT_FALSE(unicode_is_space(U'\u200B'));  // zero width space is not White_Space
  EXPECT_FALSE(unicode_is_space(U'\x1C'));    // nor are the ASCII separators (unlike Python's str.isspace)
}

TEST(Gpt2Tokenizer, TinyVocabularyMergesByRank) {
  TempDir dir;
  // Ranks: "a b" (0) < "ab c" (1) < "b c" (2). "abc" must become "abc" via "ab", not "a"+"bc".
  const TinyVocab files = write_tiny_vocab(dir.path(), {{"a", "b"}, {"ab", "c"}, {"b", "c"}, {" ", "ab"}});
  GPT2Tokenizer t(files.vocab.string(), files.merges.string());
  EXPECT_EQ(t.vocab_size(), 256 + 4 + 1);
  EXPECT_EQ(t.eod(), 260);
  EXPECT_EQ(t.token_bytes(256), "ab");
  EXPECT_EQ(t.token_bytes(257), "abc");
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(t.encode("bc"), (std::vector<int32_t>{258}));
  // All occurrences of the best pair merge in one pass, left to right: "aaab" -> a a ab.
  EXPECT_EQ(t.encode("aaab"), (std::vector<int32_t>{'a', 'a', 256}));
  EXPECT_EQ(t.encode("abab"), (std::vector<int32_t>{256, 256}));
  // " ab" is one piece; " " + "ab" merges by the fourth rule.
  EXPECT_EQ(t.encode("x ab"), (std::vector<int32_t>{'x', 259}));
  EXPECT_EQ(t.decode(t.encode("x abc bc\n")), "x abc bc\n");
  const std::vector<int32_t> eod = {260};
  EXPECT_EQ(t.decode(eod), "<|endoftext|>");
  // The eod text inside a document is ordinary characters.
  EXPECT_EQ(t.encode("<|endoftext|>").size(), std::string("<|endoftext|>").size());
  const std::vector<int32_t> bad = {261};
  EXPECT_THROW(t.decode(bad), Error);
}

TEST(Gpt2Tokenizer, AcceptsCrlfMergesWithoutHeader) {
  TempDir dir;
  const TinyVocab files = write_tiny_vocab(dir.path(), {{"a", "b"}}, "", "\r\n");
  GPT2Tokenizer t(files.vocab.string(), files.merges.string());
  EXPECT_EQ(t.encode("ab"), (std::vector<int32_t>{256}));
}

TEST(Gpt2Tokenizer, BadFilesNameTheFileAndProblem) {
  TempDir dir;
  const TinyVocab files = write_tiny_vocab(dir.path(), {{"a", "b"}});
  const std::string missing = (dir.path() / "nope.json").string();
  std::string msg = error_of([&] { GPT2Tokenizer(missing, files.merges.string()); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;

  const fs::path bad_json = dir.path() / "bad.json";
  write_file(bad_json, "{\"a\": ");
  msg = error_of([&] { GPT2Tokenizer(bad_json.string(), files.merges.string()); });
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;

  const fs::path bad_merges = dir.path() / "bad.txt";
  write_file(bad_merges, "#version: 0.2\na b\nonlyone\n");
  msg = error_of([&] { GPT2Tokenizer(files.vocab.string(), bad_merges.string()); });
  EXPECT_NE(msg.find(bad_merges.string() + ":3"), std::string::npos) << msg;

  const fs::path unknown_merge = dir.path() / "unknown.txt";
  write_file(unknown_merge, "#version: 0.2\nx y\n");
  msg = error_of([&] { GPT2Tokenizer(files.vocab.string(), unknown_merge.string()); });
  EXPECT_NE(msg.find("missing from"), std::string::npos) << msg;

  const fs::path no_eod = dir.path() / "noeod.json";
  std::ifstream vocab_in(files.vocab);
  nlohmann::json v = nlohmann::json::parse(vocab_in);
  v.erase("<|endoftext|>");
  write_file(no_eod, v.dump());
  msg = error_of([&] { GPT2Tokenizer(no_eod.string(), files.merges.string()); });
  EXPECT_NE(msg.find("no <|endoftext|>"), std::string::npos) << msg;
}

TEST(Gpt2Tokenizer, MatchesTheReferenceFixture) {
  if (!have_gpt2()) GTEST_SKIP() << "no GPT-2 files in " << gpt2_dir();
  const fs::path fixture_path = source_dir() / "tests" / "reference" / "fixtures" / "gpt2_tokens.json";
  std::ifstream in(fixture_path);
  ASSERT_TRUE(in) << fixture_path;
  const nlohmann::json fixture = nlohmann::json::parse(in);
  GPT2Tokenizer t((gpt2_dir() / "encoder.json").string(), (gpt2_dir() / "vocab.bpe").string());
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.eod(), fixture.at("eod").get<int32_t>());
  EXPECT_EQ(t.eod(), 50256);
  ASSERT_GE(fixture.at("cases").size(), 15u);
  for (const auto& c : fixture.at("cases")) {
    const std::string name = c.at("name");
    const std::string text = c.at("text");
    const std::vector<int32_t> expected = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(t.encode(text), expected) << name;
    EXPECT_EQ(t.decode(expected), text) << name;
  }
}

TEST(Gpt2Tokenizer, ConcurrentEncodesAgree) {
  if (!have_gpt2()) GTEST_SKIP() << "no GPT-2 files in " << gpt2_dir();
  auto t =
      make_tokenizer("gpt2", (gpt2_dir() / "encoder.json").string(), (gpt2_dir() / "vocab.bpe").string());
  std::ifstream in(source_dir() / "tests" / "data" / "sample.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(text.empty());
  const std::vector<int32_t> expected = t->encode(text);
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { results[i] = t->encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& r : results) EXPECT_EQ(r, expected);
  EXPECT_EQ(t->decode(expected), text);
}

namespace {

// The BPE merge loop as it was before the heap version (and as encoder.py writes it): find the
// adjacent pair with the lowest rank, merge every occurrence left to right, rescan. Quadratic on
// long pieces, so used on short inputs only. Reads the files itself (the test's own byte mapping);
// shares only the pre-tokenizer with the library.
class ReferenceBpe {
 public:
  ReferenceBpe(const fs::path& vocab_file, const fs::path& merge_file) {
    std::ifstream vin(vocab_file);
    const nlohmann::json vocab = nlohmann::json::parse(vin);
    std::unordered_map<std::string, int32_t> encoder;
    for (const auto& [token, id] : vocab.items()) encoder[token] = id.get<int32_t>();
    for (int b = 0; b < 256; ++b) byte_ids_[b] = encoder.at(mapped(std::string(1, static_cast<char>(b))));
    std::ifstream min(merge_file, std::ios::binary);
    std::string line;
    int32_t rank = 0;
    bool first = true;
    while (std::getline(min, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const bool header = first && line.starts_with("#version");
      first = false;
      if (line.empty() || header) continue;
      const std::size_t space = line.find(' ');
      const int32_t l = encoder.at(line.substr(0, space));
      const int32_t r = encoder.at(line.substr(space + 1));
      const int32_t m = encoder.at(line.substr(0, space) + line.substr(space + 1));
      merges_.emplace(key(l, r), std::pair{rank++, m});
    }
  }

  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> ids;
    for (std::string_view piece : gpt2_pretokenize(text)) {
      std::vector<int32_t> word;
      for (char c : piece) word.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      std::vector<int32_t> next;
      while (word.size() > 1) {
        int32_t best_rank = std::numeric_limits<int32_t>::max();
        uint64_t best = 0;
        int32_t merged = -1;
        for (std::size_t i = 0; i + 1 < word.size(); ++i) {
          auto it = merges_.find(key(word[i], word[i + 1]));
          if (it != merges_.end() && it->second.first < best_rank) {
            best_rank = it->second.first;
            best = it->first;
            merged = it->second.second;
          }
        }
        if (merged < 0) break;
        next.clear();
        for (std::size_t i = 0; i < word.size(); ++i) {
          if (i + 1 < word.size() && key(word[i], word[i + 1]) == best) {
            next.push_back(merged);
            ++i;
          } else {
            next.push_back(word[i]);
          }
        }
        word.swap(next);
      }
      ids.insert(ids.end(), word.begin(), word.end());
    }
    return ids;
  }

 private:
  static uint64_t key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // -> rank, merged id
};

// Texts without white space: one pre-tokenizer piece each, except "classes".
std::string random_run(const std::string& kind, std::size_t bytes, uint32_t seed) {
  static const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  static const std::string digits = "0123456789";
  static const std::string punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  // Letters of several scripts, 1 to 4 bytes of UTF-8: still one \p{L} run.
  static const std::vector<std::string> scripts = {"a", "e", "t", "é", "ß", "Ω", "ж", "中", "文", "한", "𝔸"};
  // Every class, white space included: many short pieces.
  static const std::vector<std::string> classes = {"a", "Z",  "é",  "中", "1",    "٣", ".",         "'", "'s",
                                                   " ", "\n", "  ", "😀",  "\xff", "x", "e\xCC\x81", "$", "9"};
  std::mt19937 rng(seed);
  std::string out;
  while (out.size() < bytes) {
    if (kind == "letters")
      out += letters[rng() % letters.size()];
    else if (kind == "digits")
      out += digits[rng() % digits.size()];
    else if (kind == "punct")
      out += punct[rng() % punct.size()];
    else if (kind == "mixed")
      out += scripts[rng() % scripts.size()];
    else
      out += classes[rng() % classes.size()];
  }
  return out;
}

}  // namespace

TEST(Gpt2Tokenizer, LongRunsMatchTheQuadraticReference) {
  if (!have_gpt2()) GTEST_SKIP() << "no GPT-2 files in " << gpt2_dir();
  const fs::path vocab = gpt2_dir() / "encoder.json", merges = gpt2_dir() / "vocab.bpe";
  GPT2Tokenizer t(vocab.string(), merges.string());
  const ReferenceBpe ref(vocab, merges);
  for (const std::string kind : {"letters", "digits", "punct", "mixed", "classes"}) {
    for (uint32_t seed = 1; seed <= 2; ++seed) {
      const std::string text = random_run(kind, 20000, seed);
      if (kind != "classes") EXPECT_EQ(gpt2_pretokenize(text).size(), 1u) << kind;
      const std::vector<int32_t> ids = t.encode(text);
      EXPECT_EQ(ids, ref.encode(text)) << kind << " seed " << seed;
      EXPECT_EQ(t.decode(ids), text) << kind;
    }
  }
  // Short runs of few distinct characters: many ties and overlapping pairs ("aaa").
  std::mt19937 rng(11);
  const std::vector<std::string> alphabets = {"a", "ab", "aab", "01", "0001", "!=", ".-", "eé"};
  for (int trial = 0; trial < 300; ++trial) {
    const std::string& alphabet = alphabets[trial % alphabets.size()];
    std::string text;
    const std::size_t n = 1 + rng() % 400;
    for (std::size_t i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    EXPECT_EQ(t.encode(text), ref.encode(text)) << text;
  }
}

// Megabyte runs without white space: one piece each. The ids decode back to the text; runs of one
// or two repeated characters (cheap for the reference: few distinct merges) and many short pieces
// of every class must equal the reference exactly. No timing assertion, but the old quadratic
// loop took minutes here.
TEST(Gpt2Tokenizer, MegabyteRunsWithoutWhiteSpace) {
  if (!have_gpt2()) GTEST_SKIP() << "no GPT-2 files in " << gpt2_dir();
  const fs::path vocab = gpt2_dir() / "encoder.json", merges = gpt2_dir() / "vocab.bpe";
  GPT2Tokenizer t(vocab.string(), merges.string());
  const ReferenceBpe ref(vocab, merges);
  constexpr std::size_t kMB = 1 << 20;
  for (const std::string kind : {"letters", "digits", "punct", "mixed"}) {
    const std::string text = random_run(kind, kMB, 3);
    ASSERT_EQ(gpt2_pretokenize(text).size(), 1u) << kind;
    const std::vector<int32_t> ids = t.encode(text);
    EXPECT_GT(ids.size(), text.size() / 8) << kind;
    EXPECT_LT(ids.size(), text.size()) << kind;
    EXPECT_EQ(t.decode(ids), text) << kind;
    EXPECT_EQ(t.encode(text), ids) << kind;  // not served differently the second time
  }
  for (const std::string unit : {"a", "0", "!", "ab", "x1", "中"}) {
    std::string text;
    while (text.size() < kMB) text += unit;
    EXPECT_EQ(t.encode(text), ref.encode(text)) << unit;
  }
  const std::string classes = random_run("classes", kMB, 4);
  EXPECT_EQ(t.encode(classes), ref.encode(classes));
}

// Merge files other than GPT-2's, with ranks in any order (a pair can rank before the merges that
// make its tokens): the heap-based merge still takes one rank at a time, every occurrence left to
// right, as the rescanning loop does.
TEST(Gpt2Tokenizer, RandomMergeFilesMatchTheReference) {
  std::mt19937 rng(5);
  for (int vocab_trial = 0; vocab_trial < 20; ++vocab_trial) {
    TempDir dir;
    std::vector<std::string> tokens = {"a", "b", "c"};
    std::vector<std::pair<std::string, std::string>> merges;
    std::set<std::pair<std::string, std::string>> seen;
    while (merges.size() < 25) {
      const std::string l = tokens[rng() % tokens.size()], r = tokens[rng() % tokens.size()];
      if (l.size() + r.size() > 8 || !seen.insert({l, r}).second) continue;
      merges.emplace_back(l, r);
      if (std::find(tokens.begin(), tokens.end(), l + r) == tokens.end()) tokens.push_back(l + r);
    }
    // Half the files keep training order; the others move some merges ahead of their inputs'.
    if (vocab_trial % 2 == 1)
      for (int k = 0; k < 8; ++k) std::swap(merges[rng() % merges.size()], merges[rng() % merges.size()]);
    const TinyVocab files = write_tiny_vocab(dir.path(), merges);
    GPT2Tokenizer t(files.vocab.string(), files.merges.string());
    const ReferenceBpe ref(files.vocab, files.merges);
    for (int trial = 0; trial < 50; ++trial) {
      std::string text;
      const std::size_t n = 1 + rng() % (trial < 45 ? 40 : 3000);
      for (std::size_t i = 0; i < n; ++i) text += "abc"[rng() % 3];
      EXPECT_EQ(t.encode(text), ref.encode(text)) << "vocab " << vocab_trial << ": " << text.substr(0, 80);
    }
  }
}
