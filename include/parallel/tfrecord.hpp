#pragma once
// TFRecord framing, the container of TensorBoard's event files (and of TensorFlow's record files).
// Each record is
//   uint64 length | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// all little-endian. The mask (rotate right by 15, add 0xa282ead8) is TensorFlow's, so that a CRC
// stored inside data that is itself checksummed does not cancel out.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace parallel {

// TensorFlow's masked CRC-32C (checkpoint::crc32c, masked).
uint32_t masked_crc32c(const void* data, std::size_t size);

// The bytes of one record holding `data`: 16 bytes of framing around it.
std::string tfrecord(std::string_view data);

}  // namespace parallel
