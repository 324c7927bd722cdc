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

double HardwareDescription::matmul_efficiency_at(double size) const {
  if (matmul_efficiency.empty()) return 1.0;
  if (size <= matmul_efficiency.front().first) return matmul_efficiency.front().second;
  if (size >= matmul_efficiency.back().first) return matmul_efficiency.back().second;
  for (std::size_t i = 1; i < matmul_efficiency.size(); ++i) {
    const auto [x1, y1] = matmul_efficiency[i];
    if (size > x1) continue;
    const auto [x0, y0] = matmul_efficiency[i - 1];
    const double t = std::log(size / x0) / std::log(x1 / x0);
    return y0 + t * (y1 - y0);
  }
  return matmul_efficiency.back().second;
}

double HardwareDescription::matmul_flops(DType dtype) const {
  auto it = matmul_tflops.find(dtype);
  if (it == matmul_tflops.end()) it = matmul_tflops.find(DType::F32);
  return it == matmul_tflops.end() ? 0.0 : it->second * 1e12;
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
  LinkLevel link(const YAML::Node& n, const std::string& where) const {
    only_keys(n, where, {"bandwidth_GBps", "latency_us", "shared_by"});
    LinkLevel l;
    l.bandwidth_GBps = number(need(n, where, "bandwidth_GBps"), where + ".bandwidth_GBps", 0);
    l.latency_us = number(need(n, where, "latency_us"), where + ".latency_us", 0, true);
    if (n["shared_by"]) {
      const double s = number(n["shared_by"], where + ".shared_by", 1, true);
      if (s != std::floor(s))
        fail(where + ".shared_by", fmt::format("must be a whole number >= 1, got {}", s));
      l.shared_by = static_cast<int>(s);
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
               "op_overhead_us", "memory_GiB"});
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
  if (const YAML::Node eff = dev["matmul_efficiency"]) {
    if (!eff.IsSequence() || eff.size() == 0)
      r.fail("device.matmul_efficiency", "must be a list of [gemm size, fraction of peak] pairs");
    double last = 0;
    for (std::size_t i = 0; i < eff.size(); ++i) {
      const std::string key = fmt::format("device.matmul_efficiency[{}]", i);
      if (!eff[i].IsSequence() || eff[i].size() != 2)
        r.fail(key, "must be a pair [gemm size, fraction of peak]");
      const double size = r.number(eff[i][0], key + "[0]", 0);
      const double frac = r.number(eff[i][1], key + "[1]", 0);
      if (frac > 1) r.fail(key + "[1]", fmt::format("is a fraction of peak and must be <= 1, got {}", frac));
      if (size <= last) r.fail(key + "[0]", fmt::format("sizes must increase, got {} after {}", size, last));
      last = size;
      hw.matmul_efficiency.emplace_back(size, frac);
    }
  }
  hw.vector_tflops = r.number(r.need(dev, "device", "vector_tflops"), "device.vector_tflops", 0);
  if (const YAML::Node ops = dev["op_tflops"]) {
    if (!ops.IsMap()) r.fail("device.op_tflops", "must map op names to TFLOP/s (gelu_forward: 0.001)");
    for (const auto& kv : ops) {
      const auto op = kv.first.as<std::string>();
      hw.op_tflops[op] = r.number(kv.second, "device.op_tflops." + op, 0);
    }
  }
  hw.memory_bandwidth_GBps =
      r.number(r.need(dev, "device", "memory_bandwidth_GBps"), "device.memory_bandwidth_GBps", 0);
  hw.op_overhead_us = r.number(r.need(dev, "device", "op_overhead_us"), "device.op_overhead_us", 0, true);
  if (dev["memory_GiB"]) hw.memory_GiB = r.number(dev["memory_GiB"], "device.memory_GiB", 0);
  const YAML::Node node = r.need(root, "", "node");
  r.only_keys(node, "node", {"devices"});
  const double devices = r.number(r.need(node, "node", "devices"), "node.devices", 1, true);
  if (devices != std::floor(devices))
    r.fail("node.devices", fmt::format("must be a whole number >= 1, got {}", devices));
  hw.devices_per_node = static_cast<int>(devices);
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
  if (!hw.matmul_efficiency.empty()) {
    out += "  matmul_efficiency: [";
    first = true;
    for (const auto& [s, f] : hw.matmul_efficiency) {
      out += fmt::format("{}[{:.6g}, {:.4g}]", first ? "" : ", ", s, f);
      first = false;
    }
    out += "]\n";
  }
  out += fmt::format("  vector_tflops: {:.6g}\n", hw.vector_tflops);
  if (!hw.op_tflops.empty()) {
    out += "  op_tflops: {";
    first = true;
    for (const auto& [op, v] : hw.op_tflops) {
      out += fmt::format("{}{}: {:.6g}", first ? "" : ", ", op, v);
      first = false;
    }
    out += "}\n";
  }
  out += fmt::format("  memory_bandwidth_GBps: {:.6g}\n  op_overhead_us: {:.6g}\n", hw.memory_bandwidth_GBps,
                     hw.op_overhead_us);
  if (hw.memory_GiB > 0) out += fmt::format("  memory_GiB: {:.6g}\n", hw.memory_GiB);
  out += fmt::format("node:\n  devices: {}\nlinks:\n", hw.devices_per_node);
  for (const auto& [label, l] : {std::pair{"node", hw.node_link}, std::pair{"cluster", hw.cluster_link}})
    out += fmt::format("  {}: {{bandwidth_GBps: {:.6g}, latency_us: {:.6g}, shared_by: {}}}\n", label,
                       l.bandwidth_GBps, l.latency_us, l.shared_by);
  return out;
}

}  // namespace parallel
