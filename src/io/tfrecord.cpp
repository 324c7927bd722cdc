// TFRecord framing (include/parallel/tfrecord.hpp).
#include "parallel/tfrecord.hpp"

#include "parallel/checkpoint.hpp"

namespace parallel {
namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

uint32_t masked_crc32c(const void* data, std::size_t size) {
  const uint32_t crc = checkpoint::crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out.append(data);
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

}  // namespace parallel
