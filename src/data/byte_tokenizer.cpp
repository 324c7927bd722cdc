// ByteLevel tokenizer (see tokenizer.hpp): the identity on bytes plus one end-of-document id. It
// needs no vocabulary files, so tests and examples can tokenise any text anywhere.
#include "parallel/error.hpp"
#include "parallel/tokenizer.hpp"

namespace parallel {

std::vector<int32_t> ByteLevelTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string ByteLevelTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id == kEod) {
      text += "<|endoftext|>";
    } else if (id >= 0 && id < 256) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else {
      throw Error(fmt::format("ByteLevel tokenizer: id {} is outside the vocabulary [0, 257)", id));
    }
  }
  return text;
}

}  // namespace parallel
