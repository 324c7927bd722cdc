// HardwareDescription (hardware.hpp): YAML in, validated, YAML out.
#include "parallel/hardware.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "parallel/error.hpp"

namespace parallel {

double HardwareDescription::matmul_efficiency_at(double size, DType dtype) const {
  auto it = matmul_efficiency.find(dtype);
  if (it == matmul_efficiency.end()) it = matmul_efficiency.find(DType::F32);
  if (it == matmul_efficiency.end() || it->second.empty()) return 1.0;
  const EfficiencyCurve& curve = it->second;
  if (size <= curve.front().first) return curve.front().second;
  if (size >= curve.back().first) return curve.back().second;
  for (std::size_t i = 1; i < curve.size(); ++i) {
    const auto [x1, y1] = curve[i];
    if (size > x1) continue;
    const auto [x0, y0] = curve[i - 1];
    const double t = std::log(size / x0) / std::log(x1 / x0);
    return y0 + t * (y1 - y0);
  }
  return curve.back().second;
}

double HardwareDescription::matmul_flops(DType dtype) const {
  auto it = matmul_tflops.find(dtype);
  if (it == matmul_tflops.end()) it = matmul_tflops.find(DType::F32);
  return it == matmul_tflops.end() ? 0.0 : it->second * 1e12;
}

double HardwareDescription::op_tflops_for(const std::string& op, DType dtype) const {
  for (DType t : {dtype, DType::F32}) {
    const auto rates = op_tflops.find(t);
    if (rates == op_tflops.end()) continue;
    if (const auto it = rates->second.find(op); it != rates->second.end()) return it->second;
  }
  return 0.0;
}

double HardwareDescription::op_fixed_s(const std::string& op, double units) const {
  const auto it = op_fixed_us.find(op);
  return it == op_fixed_us.end() ? 0.0 : it->second * 1e-6 * units;
}

// The measured communication terms (calibrate_machine): small collectives by group size, and the
// wait of a rank that time-shares its device.
namespace {

// Linear between the points, flat beyond the ends.
double interpolate(const std::vector<std::pair<double, double>>& table, double x) {
  if (x <= table.front().first) return table.front().second;
  for (std::size_t i = 1; i < table.size(); ++i) {
    const auto [x1, y1] = table[i];
    if (x > x1) continue;
    const auto [x0, y0] = table[i - 1];
    return y0 + (x - x0) / (x1 - x0) * (y1 - y0);
  }
  return table.back().second;
}

// A curve by ranks per device measured from 2 up, read at x: one rank per device is the calibrated
// case, so the curve starts at (1, at_one).
double from_one_rank(double at_one, const std::vector<std::pair<double, double>>& points, double x) {
  std::vector<std::pair<double, double>> table{{1.0, at_one}};
  table.insert(table.end(), points.begin(), points.end());
  return interpolate(table, x);
}

std::string table_yaml(const std::vector<std::pair<double, double>>& table) {
  std::string out = "[";
  for (std::size_t i = 0; i < table.size(); ++i)
    out += fmt::format("{}[{:.10g}, {:.4g}]", i == 0 ? "" : ", ", table[i].first, table[i].second);
  return out + "]";
}

// links.*.bus_GBps as `, bus_GBps: {...}` (nothing when empty): the single forms where they say
// the same (fp32 alone: no dtype level; group size 2 alone: a plain list).
std::string bus_tables_yaml(const std::map<DType, LinkLevel::BusTables>& bus) {
  if (bus.empty()) return "";
  const auto kinds_yaml = [](const LinkLevel::BusTables& kinds) {
    std::string s = "{";
    for (const auto& [kind, by_size] : kinds) {
      s += fmt::format("{}{}: ", s.size() == 1 ? "" : ", ", kind);
      if (by_size.size() == 1 && by_size.count(2)) {
        s += table_yaml(by_size.at(2));
        continue;
      }
      std::string sizes = "{";
      for (const auto& [ranks, t] : by_size)
        sizes += fmt::format("{}{}: {}", sizes.size() == 1 ? "" : ", ", ranks, table_yaml(t));
      s += sizes + "}";
    }
    return s + "}";
  };
  if (bus.size() == 1 && bus.count(DType::F32)) return ", bus_GBps: " + kinds_yaml(bus.at(DType::F32));
  std::string s;
  for (const auto& [dtype, kinds] : bus)
    s += fmt::format("{}{}: {}", s.empty() ? "" : ", ", dtype_name(dtype), kinds_yaml(kinds));
  return ", bus_GBps: {" + s + "}";
}

}  // namespace

double LinkLevel::collective_latency_s(const std::string& kind, int n) const {
  const auto it = collective_us.find(kind);
  if (it == collective_us.end() || it->second.empty()) return -1;
  const auto& table = it->second;
  // Beyond the largest measured group: the latency grows as the ring's n - 1 steps.
  const auto [n_last, us_last] = table.back();
  if (n > n_last && n_last > 1) return us_last * (n - 1) / (n_last - 1) * 1e-6;
  return interpolate(table, n) * 1e-6;
}

namespace {

// One bus-bandwidth table's GB/s at `bytes`: linear in log(bytes) between the sizes (they span four
// orders of magnitude), flat beyond the ends.
double bus_GBps_at(const LinkLevel::BusTable& t, double bytes) {
  if (bytes <= t.front().first) return t.front().second;
  for (std::size_t i = 1; i < t.size(); ++i) {
    const auto [x1, y1] = t[i];
    if (bytes > x1) continue;
    const auto [x0, y0] = t[i - 1];
    const double f = std::log(bytes / x0) / std::log(x1 / x0);
    return y0 + f * (y1 - y0);
  }
  return t.back().second;
}

}  // namespace

double LinkLevel::bus_bandwidth_Bps(const std::string& kind, double bytes, int ranks, DType dtype) const {
  std::string table_kind = kind;
  if (kind == "all_to_all" || kind == "all_to_allv" || kind == "broadcast") table_kind = "all_gather";
  if (kind == "recv" || kind == "batch_p2p") table_kind = "send";
  // The dtype's tables for this kind, else fp32's (a kind moves bytes the same in any dtype unless
  // a reduction runs on them: the calibration measures 16-bit tables for the reductions only).
  const std::map<int, BusTable>* by_size = nullptr;
  for (DType t : {dtype, DType::F32}) {
    const auto tables = bus_GBps.find(t);
    if (tables == bus_GBps.end()) continue;
    if (const auto it = tables->second.find(table_kind); it != tables->second.end() && !it->second.empty()) {
      by_size = &it->second;
      break;
    }
  }
  if (by_size == nullptr) return bandwidth_GBps * 1e9 / shared_by;
  // By group size: the nearest measured size's outside the measured range, linear between sizes.
  const auto above = by_size->lower_bound(ranks);
  if (above == by_size->begin()) return bus_GBps_at(above->second, bytes) * 1e9;
  if (above == by_size->end()) return bus_GBps_at(by_size->rbegin()->second, bytes) * 1e9;
  if (above->first == ranks) return bus_GBps_at(above->second, bytes) * 1e9;
  const auto below = std::prev(above);
  const double f = static_cast<double>(ranks - below->first) / (above->first - below->first);
  const double lo = bus_GBps_at(below->second, bytes), hi = bus_GBps_at(above->second, bytes);
  return (lo + f * (hi - lo)) * 1e9;
}

double HardwareDescription::oversubscribed_wait_s(double ranks_per_device) const {
  if (ranks_per_device <= 1 || oversubscribed_wait_us.empty()) return 0;
  // One rank per device waits for nothing.
  return from_one_rank(0.0, oversubscribed_wait_us, ranks_per_device) * 1e-6;
}

double HardwareDescription::subgroup_wait_s(double ranks_per_device) const {
  if (subgroup_wait_us.empty()) return oversubscribed_wait_s(ranks_per_device);
  if (ranks_per_device <= 1) return 0;
  return from_one_rank(0.0, subgroup_wait_us, ranks_per_device) * 1e-6;
}

double HardwareDescription::shared_core_slowdown_at(double ranks_per_device, double bytes) const {
  if (ranks_per_device <= 1 || shared_core_slowdown.empty()) return 1;
  // One rank per device runs at the calibrated rate: each curve starts at (1, 1).
  const auto at = [ranks_per_device](const SlowdownCurve& curve) {
    return from_one_rank(1.0, curve, ranks_per_device);
  };
  // By working set: linear in log(bytes) between the measured sizes (they span orders of
  // magnitude), the nearest size's beyond them (a single curve serves every size).
  const auto above = shared_core_slowdown.lower_bound(bytes);
  if (above == shared_core_slowdown.begin()) return at(above->second);
  if (above == shared_core_slowdown.end()) return at(shared_core_slowdown.rbegin()->second);
  const auto below = std::prev(above);
  const double f = std::log(bytes / below->first) / std::log(above->first / below->first);
  const double lo = at(below->second), hi = at(above->second);
  return lo + f * (hi - lo);
}

namespace {

struct Reader {
  std::string file;

