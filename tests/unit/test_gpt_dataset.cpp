// The GPT sample stream: Megatron's document split, sample boundaries, epochs and shuffling, the
// synthetic source, and that the (data rank, micro-batch) slices of a global batch never depend on
// the parallel layout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/error.hpp"
#include "parallel/gpt_dataset.hpp"
#include "parallel/indexed_dataset.hpp"

namespace fs = std::filesystem;
using namespace parallel;

namespace {

// Documents of given lengths; the token at position p of the concatenation is 1000 + p, so a
// sample's tokens say exactly where it came from.
class CountingSource final : public TokenSource {
 public:
  explicit CountingSource(std::vector<int64_t> lengths) {
    offsets_.push_back(0);
    for (int64_t l : lengths) offsets_.push_back(offsets_.back() + l);
  }
  int64_t num_documents() const override { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t document_offset(int64_t d) const override { return offsets_.at(static_cast<std::size_t>(d)); }
  void read(int64_t position, int64_t count, int32_t* out) const override {
    EXPECT_LE(position + count, offsets_.back());
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(1000 + position + i);
  }
  std::string describe() const override { return "counting"; }

 private:
  std::vector<int64_t> offsets_;
};

std::shared_ptr<const TokenSource> counting(std::vector<int64_t> lengths) {
  return std::make_shared<CountingSource>(std::move(lengths));
}

std::vector<int32_t> range_tokens(int64_t first_position, int64_t count) {
  std::vector<int32_t> v(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(1000 + first_position + i);
  return v;
}

std::vector<int32_t> as_vector(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

GPTDatasetOptions options(int64_t s, int64_t g, int64_t mbs, bool shuffle,
                          const std::string& split = "1,0,0") {
  GPTDatasetOptions o;
  o.seq_length = s;
  o.global_batch_size = g;
  o.micro_batch_size = mbs;
  o.shuffle = shuffle;
  o.seed = 1234;
  o.split = split;
  return o;
}

}  // namespace

TEST(SplitDocuments, MegatronsCumulativeRounding) {
  auto r = split_documents("969,30,1", 1000);
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].end, 969);
  EXPECT_EQ(r[1].begin, 969);
  EXPECT_EQ(r[1].end, 999);
  EXPECT_EQ(r[2].begin, 999);
  EXPECT_EQ(r[2].end, 1000);
  // Bookends 0, 1/3, 2/3, 1 of 10 documents: round(3.33) = 3, round(6.67) = 7.
  r = split_documents("1,1,1", 10);
  EXPECT_EQ(r[0].end, 3);
  EXPECT_EQ(r[1].begin, 3);
  EXPECT_EQ(r[1].end, 7);
  EXPECT_EQ(r[2].end, 10);
  // Python's round: 2.5 -> 2 (half to even).
  r = split_documents("1,1", 5);
  EXPECT_EQ(r[0].end, 2);
  EXPECT_EQ(r[1].begin, 2);
  EXPECT_EQ(r[1].end, 5);
  EXPECT_EQ(r[2].begin, r[2].end);
  // 3.5 -> 4.
  r = split_documents("1, 1", 7);
  EXPECT_EQ(r[0].end, 4);
  // A single weight takes everything.
  r = split_documents("98", 17);
  EXPECT_EQ(r[0].end, 17);
  EXPECT_EQ(r[1].end - r[1].begin, 0);
  r = split_documents("0.5,0.25,0.25", 8);
  EXPECT_EQ(r[0].end, 4);
  EXPECT_EQ(r[1].end, 6);
  for (const char* bad : {"", "a,b", "1,2,3,4", "0,0,0", "-1,2", "1,,2", "1e999"})
    EXPECT_NE(error_of([&] { split_documents(bad, 10); }).find("data.split"), std::string::npos) << bad;
}

TEST(GPTDataset, SamplesAreConsecutiveWindowsOfTheTrainingDocuments) {
  // 10 documents of 7..16 tokens; split 6,2,2 puts documents [0, 6) in train.
  std::vector<int64_t> lengths;
  for (int i = 0; i < 10; ++i) lengths.push_back(7 + i);
  const int64_t s = 8;
  GPTDataset train(counting(lengths), DataSplit::Train, options(s, 4, 1, false, "6,2,2"));
  const int64_t train_tokens = 7 + 8 + 9 + 10 + 11 + 12;
  EXPECT_EQ(train.num_tokens(), train_tokens);
  EXPECT_EQ(train.samples_per_epoch(), (train_tokens - 1) / s);
  for (int64_t i = 0; i < train.samples_per_epoch(); ++i)
    EXPECT_EQ(train.sample(i), range_tokens(i * s, s + 1)) << i;
  // Epochs wrap to the start.
  EXPECT_EQ(train.sample(train.samples_per_epoch()), range_tokens(0, s + 1));
  EXPECT_EQ(train.sample(train.samples_per_epoch() + 2), range_tokens(2 * s, s + 1));

  // The validation split starts at its first document's first token.
  GPTDataset valid(counting(lengths), DataSplit::Valid, options(s, 4, 1, false, "6,2,2"));
  EXPECT_EQ(valid.documents().begin, 6);
  EXPECT_EQ(valid.documents().end, 8);
  EXPECT_EQ(valid.num_tokens(), 13 + 14);
  EXPECT_EQ(valid.sample(1), range_tokens(train_tokens + s, s + 1));
}

TEST(GPTDataset, ExactFitUsesEveryTokenOnce) {
  // T = k*s + 1 tokens give exactly k samples whose inputs cover all but the last token.
  GPTDataset ds(counting({4 * 5 + 1}), DataSplit::Train, options(5, 2, 1, false));
  EXPECT_EQ(ds.samples_per_epoch(), 4);
  GPTDataset short_by_one(counting({4 * 5}), DataSplit::Train, options(5, 2, 1, false));
  EXPECT_EQ(short_by_one.samples_per_epoch(), 3);
}

TEST(GPTDataset, MicroBatchTargetsAreTokensShiftedByOne) {
  GPTDataset ds(counting({100}), DataSplit::Train, options(6, 4, 2, false));
  const MicroBatch mb = ds.micro_batch(1, 1, 2, 0);  // global batch 1, second of 2 ranks: samples 6, 7
  ASSERT_EQ(mb.tokens.shape(), (Shape{2, 6}));
  ASSERT_EQ(mb.targets.shape(), (Shape{2, 6}));
  EXPECT_EQ(mb.tokens.dtype(), DType::I32);
  std::vector<int32_t> tokens = range_tokens(6 * 6, 6);
  std::vector<int32_t> more = range_tokens(7 * 6, 6);
  tokens.insert(tokens.end(), more.begin(), more.end());
  EXPECT_EQ(as_vector(mb.tokens), tokens);
  std::vector<int32_t> targets = range_tokens(6 * 6 + 1, 6);
  more = range_tokens(7 * 6 + 1, 6);
  targets.insert(targets.end(), more.begin(), more.end());
  EXPECT_EQ(as_vector(mb.targets), targets);
}

// Megatron's get_ltor_masks_and_position_ids on the input tokens: an eod belongs to the document it
// ends; the positions restart after it, the tokens after it do not see it, and the loss is masked
// where the input is eod (predicting the next document's first token), not where the target is.
TEST(DocumentMasks, MegatronsSemantics) {
  MicroBatch mb;
  mb.tokens = Tensor::from_vector(std::vector<int32_t>{5, 9, 7, 8, 9, 6, 9, 9, 4, 3}, {2, 5});
  GPTDatasetOptions o;
  o.eod = 9;
  o.reset_position_ids = o.reset_attention_mask = o.eod_mask_loss = true;
  document_masks(o, mb);
  EXPECT_EQ(as_vector(mb.positions), (std::vector<int32_t>{0, 1, 0, 1, 2, 0, 1, 0, 0, 1}));
  EXPECT_EQ(as_vector(mb.doc_start), (std::vector<int32_t>{0, 0, 2, 2, 2, 0, 0, 2, 3, 3}));
  EXPECT_EQ(mb.loss_mask.to_float_vector(), (std::vector<float>{1, 0, 1, 1, 0, 1, 0, 0, 1, 1}));
  // Each key alone leaves the others plain.
  o.reset_attention_mask = o.eod_mask_loss = false;
  document_masks(o, mb);
  EXPECT_EQ(as_vector(mb.positions), (std::vector<int32_t>{0, 1, 0, 1, 2, 0, 1, 0, 0, 1}));
  EXPECT_EQ(as_vector(mb.doc_start), std::vector<int32_t>(10, 0));
  EXPECT_EQ(mb.loss_mask.to_float_vector(), std::vector<float>(10, 1.0f));
  o.reset_position_ids = false;
  o.reset_attention_mask = true;
  document_masks(o, mb);
  EXPECT_EQ(as_vector(mb.positions), (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  EXPECT_EQ(as_vector(mb.doc_start), (std::vector<int32_t>{0, 0, 2, 2, 2, 0, 0, 2, 3, 3}));
}

TEST(DocumentMasks, MicroBatchesCarryThemWhenAsked) {
  GPTDatasetOptions o = options(6, 4, 2, false);
  GPTDataset plain(counting({100}), DataSplit::Train, o);
  EXPECT_FALSE(plain.micro_batch(0, 0, 1, 0).positions.defined());
  o.eod = 1003;  // the token at position 3 of the concatenation
  o.eod_mask_loss = true;
  GPTDataset ds(counting({100}), DataSplit::Train, o);
  const MicroBatch mb = ds.micro_batch(0, 0, 1, 0);  // samples 0 and 1: tokens 1000..1005, 1006..1011
  EXPECT_EQ(mb.loss_mask.to_float_vector(), (std::vector<float>{1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1}));
}

TEST(GPTDataset, ShufflePermutesEachEpochAnew) {
  GPTDataset ds(counting({50, 60, 70, 80}), DataSplit::Train, options(4, 8, 1, true));
  const int64_t e = ds.samples_per_epoch();
  ASSERT_EQ(e, (260 - 1) / 4);
  std::vector<int64_t> epoch0;
  std::vector<int64_t> epoch1;
  for (int64_t i = 0; i < e; ++i) epoch0.push_back(ds.sample_in_epoch(i));
  for (int64_t i = 0; i < e; ++i) epoch1.push_back(ds.sample_in_epoch(e + i));
  std::vector<int64_t> identity(static_cast<std::size_t>(e));
  std::iota(identity.begin(), identity.end(), 0);
  for (const auto* epoch : {&epoch0, &epoch1}) {
    std::vector<int64_t> sorted = *epoch;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, identity);  // each epoch is a permutation: every sample exactly once
    EXPECT_NE(*epoch, identity);
  }
  EXPECT_NE(epoch0, epoch1);
  // The tokens follow the permutation.
  EXPECT_EQ(ds.sample(3), range_tokens(epoch0[3] * 4, 5));
  EXPECT_EQ(ds.sample(e + 5), range_tokens(epoch1[5] * 4, 5));
  // Deterministic for a seed (a second dataset, fresh cache, far epochs first), different across seeds.
  GPTDataset again(counting({50, 60, 70, 80}), DataSplit::Train, options(4, 8, 1, true));
  EXPECT_EQ(again.sample_in_epoch(7 * e + 3), ds.sample_in_epoch(7 * e + 3));
  EXPECT_EQ(again.sample_in_epoch(3), epoch0[3]);
  GPTDatasetOptions other = options(4, 8, 1, true);
  other.seed = 99;
  GPTDataset reseeded(counting({50, 60, 70, 80}), DataSplit::Train, other);
  std::vector<int64_t> epoch0_other;
  for (int64_t i = 0; i < e; ++i) epoch0_other.push_back(reseeded.sample_in_epoch(i));
  EXPECT_NE(epoch0_other, epoch0);
}

// Values from an independent Python transcription of the documented generator (splitmix64 +
// Fisher-Yates). They pin the data order: a change here changes what resumed runs train on.
TEST(GPTDataset, PermutationIsPinned) {
  EXPECT_EQ(epoch_permutation(10, 1234, DataSplit::Train, 0),
            (std::vector<int64_t>{6, 9, 7, 0, 1, 4, 5, 3, 8, 2}));
  EXPECT_EQ(epoch_permutation(10, 1234, DataSplit::Train, 1),
            (std::vector<int64_t>{7, 2, 9, 3, 6, 8, 5, 0, 1, 4}));
  EXPECT_EQ(epoch_permutation(10, 1234, DataSplit::Valid, 0),
            (std::vector<int64_t>{8, 5, 0, 1, 7, 3, 6, 4, 9, 2}));
  EXPECT_EQ(epoch_permutation(10, 7, DataSplit::Train, 0),
            (std::vector<int64_t>{6, 8, 9, 0, 5, 3, 7, 4, 2, 1}));
  EXPECT_TRUE(epoch_permutation(0, 1, DataSplit::Train, 0).empty());
  EXPECT_EQ(epoch_permutation(1, 1, DataSplit::Train, 0), (std::vector<int64_t>{0}));
}

TEST(GPTDataset, SyntheticTokensArePinnedAndLayoutFree) {
  auto src = make_synthetic_source(2'000'000, 50257, 42, 1000);
  EXPECT_EQ(src->num_documents(), 2000);
  EXPECT_EQ(src->document_offset(2000), 2'000'000);
  std::vector<int32_t> head(8);
  src->read(0, 8, head.data());
  EXPECT_EQ(head, (std::vector<int32_t>{39997, 42777, 6706, 26310, 25244, 730, 12811, 37307}));
  std::vector<int32_t> far(4);
  src->read(1'000'000, 4, far.data());
  EXPECT_EQ(far, (std::vector<int32_t>{45136, 1601, 31130, 19208}));
  // Reading in pieces gives the same stream.
  std::vector<int32_t> whole(100);
  src->read(500, 100, whole.data());
  std::vector<int32_t> pieces(100);
  src->read(500, 37, pieces.data());
  src->read(537, 63, pieces.data() + 37);
  EXPECT_EQ(whole, pieces);
  // Partial last document; tokens stay inside the vocabulary.
  auto small = make_synthetic_source(2500, 7, 1, 1000);
  EXPECT_EQ(small->num_documents(), 3);
  EXPECT_EQ(small->document_offset(3), 2500);
  std::vector<int32_t> all(2500);
  small->read(0, 2500, all.data());
  EXPECT_EQ(std::set<int32_t>(all.begin(), all.end()), (std::set<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_THROW(small->read(2400, 101, all.data()), Error);
}

// The union over every (data rank, micro-batch) slice, in rank then micro-batch order, is the global
// batch in order, whatever the number of data ranks and the micro-batch size.
TEST(GPTDataset, BatchesDoNotDependOnTheLayout) {
  for (bool shuffle : {false, true}) {
    for (bool synthetic : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "shuffle " << shuffle << " synthetic " << synthetic);
      const int64_t s = 5;
      const int64_t g = 8;
      auto source = synthetic ? make_synthetic_source(1000, 300, 5, 64) : counting({90, 3, 41, 77, 12});
      GPTDataset reference(source, DataSplit::Train, options(s, g, 1, shuffle, "969,30,1"));
      // Enough global batches to cross at least one epoch boundary.
      const int64_t batches = reference.samples_per_epoch() / g + 3;
      for (int64_t b = 0; b < batches; ++b) {
        std::vector<int32_t> expected_tokens;
        std::vector<int32_t> expected_targets;
        for (int64_t n = b * g; n < (b + 1) * g; ++n) {
          const std::vector<int32_t> sample = reference.sample(n);
          expected_tokens.insert(expected_tokens.end(), sample.begin(), sample.end() - 1);
          expected_targets.insert(expected_targets.end(), sample.begin() + 1, sample.end());
        }
        for (int dp : {1, 2, 4}) {
          for (int64_t mbs : {1, 2}) {
            if ((g / dp) % mbs != 0) continue;
            GPTDataset ds(source, DataSplit::Train, options(s, g, mbs, shuffle, "969,30,1"));
            std::vector<int32_t> tokens;
            std::vector<int32_t> targets;
            ASSERT_EQ(ds.num_micro_batches(dp), g / dp / mbs);
            for (int d = 0; d < dp; ++d) {
              for (int64_t m = 0; m < ds.num_micro_batches(dp); ++m) {
                const MicroBatch mb = ds.micro_batch(b, d, dp, m);
                ASSERT_EQ(mb.tokens.shape(), (Shape{mbs, s}));
                const std::vector<int32_t> t = as_vector(mb.tokens);
                const std::vector<int32_t> y = as_vector(mb.targets);
                tokens.insert(tokens.end(), t.begin(), t.end());
                targets.insert(targets.end(), y.begin(), y.end());
              }
            }
            EXPECT_EQ(tokens, expected_tokens) << "batch " << b << " dp " << dp << " mbs " << mbs;
            EXPECT_EQ(targets, expected_targets) << "batch " << b << " dp " << dp << " mbs " << mbs;
          }
        }
      }
    }
  }
}

TEST(GPTDataset, RejectsImpossibleRequests) {
  // The test split of 969,30,1 over 5 documents is empty.
  std::string msg = error_of([] {
    GPTDataset(counting({10, 10, 10, 10, 10}), DataSplit::Test, options(4, 2, 1, false, "969,30,1"));
  });
  EXPECT_NE(msg.find("the test split of counting"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has 0 tokens"), std::string::npos) << msg;
  // seq_length + 1 tokens are needed for one sample.
  msg = error_of([] { GPTDataset(counting({8}), DataSplit::Train, options(8, 2, 1, false)); });
  EXPECT_NE(msg.find("a sample needs seq_length + 1 = 9"), std::string::npos) << msg;
  GPTDataset ds(counting({100}), DataSplit::Train, options(4, 6, 1, false));
  EXPECT_THROW(ds.num_micro_batches(4), Error);  // 6 does not split over 4 ranks
  EXPECT_THROW(ds.micro_batch(0, 2, 2, 0), Error);
  EXPECT_THROW(ds.micro_batch(0, 0, 2, 3), Error);
  GPTDatasetOptions checked = options(4, 2, 1, false);
  checked.vocab_size = 1050;  // CountingSource's tokens reach 1050 within the first samples
  GPTDataset vocab_checked(counting({100}), DataSplit::Train, checked);
  EXPECT_NO_THROW(vocab_checked.micro_batch(0, 0, 1, 0));
  msg = error_of([&] { vocab_checked.micro_batch(6, 0, 1, 0); });
  EXPECT_NE(msg.find("outside the vocabulary [0, 1050)"), std::string::npos) << msg;
}

TEST(GPTDataset, ReadsAnIndexedDatasetAcrossDocuments) {
  const fs::path dir = fs::temp_directory_path() / ("parallel_gpt_dataset_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string prefix = (dir / "corpus").string();
  std::vector<int32_t> all;
  {
    IndexedDatasetBuilder builder(prefix, IndexedDType::UInt16);
    int32_t next = 0;
    for (int d = 0; d < 20; ++d) {
      std::vector<int32_t> doc;
      for (int i = 0; i < 3 + (d * 7) % 11; ++i) doc.push_back(next++ % 500);
      if (d == 4) doc.clear();  // an empty document is simply skipped over
      all.insert(all.end(), doc.begin(), doc.end());
      builder.add_document(doc);
    }
    builder.finalize();
  }
  auto source = open_indexed_source(prefix);
  EXPECT_EQ(source->num_documents(), 20);
  // Split 1,0,0 uses every document; shuffle off: sample i is all[i*s, i*s + s + 1).
  GPTDataset ds(source, DataSplit::Train, options(6, 4, 1, false));
  EXPECT_EQ(ds.num_tokens(), static_cast<int64_t>(all.size()));
  for (int64_t i = 0; i < ds.samples_per_epoch(); ++i)
    EXPECT_EQ(ds.sample(i), std::vector<int32_t>(all.begin() + i * 6, all.begin() + i * 6 + 7)) << i;
  // With a split, the validation documents start where the training documents end.
  GPTDataset valid(source, DataSplit::Valid, options(6, 4, 1, false, "15,5"));
  const int64_t start = source->document_offset(15);
  EXPECT_EQ(valid.sample(0), std::vector<int32_t>(all.begin() + start, all.begin() + start + 7));
  fs::remove_all(dir);
}

TEST(GPTDataset, FromConfig) {
  Config config;
  config.model.seq_length = 16;
  config.model.vocab_size = 1000;
  config.train.global_batch_size = 4;
  config.train.micro_batch_size = 2;
  config.data.path = "synthetic";
  GPTDataset train = make_gpt_dataset(config, DataSplit::Train);
  GPTDataset test = make_gpt_dataset(config, DataSplit::Test);
  EXPECT_GT(train.samples_per_epoch(), 100000);
  EXPECT_GT(test.samples_per_epoch(), 0);
  const MicroBatch a = train.micro_batch(3, 1, 2, 0);
  const MicroBatch b = make_gpt_dataset(config, DataSplit::Train).micro_batch(3, 1, 2, 0);
  EXPECT_EQ(as_vector(a.tokens), as_vector(b.tokens));
  for (int32_t t : as_vector(a.tokens)) EXPECT_LT(t, 1000);
  config.data.path = "/nonexistent/corpus";
  EXPECT_NE(error_of([&] { make_gpt_dataset(config, DataSplit::Train); }).find("/nonexistent/corpus.idx"),
            std::string::npos);
}

// data.format sft: first-fit packing of whole samples, truncation, the masks a packed sequence
// carries, and the checks of the loss mask dataset against the tokens.
TEST(SftPacking, FirstFitInDocumentOrder) {
  const fs::path dir = fs::temp_directory_path() / ("parallel_sft_packing_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string text = (dir / "s_text_document").string(), mask = (dir / "s_loss_mask_document").string();
  // Lengths: d1 and d5 are longer than seq_length + 1 = 8 (truncated), d3 has one token and d4 none
  // (no prediction: left out). Token i of document d is 100 d + i; its mask is 1 from i = 2 on.
  const std::vector<int> lengths = {5, 9, 3, 1, 0, 12, 4, 5, 3};
  {
    IndexedDatasetBuilder tokens(text, IndexedDType::UInt16), masks(mask, IndexedDType::UInt8);
    for (std::size_t d = 0; d < lengths.size(); ++d) {
      std::vector<int32_t> t, m;
      for (int i = 0; i < lengths[d]; ++i) {
        t.push_back(static_cast<int32_t>(100 * d + i));
        m.push_back(i >= 2 ? 1 : 0);
      }
      tokens.add_document(t);
      masks.add_document(m);
    }
    tokens.finalize();
    masks.finalize();
  }
  GPTDatasetOptions o = options(7, 1, 1, false);
  o.sft = true;
  GPTDataset ds(open_sft_source(text, mask), DataSplit::Train, o);
  // First fit: d0 -> 0 (3 free), d1 -> 1 (full), d2 -> 0 (full), d5 -> 2, d6 -> 3 (4 free),
  // d7 -> 4 (3 free), d8 -> 3, the first with room although 4 would fit it exactly.
  EXPECT_EQ(ds.samples_per_epoch(), 5);
  EXPECT_EQ(ds.packed_samples(), 7);
  EXPECT_EQ(ds.truncated_samples(), 2);
  EXPECT_EQ(ds.sample(0), (std::vector<int32_t>{0, 1, 2, 3, 4, 200, 201, 202}));
  EXPECT_EQ(ds.sample(1), (std::vector<int32_t>{100, 101, 102, 103, 104, 105, 106, 107}));
  EXPECT_EQ(ds.sample(2), (std::vector<int32_t>{500, 501, 502, 503, 504, 505, 506, 507}));
  EXPECT_EQ(ds.sample(3), (std::vector<int32_t>{600, 601, 602, 603, 800, 801, 802, 0}));
  EXPECT_EQ(ds.sample(4), (std::vector<int32_t>{700, 701, 702, 703, 704, 0, 0, 0}));
  EXPECT_EQ(ds.sample(5), ds.sample(0));  // the next epoch, unshuffled

  // Sequence 3: samples d6 | d8 | padding. Positions restart per sample, attention stays inside it,
  // a target counts with its own mask inside its sample and never across a boundary.
  const MicroBatch mb = ds.micro_batch(3, 0, 1, 0);
  const auto ints = [](const Tensor& t) {
    const int32_t* p = t.data<int32_t>();
    return std::vector<int32_t>(p, p + t.numel());
  };
  EXPECT_EQ(ints(mb.tokens), (std::vector<int32_t>{600, 601, 602, 603, 800, 801, 802}));
  EXPECT_EQ(ints(mb.targets), (std::vector<int32_t>{601, 602, 603, 800, 801, 802, 0}));
  EXPECT_EQ(ints(mb.positions), (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2}));
  EXPECT_EQ(ints(mb.doc_start), (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4}));
  EXPECT_EQ(mb.loss_mask.to_float_vector(), (std::vector<float>{0, 1, 1, 0, 0, 1, 0}));
  // Sequence 4: d7 then three padding tokens, which are a document of their own with no loss.
  const MicroBatch pad = ds.micro_batch(4, 0, 1, 0);
  EXPECT_EQ(ints(pad.positions), (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1}));
  EXPECT_EQ(ints(pad.doc_start), (std::vector<int32_t>{0, 0, 0, 0, 0, 5, 5}));
  EXPECT_EQ(pad.loss_mask.to_float_vector(), (std::vector<float>{0, 1, 1, 1, 0, 0, 0}));

  // The layout does not change the data: dp rank 1 of 2's first micro-batch is sequence 2 of a
  // global batch of 4, as on one rank.
  GPTDatasetOptions o4 = o;
  o4.global_batch_size = 4;
  GPTDataset ds4(open_sft_source(text, mask), DataSplit::Train, o4);
  EXPECT_EQ(ints(ds4.micro_batch(1, 1, 2, 0).tokens), ints(ds4.micro_batch(1, 0, 1, 2).tokens));
  EXPECT_EQ(ds4.micro_batch(1, 1, 2, 1).loss_mask.to_float_vector(),
            ds4.micro_batch(1, 0, 1, 3).loss_mask.to_float_vector());

  // Without a mask dataset, sft is refused; a plain source has no mask.
  EXPECT_NE(
      error_of([&] { GPTDataset(open_indexed_source(text), DataSplit::Train, o); }).find("has no loss mask"),
      std::string::npos);
  fs::remove_all(dir);
}

TEST(SftPacking, MaskDatasetMustMatchTheTokens) {
  const fs::path dir = fs::temp_directory_path() / ("parallel_sft_masks_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto write = [&](const std::string& name, IndexedDType dtype,
                         const std::vector<std::vector<int32_t>>& docs) {
    const std::string prefix = (dir / name).string();
    IndexedDatasetBuilder b(prefix, dtype);
    for (const auto& d : docs) b.add_document(d);
    b.finalize();
    return prefix;
  };
  const std::string text = write("t", IndexedDType::UInt16, {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}});
  const std::string fewer = write("fewer", IndexedDType::UInt8, {{0, 1, 1}, {0, 1}});
  const std::string shorter = write("shorter", IndexedDType::UInt8, {{0, 1, 1}, {0, 1}, {0, 1, 1}});
  const std::string wide = write("wide", IndexedDType::UInt16, {{0, 1, 1}, {0, 1}, {0, 1, 1, 1}});
  const std::string two = write("two", IndexedDType::UInt8, {{0, 1, 1}, {0, 2}, {0, 1, 1, 1}});
  std::string msg = error_of([&] { open_sft_source(text, fewer); });
  EXPECT_NE(msg.find("does not match the token dataset " + text + ": 2 documents, the tokens have 3"),
            std::string::npos)
      << msg;
  msg = error_of([&] { open_sft_source(text, shorter); });
  EXPECT_NE(msg.find("document 2 has 3 mask values for 4 tokens"), std::string::npos) << msg;
  msg = error_of([&] { open_sft_source(text, wide); });
  EXPECT_NE(msg.find("its dtype is uint16, a loss mask is uint8"), std::string::npos) << msg;
  GPTDatasetOptions o = options(3, 1, 1, false);
  o.sft = true;
  GPTDataset ds(open_sft_source(text, two), DataSplit::Train, o);
  EXPECT_NO_THROW(ds.micro_batch(0, 0, 1, 0));          // d0 alone
  msg = error_of([&] { ds.micro_batch(1, 0, 1, 0); });  // d1, whose second value is 2
  EXPECT_NE(msg.find("value 2 at element 4: a loss mask is 0 or 1"), std::string::npos) << msg;
  fs::remove_all(dir);
}
