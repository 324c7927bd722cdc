// The op table (tests/common/op_cases.hpp) run as ggml's test-backend-ops runs its cases
// (docs/ops.md, "The op table"):
//
//   test_backend_ops            correctness: every row on the CPU against its fp64 reference, every
//                               row on CUDA against the CPU result where a GPU is present, every
//                               rejection row; then a summary (op x dtype x device: pass / FAIL /
//                               missing / skipped) on stdout. gtest flags work as usual.
//   test_backend_ops --speed [FILTER]
//                               speed: every row of the speed table (larger shapes) whose name
//                               contains FILTER, timed on the CPU and on CUDA where present, in
//                               GB/s (every argument's bytes, once) and GFLOP/s where counted.
//
// A CUDA row whose op throws "no CUDA kernel" is reported as missing, not failed: the table shows
// which ops still lack a 16-bit (or any) CUDA kernel.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "op_cases.hpp"
#include "parallel/device.hpp"
#include "parallel/error.hpp"

using namespace parallel;
using namespace parallel::testing::op_table;

namespace {

const std::vector<Row>& table() {
  static const std::vector<Row> rows = op_rows();
  return rows;
}

// Results for the summary, by row index.
struct Cell {
  std::string cpu = "not run", cuda = "not run";
};
std::map<size_t, Cell>& cells() {
  static std::map<size_t, Cell> c;
  return c;
}

std::string verdict_cell(const Verdict& v) {
  return v.ok ? fmt::format("pass {:.2f}", v.worst)
              : fmt::format("FAIL {}", v.worst > 1e9 ? "inf" : fmt::format("{:.3g}", v.worst));
}

// ---- correctness: CPU against the reference, one gtest case per row ---------------------------

class OpTable : public ::testing::TestWithParam<size_t> {};

TEST_P(OpTable, CpuMatchesReference) {
  const Row& row = table()[GetParam()];
  Cell& cell = cells()[GetParam()];
  try {
    Prepared run = row.prepare(Device::cpu());
    run.launch();
    const Verdict v = compare(run.outputs(), row.reference(), row.tol);
    cell.cpu = verdict_cell(v);
    EXPECT_TRUE(v.ok) << row.name() << ": " << v.detail;
  } catch (const std::exception& e) {
    cell.cpu = "FAIL (threw)";
    ADD_FAILURE() << row.name() << " threw: " << e.what();
  }
}

std::string row_test_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string n = fmt::format("{:03d}_{}", info.param, table()[info.param].name());
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

std::vector<size_t> row_indices() {
  std::vector<size_t> i(table().size());
  for (size_t k = 0; k < i.size(); k++) i[k] = k;
  return i;
}

INSTANTIATE_TEST_SUITE_P(Rows, OpTable, ::testing::ValuesIn(row_indices()), row_test_name);

// ---- correctness: CUDA against the CPU --------------------------------------------------------

TEST(OpTableCuda, MatchesCpu) {
  if (cuda_device_count() == 0) {
    for (size_t i = 0; i < table().size(); i++) cells()[i].cuda = "skipped (no GPU)";
    // As REQUIRE_GPU (gpu.hpp): where a GPU is expected, a missing one is a failure, not a skip.
    if (parallel::testing::gpu_required())
      GTEST_FAIL() << "no CUDA device visible, but PARALLEL_REQUIRE_GPU=1 says one is expected";
    GTEST_SKIP() << "no CUDA device: the CUDA column is skipped";
  }
  for (size_t i = 0; i < table().size(); i++) {
    const Row& row = table()[i];
    Cell& cell = cells()[i];
    Outputs want;
    try {
      Prepared cpu = row.prepare(Device::cpu());
      cpu.launch();
      want = cpu.outputs();
    } catch (const std::exception& e) {
      cell.cuda = "no CPU result";
      continue;
    }
    try {
      Prepared run = row.prepare(Device::cuda());
      run.launch();
      const Verdict v = compare(run.outputs(), want, row.cuda_tol);
      cell.cuda = verdict_cell(v);
      EXPECT_TRUE(v.ok) << row.name() << " on CUDA against the CPU: " << v.detail;
    } catch (const Error& e) {
      if (std::strstr(e.what(), "no CUDA kernel") != nullptr) {
        cell.cuda = "missing";
      } else {
        cell.cuda = "FAIL (threw)";
        ADD_FAILURE() << row.name() << " on CUDA threw: " << e.what();
      }
    } catch (const std::exception& e) {
      cell.cuda = "FAIL (threw)";
      ADD_FAILURE() << row.name() << " on CUDA threw: " << e.what();
    }
  }
}

// ---- rejections -------------------------------------------------------------------------------

TEST(OpTableRejections, WrongDtypesAreRefusedNamingOpAndArgument) {
  for (const Rejection& r : rejection_rows()) {
    const std::string op = "ops::" + r.op, arg = r.arg + " is";
    try {
      r.call();
      ADD_FAILURE() << r.op << " accepted " << r.what;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(op), std::string::npos)
          << r.what << ": the message does not name " << op << ": " << msg;
      EXPECT_NE(msg.find(arg), std::string::npos)
          << r.what << ": the message does not name " << r.arg << ": " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << r.op << " with " << r.what
                    << " threw something other than parallel::Error: " << e.what();
    }
  }
}