  [[noreturn]] void fail(const std::string& key, const std::string& rule) const {
    throw ConfigError(fmt::format("{}: {} {}", file, key, rule));
  }
  void only_keys(const YAML::Node& map, const std::string& where, std::set<std::string> allowed) const {
    if (!map.IsMap()) fail(where.empty() ? "the document" : where, "must be a mapping");
    for (const auto& kv : map) {
      const auto key = kv.first.as<std::string>();
      if (!allowed.count(key)) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        fail(where.empty() ? key : where + "." + key, "is not a known key (known: " + list + ")");
      }
    }
  }
  const YAML::Node need(const YAML::Node& map, const std::string& where, const std::string& key) const {
    const YAML::Node n = map[key];
    if (!n) fail(where.empty() ? key : where + "." + key, "is missing");
    return n;
  }
  double number(const YAML::Node& n, const std::string& key, double min_exclusive,
                bool allow_equal = false) const {
    double v = 0;
    try {
      v = n.as<double>();
    } catch (const YAML::Exception&) {
      fail(key, fmt::format("must be a number {} {}, got '{}'", allow_equal ? ">=" : ">", min_exclusive,
                            n.IsScalar() ? n.Scalar() : std::string("(not a scalar)")));
    }
    if (!std::isfinite(v) || (allow_equal ? v < min_exclusive : v <= min_exclusive))
      fail(key, fmt::format("must be a number {} {}, got {}", allow_equal ? ">=" : ">", min_exclusive, v));
    return v;
  }
  // A per-dtype map's key: a floating dtype (an integer one has no matmul rate or kernel of its own).
  DType dtype_key(const std::string& name, const std::string& key) const {
    DType t{};
    try {
      t = dtype_from_name(name);
    } catch (const Error&) {
      fail(key, "is not a dtype (fp32, bf16, fp16, fp8_e4m3)");
    }
    if (!is_floating(t)) fail(key, "is not a floating dtype (fp32, bf16, fp16, fp8_e4m3)");
    return t;
  }
  bool is_dtype_name(const std::string& name) const {
    try {
      (void)dtype_from_name(name);
      return true;
    } catch (const Error&) {
      return false;
    }
  }
  HardwareDescription::EfficiencyCurve curve(const YAML::Node& eff, const std::string& where) const {
    if (!eff.IsSequence() || eff.size() == 0)
      fail(where, "must be a list of [gemm size, fraction of peak] pairs");
    HardwareDescription::EfficiencyCurve c;
    double last = 0;
    for (std::size_t i = 0; i < eff.size(); ++i) {
      const std::string key = fmt::format("{}[{}]", where, i);
      if (!eff[i].IsSequence() || eff[i].size() != 2)
        fail(key, "must be a pair [gemm size, fraction of peak]");
      const double size = number(eff[i][0], key + "[0]", 0);
      const double frac = number(eff[i][1], key + "[1]", 0);
      if (frac > 1) fail(key + "[1]", fmt::format("is a fraction of peak and must be <= 1, got {}", frac));
      if (size <= last) fail(key + "[0]", fmt::format("sizes must increase, got {} after {}", size, last));
      last = size;
      c.emplace_back(size, frac);
    }
    return c;
  }
  std::map<std::string, double> op_rates(const YAML::Node& ops, const std::string& where) const {
    std::map<std::string, double> rates;
    for (const auto& kv : ops) {
      const auto op = kv.first.as<std::string>();
      if (is_dtype_name(op))
        fail(where + "." + op,
             "is a dtype: give either {op: TFLOP/s} for every dtype or {dtype: {op: TFLOP/s}}");
      rates[op] = number(kv.second, where + "." + op, 0);
    }
    return rates;
  }
  // [[x, y], ...] with x increasing and > x_min, y >= 0.
  std::vector<std::pair<double, double>> table(const YAML::Node& n, const std::string& key, double x_min,
                                               const std::string& what) const {
    if (!n.IsSequence() || n.size() == 0) fail(key, "must be a list of [" + what + "] pairs");
    std::vector<std::pair<double, double>> out;
    for (std::size_t i = 0; i < n.size(); ++i) {
      const std::string k = fmt::format("{}[{}]", key, i);
      if (!n[i].IsSequence() || n[i].size() != 2) fail(k, "must be a pair [" + what + "]");
      const double x = number(n[i][0], k + "[0]", x_min);
      const double y = number(n[i][1], k + "[1]", 0, true);
      if (!out.empty() && x <= out.back().first)
        fail(k + "[0]", fmt::format("must increase, got {} after {}", x, out.back().first));
      out.emplace_back(x, y);
    }
    return out;
  }
  // links.*.bus_GBps: {kind: tables} (every dtype: fp32's), or {dtype: {kind: tables}} with fp32;
  // a kind's tables are one [[bytes, GB/s], ...] list (group size 2's: every size), or
  // {group size: list, ...}.
  std::map<DType, LinkLevel::BusTables> bus_tables(const YAML::Node& c, const std::string& key) const {
    if (!c.IsMap() || c.size() == 0)
      fail(key,
           "must map collective kinds to [[message bytes, GB/s], ...] (all_reduce: [[65536, 1.2]]), "
           "or dtypes to such maps (bf16: {...})");
    bool per_dtype = false, per_kind = false;
    for (const auto& kv : c) (is_dtype_name(kv.first.as<std::string>()) ? per_dtype : per_kind) = true;
    std::map<DType, LinkLevel::BusTables> out;
    if (!per_dtype) {
      out[DType::F32] = bus_kinds(c, key);
      return out;
    }
    for (const auto& kv : c) {
      const auto name = kv.first.as<std::string>();
      const std::string k = key + "." + name;
      if (!is_dtype_name(name))
        fail(k, "is not a dtype: a per-dtype bus_GBps maps every key to {kind: tables} (fp32, bf16, fp16)");
      const DType dtype = dtype_key(name, k);
      out[dtype] = bus_kinds(kv.second, k);
    }
    if (!out.count(DType::F32)) fail(key + ".fp32", "is missing (the fallback tables of a per-dtype map)");
    return out;
  }
  LinkLevel::BusTables bus_kinds(const YAML::Node& c, const std::string& key) const {
    only_keys(c, key, {"all_reduce", "all_gather", "reduce_scatter", "send"});
    LinkLevel::BusTables out;
    for (const auto& kv : c) {
      const auto kind = kv.first.as<std::string>();
      const std::string k = key + "." + kind;
      if (kv.second.IsMap()) {
        if (kv.second.size() == 0) fail(k, "must map group sizes (> 1) to [[message bytes, GB/s], ...]");
        for (const auto& size_table : kv.second) {
          const std::string name = size_table.first.as<std::string>();
          const std::string ks = k + "." + name;
          double ranks = 0;
          try {
            ranks = size_table.first.as<double>();
          } catch (const YAML::Exception&) {
          }
          if (!(ranks > 1) || ranks != std::floor(ranks))
            fail(ks, "is not a group size (a whole number > 1 of ranks the table was measured on)");
          out[kind][static_cast<int>(ranks)] = bus_table(size_table.second, ks);
        }
      } else {
        out[kind][2] = bus_table(kv.second, k);
      }
    }
    return out;
  }
  LinkLevel::BusTable bus_table(const YAML::Node& n, const std::string& key) const {
    auto t = table(n, key, 0, "message bytes > 0, GB/s > 0");
    for (std::size_t i = 0; i < t.size(); ++i)
      if (t[i].second <= 0)
        fail(fmt::format("{}[{}][1]", key, i),
             fmt::format("must be a number > 0 (GB/s), got {}", t[i].second));
    return t;
  }
  LinkLevel link(const YAML::Node& n, const std::string& where) const {
    only_keys(n, where,
              {"bandwidth_GBps", "latency_us", "shared_by", "collective_us", "bus_GBps", "async_progress"});
    LinkLevel l;
    l.bandwidth_GBps = number(need(n, where, "bandwidth_GBps"), where + ".bandwidth_GBps", 0);
    l.latency_us = number(need(n, where, "latency_us"), where + ".latency_us", 0, true);
    if (n["shared_by"]) {
      const double s = number(n["shared_by"], where + ".shared_by", 1, true);
      if (s != std::floor(s))
        fail(where + ".shared_by", fmt::format("must be a whole number >= 1, got {}", s));
      l.shared_by = static_cast<int>(s);
    }
    if (const YAML::Node c = n["collective_us"]) {
      const std::string key = where + ".collective_us";
      only_keys(c, key, {"all_reduce", "all_gather", "reduce_scatter"});
      for (const auto& kv : c) {
        const auto kind = kv.first.as<std::string>();
        l.collective_us[kind] = table(kv.second, key + "." + kind, 1, "group size > 1, microseconds");
      }
    }
    if (const YAML::Node c = n["bus_GBps"]) l.bus_GBps = bus_tables(c, where + ".bus_GBps");
    if (const YAML::Node a = n["async_progress"]) {
      const std::string key = where + ".async_progress";
      if (!a.IsScalar() || (a.Scalar() != "true" && a.Scalar() != "false"))
        fail(key,
             fmt::format("must be true or false, got '{}'", a.IsScalar() ? a.Scalar() : "(not a scalar)"));
      l.async_progress = a.Scalar() == "true";
    }
    return l;
  }
};

}  // namespace

