#pragma once
// The one-line message of the error `run` throws (an E), or "<no error>" when it throws nothing:
// every refusal of bad input is one line (README: "Bad input gets a clear error"), so a message
// with a line break fails the test that asked for it.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "parallel/error.hpp"

namespace parallel::testing {

template <typename E = Error>
std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const E& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  return "<no error>";
}

}  // namespace parallel::testing
