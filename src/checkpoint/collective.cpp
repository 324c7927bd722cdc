// The collective glue of save and load: every phase ends with all ranks agreeing that it worked,
// so that one rank's I/O error becomes an error on every rank instead of a hang in the next
// collective.
#include <cstring>
#include <exception>

#include "checkpoint/internal.hpp"

namespace parallel::checkpoint::detail {
namespace {

// Every rank's string, indexed by rank: all_gather of the lengths, then of the bytes padded to the
// longest (all_gather moves equal-sized chunks).
std::vector<std::string> all_gather_strings(Communicator& world, const std::string& mine) {
  const int n = world.size();
  Tensor len = Tensor::from_vector<int64_t>({static_cast<int64_t>(mine.size())}, {1});
  Tensor lens = Tensor::empty({n}, DType::I64);
  world.all_gather(len, lens);
  int64_t longest = 0;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lens.data<int64_t>()[r]);
  std::vector<std::string> out(static_cast<std::size_t>(n));
  if (longest == 0) return out;
  Tensor send = Tensor::zeros({longest}, DType::U8);
  if (!mine.empty()) std::memcpy(send.data_ptr(), mine.data(), mine.size());
  Tensor all = Tensor::empty({longest * n}, DType::U8);
  world.all_gather(send, all);
  const auto* bytes = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r)
    out[static_cast<std::size_t>(r)].assign(bytes + r * longest,
                                            static_cast<std::size_t>(lens.data<int64_t>()[r]));
  return out;
}

// parallel::Error as it is; anything else (std::filesystem_error, nlohmann's, bad_alloc) becomes a
// parallel::Error saying which phase it came from.
[[noreturn]] void rethrow_as_error(const std::exception_ptr& failure, const std::string& what,
                                   const std::string& message) {
  try {
    std::rethrow_exception(failure);
  } catch (const Error&) {
    throw;
  } catch (...) {
    throw Error(fmt::format("{} failed: {}", what, message));
  }
}

}  // namespace

std::vector<std::string> run_collectively(Communicator& world, const std::string& what,
                                          const std::function<std::string()>& body) {
  std::string result;
  std::exception_ptr failure;
  std::string message;
  try {
    result = body();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    message = e.what();
  }
  // One status byte ('+' ok, '-' failed), then the result or the error message.
  std::vector<std::string> all =
      all_gather_strings(world, (failure ? "-" : "+") + (failure ? message : result));
  for (int r = 0; r < world.size(); ++r) {
    const std::string& s = all[static_cast<std::size_t>(r)];
    if (!s.empty() && s[0] == '-') {
      if (failure) rethrow_as_error(failure, what, message);
      throw Error(fmt::format("{} failed on rank {}: {}", what, r, s.substr(1)));
    }
  }
  for (std::string& s : all) s.erase(0, 1);
  return all;
}

std::string broadcast_string(Communicator& world, const std::string& value, int root) {
  Tensor len = Tensor::from_vector<int64_t>({static_cast<int64_t>(value.size())}, {1});
  world.broadcast(len, root);
  const int64_t n = len.data<int64_t>()[0];
  if (n == 0) return {};
  Tensor bytes = Tensor::zeros({n}, DType::U8);
  if (world.rank() == root) std::memcpy(bytes.data_ptr(), value.data(), value.size());
  world.broadcast(bytes, root);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(n));
}

}  // namespace parallel::checkpoint::detail