HardwareDescription parse_hardware(const std::string& yaml_text, const std::string& file_name) {
  const Reader r{file_name};
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: not valid YAML: {}", file_name, e.what()));
  }
  r.only_keys(root, "", {"name", "device", "node", "links"});
  HardwareDescription hw;
  hw.file = file_name;
  hw.name = r.need(root, "", "name").as<std::string>();
  const YAML::Node dev = r.need(root, "", "device");
  r.only_keys(dev, "device",
              {"matmul_tflops", "matmul_efficiency", "vector_tflops", "op_tflops", "memory_bandwidth_GBps",
               "op_overhead_us", "op_fixed_us", "host_us_per_op", "memory_GiB"});
  const YAML::Node mm = r.need(dev, "device", "matmul_tflops");
  if (!mm.IsMap() || mm.size() == 0) r.fail("device.matmul_tflops", "must map dtypes to TFLOP/s (fp32: 156)");
  for (const auto& kv : mm) {
    const auto name = kv.first.as<std::string>();
    DType t{};
    try {
      t = dtype_from_name(name);
    } catch (const Error&) {
      r.fail("device.matmul_tflops." + name, "is not a dtype (fp32, bf16, fp16, fp8_e4m3)");
    }
    hw.matmul_tflops[t] = r.number(kv.second, "device.matmul_tflops." + name, 0);
  }
  if (!hw.matmul_tflops.count(DType::F32))
    r.fail("device.matmul_tflops.fp32", "is missing (the fallback rate)");
  // matmul_efficiency and op_tflops: one for every dtype (stored as fp32's, the fallback), or a
  // map of dtypes to one each.
  if (const YAML::Node eff = dev["matmul_efficiency"]) {
    if (eff.IsMap()) {
      for (const auto& kv : eff) {
        const auto name = kv.first.as<std::string>();
        const std::string key = "device.matmul_efficiency." + name;
        hw.matmul_efficiency[r.dtype_key(name, key)] = r.curve(kv.second, key);
      }
      if (!hw.matmul_efficiency.count(DType::F32))
        r.fail("device.matmul_efficiency.fp32", "is missing (the fallback curve of a per-dtype map)");
    } else {
      if (!eff.IsSequence())
        r.fail("device.matmul_efficiency",
               "must be a list of [gemm size, fraction of peak] pairs, or map dtypes to such lists");
      hw.matmul_efficiency[DType::F32] = r.curve(eff, "device.matmul_efficiency");
    }
  }
  hw.vector_tflops = r.number(r.need(dev, "device", "vector_tflops"), "device.vector_tflops", 0);
  if (const YAML::Node ops = dev["op_tflops"]) {
    if (!ops.IsMap())
      r.fail("device.op_tflops",
             "must map op names to TFLOP/s (gelu_forward: 0.001), or dtypes to such maps (bf16: {...})");
    bool per_dtype = false;  // the per-dtype form: maps as values
    for (const auto& kv : ops) per_dtype = per_dtype || kv.second.IsMap();
    if (per_dtype) {
      for (const auto& kv : ops) {
        const auto name = kv.first.as<std::string>();
        const std::string key = "device.op_tflops." + name;
        if (!r.is_dtype_name(name))
          r.fail(key, "is not a dtype: a per-dtype op_tflops maps every key to {op: TFLOP/s}");
        if (!kv.second.IsMap()) r.fail(key, "must map op names to TFLOP/s (gelu_forward: 0.001)");
        hw.op_tflops[r.dtype_key(name, key)] = r.op_rates(kv.second, key);
      }
    } else {
      hw.op_tflops[DType::F32] = r.op_rates(ops, "device.op_tflops");
    }
  }
  hw.memory_bandwidth_GBps =
      r.number(r.need(dev, "device", "memory_bandwidth_GBps"), "device.memory_bandwidth_GBps", 0);
  hw.op_overhead_us = r.number(r.need(dev, "device", "op_overhead_us"), "device.op_overhead_us", 0, true);
  if (const YAML::Node host = dev["host_us_per_op"])
    hw.host_us_per_op = r.number(host, "device.host_us_per_op", 0, true);
  if (const YAML::Node fixed = dev["op_fixed_us"]) {
    if (!fixed.IsMap())
      r.fail("device.op_fixed_us", "must map op names to microseconds per call (attention_forward: 5)");
    for (const auto& kv : fixed) {
      const auto op = kv.first.as<std::string>();
      if (kv.second.IsMap())
        r.fail("device.op_fixed_us." + op, "must be a number of microseconds (one map serves every dtype)");
      hw.op_fixed_us[op] = r.number(kv.second, "device.op_fixed_us." + op, 0, true);
    }
  }
  if (dev["memory_GiB"]) hw.memory_GiB = r.number(dev["memory_GiB"], "device.memory_GiB", 0);
  const YAML::Node node = r.need(root, "", "node");
  r.only_keys(node, "node",
              {"devices", "oversubscribed_wait_us", "subgroup_wait_us", "shared_core_slowdown"});
  const double devices = r.number(r.need(node, "node", "devices"), "node.devices", 1, true);
  if (devices != std::floor(devices))
    r.fail("node.devices", fmt::format("must be a whole number >= 1, got {}", devices));
  hw.devices_per_node = static_cast<int>(devices);
  if (const YAML::Node w = node["oversubscribed_wait_us"])
    hw.oversubscribed_wait_us =
        r.table(w, "node.oversubscribed_wait_us", 1, "ranks per device > 1, microseconds");
  if (const YAML::Node w = node["subgroup_wait_us"])
    hw.subgroup_wait_us = r.table(w, "node.subgroup_wait_us", 1, "ranks per device > 1, microseconds");
  if (const YAML::Node f = node["shared_core_slowdown"]) {
    const auto curve = [&r](const YAML::Node& n, const std::string& key) {
      auto t = r.table(n, key, 1, "ranks per device > 1, factor >= 1");
      for (std::size_t i = 0; i < t.size(); ++i)
        if (t[i].second < 1)
          r.fail(fmt::format("{}[{}][1]", key, i), fmt::format("must be a factor >= 1, got {}", t[i].second));
      return t;
    };
    // One list (every working set: the entry at 0 bytes), or {working-set bytes: list, ...}.
    if (f.IsMap()) {
      if (f.size() == 0)
        r.fail("node.shared_core_slowdown",
               "must map working-set bytes to [[ranks per device, factor], ...] lists, or be one such list");
      for (const auto& kv : f) {
        const std::string key = "node.shared_core_slowdown." + kv.first.as<std::string>();
        double bytes = -1;
        try {
          bytes = kv.first.as<double>();
        } catch (const YAML::Exception&) {
        }
        if (!std::isfinite(bytes) || bytes <= 0)
          r.fail(key, fmt::format("must be keyed by an op's working set in bytes > 0, got '{}'",
                                  kv.first.as<std::string>()));
        if (hw.shared_core_slowdown.count(bytes)) r.fail(key, "is given twice");
        hw.shared_core_slowdown[bytes] = curve(kv.second, key);
      }
    } else {
      hw.shared_core_slowdown[0] = curve(f, "node.shared_core_slowdown");
    }
  }
  const YAML::Node links = r.need(root, "", "links");
  r.only_keys(links, "links", {"node", "cluster"});
  hw.node_link = r.link(r.need(links, "links", "node"), "links.node");
  hw.cluster_link = r.link(r.need(links, "links", "cluster"), "links.cluster");
  return hw;
}

