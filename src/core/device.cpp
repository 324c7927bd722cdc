#include "parallel/device.hpp"

#include <fmt/format.h>

namespace parallel {

std::string Device::str() const {
  if (type == DeviceType::Meta) return "meta";
  return type == DeviceType::CPU ? std::string("cpu") : fmt::format("cuda:{}", index);
}

}  // namespace parallel
