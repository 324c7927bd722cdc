// CRC-32C (Castagnoli polynomial, reflected 0x82F63B78): the checksum of every checkpoint file.
// Chosen over SHA-256 because it only has to catch storage corruption and truncation, not
// tampering, and x86's SSE4.2 computes it at memory speed (the files are gigabytes).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "parallel/checkpoint.hpp"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace parallel::checkpoint {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zero bytes.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b)
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
};
constexpr Tables kTables;

uint32_t update_portable(uint32_t c, const unsigned char* p, std::size_t n) {
  const auto& t = kTables.t;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian host (as the safetensors code assumes)
    const uint32_t lo = static_cast<uint32_t>(word) ^ c;
    const auto hi = static_cast<uint32_t>(word >> 32);
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t update_sse42(uint32_t c, const unsigned char* p, std::size_t n) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c64 = _mm_crc32_u64(c64, word);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<uint32_t>(c64);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

uint32_t crc32c_portable(const void* data, std::size_t size, uint32_t crc) {
  return ~update_portable(~crc, static_cast<const unsigned char*>(data), size);
}

uint32_t crc32c(const void* data, std::size_t size, uint32_t crc) {
#if defined(__x86_64__)
  if (have_sse42()) return ~update_sse42(~crc, static_cast<const unsigned char*>(data), size);
#endif
  return crc32c_portable(data, size, crc);
}

}  // namespace parallel::checkpoint
