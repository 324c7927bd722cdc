#pragma once
// A small reader of TensorBoard event files for the tests, written apart from the writer
// (src/train/tensorboard.cpp) so that the two check each other: TFRecord framing with both masked
// CRC-32Cs checked, and the Event / Summary / SessionLog protobuf fields the writer uses decoded
// from the wire format (unknown fields are skipped, as protobuf does).
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "parallel/checkpoint.hpp"

namespace tfevents {

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  int session_status = 0;  // SessionLog.status (1: START); 0: no session_log
  bool has_summary = false;
  std::vector<std::pair<std::string, float>> scalars;  // Summary.value: tag, simple_value
};

struct File {
  std::vector<Event> events;
  std::size_t truncated_tail = 0;  // bytes after the last whole record (0: the file ends cleanly)
};

inline uint32_t masked(const char* p, std::size_t n) {
  const uint32_t crc = parallel::checkpoint::crc32c(p, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

inline uint64_t le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// Protobuf wire format: calls f(field, wire_type, varint_or_fixed, bytes) for each field of `msg`.
template <typename F>
void for_each_field(std::string_view msg, F&& f) {
  std::size_t at = 0;
  auto varint = [&]() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (at >= msg.size() || shift > 63) throw std::runtime_error("protobuf: bad varint");
      const auto b = static_cast<unsigned char>(msg[at++]);
      v |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (at < msg.size()) {
    const uint64_t key = varint();
    const auto field = static_cast<uint32_t>(key >> 3);
    const auto type = static_cast<uint32_t>(key & 7);
    uint64_t number = 0;
    std::string_view bytes;
    if (type == 0) {
      number = varint();
    } else if (type == 1 || type == 5) {
      const int n = type == 1 ? 8 : 4;
      if (at + n > msg.size()) throw std::runtime_error("protobuf: truncated fixed field");
      number = le(msg.data() + at, n);
      at += n;
    } else if (type == 2) {
      const uint64_t n = varint();
      if (n > msg.size() - at) throw std::runtime_error("protobuf: truncated length-delimited field");
      bytes = msg.substr(at, n);
      at += n;
    } else {
      throw std::runtime_error("protobuf: unsupported wire type " + std::to_string(type));
    }
    f(field, type, number, bytes);
  }
}

inline Event decode_event(std::string_view data) {
  Event e;
  for_each_field(data, [&](uint32_t field, uint32_t type, uint64_t number, std::string_view bytes) {
    if (field == 1 && type == 1) {
      std::memcpy(&e.wall_time, &number, 8);
    } else if (field == 2 && type == 0) {
      e.step = static_cast<int64_t>(number);
    } else if (field == 3 && type == 2) {
      e.file_version = bytes;
    } else if (field == 7 && type == 2) {
      for_each_field(bytes, [&](uint32_t f, uint32_t t, uint64_t n, std::string_view) {
        if (f == 1 && t == 0) e.session_status = static_cast<int>(n);
      });
    } else if (field == 5 && type == 2) {
      e.has_summary = true;
      for_each_field(bytes, [&](uint32_t f, uint32_t t, uint64_t, std::string_view value) {
        if (f != 1 || t != 2) return;
        std::pair<std::string, float> scalar{"", 0.0f};
        bool simple = false;
        for_each_field(value, [&](uint32_t vf, uint32_t vt, uint64_t n, std::string_view b) {
          if (vf == 1 && vt == 2) scalar.first = b;
          if (vf == 2 && vt == 5) {
            const auto bits = static_cast<uint32_t>(n);
            std::memcpy(&scalar.second, &bits, 4);
            simple = true;
          }
        });
        if (simple) e.scalars.push_back(scalar);
      });
    }
  });
  return e;
}

// Reads every whole record of `path`; a CRC mismatch or a bad Event throws std::runtime_error. An
// incomplete last record is not an error (TensorBoard waits for the rest): it is counted in
// truncated_tail.
inline File read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  File out;
  std::size_t at = 0;
  while (at < text.size()) {
    const char* p = text.data() + at;
    const std::size_t left = text.size() - at;
    if (left < 12) break;
    const uint64_t length = le(p, 8);
    if (static_cast<uint32_t>(le(p + 8, 4)) != masked(p, 8))
      throw std::runtime_error(path + ": bad length CRC at byte " + std::to_string(at));
    if (length > left - 12 || left - 12 - length < 4) break;
    if (static_cast<uint32_t>(le(p + 12 + length, 4)) != masked(p + 12, length))
      throw std::runtime_error(path + ": bad data CRC at byte " + std::to_string(at));
    out.events.push_back(decode_event(std::string_view(p + 12, length)));
    at += 16 + length;
  }
  out.truncated_tail = text.size() - at;
  return out;
}

}  // namespace tfevents
