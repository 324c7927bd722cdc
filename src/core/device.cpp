#include "parallel/device.hpp"

#include <fmt/format.h>

namespace parallel {

std::string Device::str() const {
  return type == DeviceType::CPU ? std::string("cpu") : fmt::format("cuda:{}", index);
}

}  // namespace parallel