HardwareDescription load_hardware(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) throw ConfigError(fmt::format("hardware description {}: cannot open it", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hardware(ss.str(), path);
}

std::string hardware_yaml(const HardwareDescription& hw, const std::string& comment) {
  std::string out;
  if (!comment.empty()) {
    std::stringstream ss(comment);
    std::string line;
    while (std::getline(ss, line)) out += "# " + line + "\n";
  }
  out += fmt::format("name: {}\ndevice:\n  matmul_tflops: {{", hw.name);
  bool first = true;
  for (const auto& [t, v] : hw.matmul_tflops) {
    out += fmt::format("{}{}: {:.6g}", first ? "" : ", ", dtype_name(t), v);
    first = false;
  }
  out += "}\n";
  // One curve (or one map of rates) is written as the single form, which means the same.
  const auto curve_yaml = [](const HardwareDescription::EfficiencyCurve& c) {
    std::string s = "[";
    for (std::size_t i = 0; i < c.size(); ++i)
      s += fmt::format("{}[{:.6g}, {:.4g}]", i == 0 ? "" : ", ", c[i].first, c[i].second);
    return s + "]";
  };
  const auto rates_yaml = [](const std::map<std::string, double>& rates) {
    std::string s = "{";
    for (const auto& [op, v] : rates) s += fmt::format("{}{}: {:.6g}", s.size() == 1 ? "" : ", ", op, v);
    return s + "}";
  };
  if (hw.matmul_efficiency.size() == 1 && hw.matmul_efficiency.count(DType::F32)) {
    out += "  matmul_efficiency: " + curve_yaml(hw.matmul_efficiency.at(DType::F32)) + "\n";
  } else if (!hw.matmul_efficiency.empty()) {
    out += "  matmul_efficiency:\n";
    for (const auto& [t, c] : hw.matmul_efficiency)
      out += fmt::format("    {}: {}\n", dtype_name(t), curve_yaml(c));
  }
  out += fmt::format("  vector_tflops: {:.6g}\n", hw.vector_tflops);
  if (hw.op_tflops.size() == 1 && hw.op_tflops.count(DType::F32)) {
    out += "  op_tflops: " + rates_yaml(hw.op_tflops.at(DType::F32)) + "\n";
  } else if (!hw.op_tflops.empty()) {
    out += "  op_tflops:\n";
    for (const auto& [t, rates] : hw.op_tflops)
      out += fmt::format("    {}: {}\n", dtype_name(t), rates_yaml(rates));
  }
  out += fmt::format("  memory_bandwidth_GBps: {:.6g}\n  op_overhead_us: {:.6g}\n", hw.memory_bandwidth_GBps,
                     hw.op_overhead_us);
  if (!hw.op_fixed_us.empty()) out += "  op_fixed_us: " + rates_yaml(hw.op_fixed_us) + "\n";
  if (hw.host_us_per_op > 0) out += fmt::format("  host_us_per_op: {:.6g}\n", hw.host_us_per_op);
  if (hw.memory_GiB > 0) out += fmt::format("  memory_GiB: {:.6g}\n", hw.memory_GiB);
  out += fmt::format("node:\n  devices: {}\n", hw.devices_per_node);
  if (!hw.oversubscribed_wait_us.empty())
    out += fmt::format("  oversubscribed_wait_us: {}\n", table_yaml(hw.oversubscribed_wait_us));
  if (!hw.subgroup_wait_us.empty())
    out += fmt::format("  subgroup_wait_us: {}\n", table_yaml(hw.subgroup_wait_us));
  // One curve at 0 bytes is the single list, which means the same.
  if (hw.shared_core_slowdown.size() == 1 && hw.shared_core_slowdown.count(0)) {
    out += fmt::format("  shared_core_slowdown: {}\n", table_yaml(hw.shared_core_slowdown.at(0)));
  } else if (!hw.shared_core_slowdown.empty()) {
    std::string s;
    for (const auto& [bytes, curve] : hw.shared_core_slowdown)
      s += fmt::format("{}{:.10g}: {}", s.empty() ? "" : ", ", bytes, table_yaml(curve));
    out += "  shared_core_slowdown: {" + s + "}\n";
  }
  out += "links:\n";
  for (const auto& [label, l] : {std::pair{"node", hw.node_link}, std::pair{"cluster", hw.cluster_link}}) {
    out += fmt::format("  {}: {{bandwidth_GBps: {:.6g}, latency_us: {:.6g}, shared_by: {}", label,
                       l.bandwidth_GBps, l.latency_us, l.shared_by);
    // A table per collective kind, as `, key: {kind: [[x, y], ...], ...}`; nothing when empty.
    auto kind_tables = [&out](const char* key,
                              const std::map<std::string, std::vector<std::pair<double, double>>>& m) {
      if (m.empty()) return;
      out += fmt::format(", {}: {{", key);
      bool first_kind = true;
      for (const auto& [kind, table] : m) {
        out += fmt::format("{}{}: {}", first_kind ? "" : ", ", kind, table_yaml(table));
        first_kind = false;
      }
      out += "}";
    };
    kind_tables("collective_us", l.collective_us);
    out += bus_tables_yaml(l.bus_GBps);
    if (!l.async_progress) out += ", async_progress: false";
    out += "}\n";
  }
  return out;
}

}  // namespace parallel
