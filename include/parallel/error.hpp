#pragma once
// Errors: every failed check throws parallel::Error carrying file:line, rank and host, so that the
// top level (see runtime.hpp) can log it once and end the whole job instead of leaving peers hung.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace parallel {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A configuration problem: thrown before any rank starts work; the message names key, value, rule.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A stop every rank decides alike, at the same point, from values they share (the training guard's
// stop on a non-finite loss, training_guard.hpp): the top level prints the message once, from rank
// 0, and every rank returns `exit_code` without aborting the job (runtime.hpp).
class AgreedStop : public Error {
 public:
  AgreedStop(const std::string& message, int exit_code) : Error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// "file:line [rank R on HOST]: message". The rank is the one set_error_context() recorded (or "?").
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
void set_error_context(int rank, const std::string& host);
std::string error_location(const char* file, int line);

}  // namespace parallel

#define PARALLEL_CHECK(cond, ...)                                                                   \
  do {                                                                                              \
    if (!(cond)) [[unlikely]]                                                                       \
      ::parallel::throw_error(__FILE__, __LINE__,                                                   \
                              std::string("check failed: " #cond ": ") + fmt::format(__VA_ARGS__)); \
  } while (0)

#define PARALLEL_FAIL(...) ::parallel::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__))

// Checks an MPI return code (MPI_ERRORS_RETURN is set on every communicator we create).
#define PARALLEL_MPI_CHECK(call)                                                        \
  do {                                                                                  \
    int parallel_mpi_rc_ = (call);                                                      \
    if (parallel_mpi_rc_ != 0) [[unlikely]]                                             \
      ::parallel::detail::throw_mpi_error(__FILE__, __LINE__, #call, parallel_mpi_rc_); \
  } while (0)

namespace parallel::detail {
[[noreturn]] void throw_mpi_error(const char* file, int line, const char* call, int rc);
}