void print_summary() {
  if (cells().empty()) return;
  std::printf("\nop table: %zu rows (worst error as a fraction of the row's tolerance)\n", cells().size());
  // Which CPU kernels the rows ran (they depend on the CPU's ISA).
  std::printf("cpu kernels: gemm fp32 %s; gemm bf16 %s; attention bf16 %s\n",
              ops::gemm_implementation(DType::F32).c_str(), ops::gemm_implementation(DType::BF16).c_str(),
              ops::attention_implementation(DType::BF16, 64).c_str());
  std::printf("%-26s %-5s %-36s %-46s %-18s %-10s %s\n", "op", "dtype", "shape", "other arguments",
              "tolerance", "cpu", "cuda");
  int fails = 0, missing = 0;
  for (const auto& [i, c] : cells()) {
    const Row& r = table()[i];
    std::printf("%-26s %-5s %-36s %-46s %-18s %-10s %s\n", r.op.c_str(), dn(r.dtype), r.shape.c_str(),
                r.fixed.c_str(), r.tol.str().c_str(), c.cpu.c_str(), c.cuda.c_str());
    fails += c.cpu.starts_with("FAIL") + c.cuda.starts_with("FAIL");
    missing += c.cuda == "missing";
  }
  std::printf("%d FAIL, %d CUDA rows missing\n", fails, missing);
}

// ---- speed ------------------------------------------------------------------------------------

void sync(Device d) {
  if (d.is_cuda()) (void)Tensor::zeros({1}, DType::F32, d).to(Device::cpu());  // waits for the default stream
}

int speed(const char* filter) {
  std::vector<Device> devices{Device::cpu()};
  if (cuda_device_count() > 0) devices.push_back(Device::cuda());
  std::printf("%-27s %-5s %-40s %-8s %10s %10s %10s\n", "op", "dtype", "shape", "device", "us", "GB/s",
              "GFLOP/s");
  for (const Row& row : op_rows(/*speed=*/true)) {
    if (filter != nullptr && row.name().find(filter) == std::string::npos) continue;
    for (Device d : devices) {
      std::string cell;
      try {
        Prepared run = row.prepare(d);
        run.launch();  // warm-up (scratch buffers, prepacked weights, kernel loading)
        sync(d);
        int iters = 0;
        const auto start = std::chrono::steady_clock::now();
        double secs = 0;
        while (iters < 3 || secs < 0.2) {
          run.launch();
          iters++;
          sync(d);
          secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
        const double t = secs / iters;
        std::printf("%-27s %-5s %-40s %-8s %10.1f %10.2f %10s\n", row.op.c_str(), dn(row.dtype),
                    row.shape.c_str(), d.str().c_str(), t * 1e6, run.bytes / t / 1e9,
                    run.flops > 0 ? fmt::format("{:.1f}", run.flops / t / 1e9).c_str() : "-");
      } catch (const Error& e) {
        std::printf("%-27s %-5s %-40s %-8s %s\n", row.op.c_str(), dn(row.dtype), row.shape.c_str(),
                    d.str().c_str(), std::strstr(e.what(), "no CUDA kernel") ? "missing" : "threw");
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++)
    if (std::strcmp(argv[i], "--speed") == 0) return speed(i + 1 < argc ? argv[i + 1] : nullptr);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  print_summary();
  return rc;
}
