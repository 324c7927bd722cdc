#pragma once
// Unicode Normalization Form C of UTF-8 text (src/data/unicode_nfc.cpp). Internal to the library.
#include <string>
#include <string_view>

namespace parallel {

// NFC of `text`; bytes that are not valid UTF-8 are kept as they are.
std::string unicode_nfc(std::string_view text);

}  // namespace parallel
