// train_supervisor: runs a training job (an mpirun or srun command line), and relaunches it from its
// latest checkpoint when it fails, up to N times with back-off; with --elastic, on the ranks that are
// still there, in a layout that fits (docs/restart.md).
//
//   train_supervisor [--max-restarts 3] [--backoff 10] [--elastic --hostfile FILE | --hosts-cmd CMD]
//       -- mpirun -np {ranks} build/bin/pretrain_gpt --config CONFIG.yaml [--set key=value ...]
//
// pretrain_gpt cannot outlive its job: a lost rank aborts every rank (MPI_Abort). The supervisor is
// a plain process outside the job (not an MPI program) that reads the trainer's --config and --set
// from the command line with the library's parser, so that it knows checkpoint.dir, train.steps and
// the layout, and asks the memory plan which layout fits the ranks it still has.
//
// An attempt ends in one of:
//   exit 0, the latest checkpoint at train.steps   finished: the supervisor exits 0
//   exit 0 before that                             a requested stop (SIGTERM / SIGUSR1 at the ranks,
//                                                  or at the supervisor, which forwards SIGUSR1):
//                                                  exits 0 without a relaunch (--restart-on-stop
//                                                  relaunches)
//   exit 2 or 3                                    a configuration error, the training guard's stop:
//                                                  a relaunch would do the same; exits with it
//   anything else (a rank killed, an abort)        a failure: relaunched with
//                                                  --set checkpoint.load=latest after a back-off
// Every start, restart and end is one line on stdout and in the log file (train.output_dir/restarts.log).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "parallel/checkpoint.hpp"
#include "parallel/config.hpp"
#include "parallel/elastic_layout.hpp"
#include "parallel/error.hpp"
#include "parallel/memory_plan.hpp"

namespace fs = std::filesystem;
using namespace parallel;

namespace {

constexpr const char* kName = "train_supervisor";

// Stop requests to the supervisor itself (SIGTERM, SIGINT, SIGUSR1): counted by the handler, acted
// on by the main loop (forwarded to the launcher: SIGUSR1, then SIGTERM, then SIGKILL).
std::atomic<int> g_stop_requests{0};
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int signal) {
  g_stop_signal.store(signal);
  g_stop_requests.fetch_add(1);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  std::exit(2);
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// One event: a line on stdout and in the log file.
class EventLog {
 public:
  explicit EventLog(const std::string& path) : path_(path) {
    std::error_code ec;
    if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
    out_.open(path, std::ios::app);
    if (!out_) usage_error("--log " + path + ": cannot open for appending");
  }
  void operator()(const std::string& line) {
    std::printf("%s: %s\n", kName, line.c_str());
    std::fflush(stdout);
    out_ << utc_now() << " " << line << "\n";
    out_.flush();
  }

 private:
  std::string path_;
  std::ofstream out_;
};

// ---- hosts ----------------------------------------------------------------------------------

struct Host {
  std::string name;
  int slots = 1;
};

// Host lines as Open MPI's hostfile ("node01 slots=8"), MPICH's ("node01:8") or bare names
// (`ranks_per_node` slots each); '#' starts a comment, blank lines are skipped.
std::vector<Host> parse_hosts(std::istream& in, int ranks_per_node, const std::string& where) {
  std::vector<Host> hosts;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::string word;
    if (!(words >> word)) continue;
    Host h{word, ranks_per_node};
    auto parse_count = [&](const std::string& text) {
      try {
        std::size_t used = 0;
        const int n = std::stoi(text, &used);
        if (used == text.size() && n >= 0) return n;
      } catch (const std::exception&) {
      }
      usage_error(where + " line " + std::to_string(number) + ": '" + text + "' is not a slot count");
    };
    if (auto colon = word.find(':'); colon != std::string::npos) {
      h.name = word.substr(0, colon);
      h.slots = parse_count(word.substr(colon + 1));
    }
    while (words >> word)
      if (word.rfind("slots=", 0) == 0) h.slots = parse_count(word.substr(6));
    if (h.slots > 0) hosts.push_back(h);
  }
  return hosts;
}

// The hosts now usable: --hostfile re-read, or --hosts-cmd's output; nullopt when neither is given.
std::optional<std::vector<Host>> probe_hosts(const std::string& hostfile, const std::string& hosts_cmd,
                                             int ranks_per_node) {
  if (!hostfile.empty()) {
    std::ifstream in(hostfile);
    if (!in) usage_error("--hostfile " + hostfile + ": cannot read it");
    return parse_hosts(in, ranks_per_node, "--hostfile " + hostfile);
  }
  if (!hosts_cmd.empty()) {
    FILE* pipe = popen(hosts_cmd.c_str(), "r");
    if (!pipe) usage_error("--hosts-cmd: cannot run it: " + std::string(std::strerror(errno)));
    std::string text;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe)) text.append(buf, n);
    const int status = pclose(pipe);
    if (status != 0)
      std::fprintf(stderr, "%s: --hosts-cmd exited with status %d; using the hosts it printed\n", kName,
                   WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    std::istringstream in(text);
    return parse_hosts(in, ranks_per_node, "--hosts-cmd output");
  }
  return std::nullopt;
}

int total_slots(const std::vector<Host>& hosts) {
  int n = 0;
  for (const Host& h : hosts) n += h.slots;
  return n;
}

// The first hosts whose slots hold `ranks`.
std::vector<Host> hosts_for(const std::vector<Host>& hosts, int ranks) {
  std::vector<Host> used;
  int have = 0;
  for (const Host& h : hosts) {
    if (have >= ranks) break;
    used.push_back(h);
    have += h.slots;
  }
  return used;
}

// ---- the command ----------------------------------------------------------------------------

// The trainer's --config and --set in the launch command (either `--set x` or `--set=x`).
void read_trainer_args(const std::vector<std::string>& command, std::string& config_file,
                       std::vector<std::string>& overrides) {
  for (std::size_t i = 0; i < command.size(); ++i) {
    const std::string& a = command[i];
    auto value = [&](const char* flag) -> std::optional<std::string> {
      const std::string f = flag;
      if (a == f) {
        if (i + 1 >= command.size()) usage_error("the command ends with " + f + " and no value");
        return command[++i];
      }
      if (a.rfind(f + "=", 0) == 0) return a.substr(f.size() + 1);
      return std::nullopt;
    };
    if (auto v = value("--config"))
      config_file = *v;
    else if (auto s = value("--set"))
      overrides.push_back(*s);
  }
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() &&
      s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=.,/:@%") ==
          std::string::npos)
    return s;
  return "'" + replace_all(s, "'", "'\\''") + "'";
}

// ---- one attempt ----------------------------------------------------------------------------

struct Outcome {
  int status = 0;                // waitpid status
  std::deque<std::string> tail;  // the last lines of the job's output
  bool stop_forwarded = false;
};

int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by SIG") + sigabbrev_np(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Runs `argv` with its output passed through to ours (and the last lines kept), stdin from
// /dev/null, in a process group of its own (the terminal's Ctrl-C reaches the supervisor only, which
// forwards it as a stop request). Stop requests to the supervisor go to the launcher: SIGUSR1 (a
// stop at the next step boundary, which mpirun and srun forward to the ranks), then SIGTERM, then
// SIGKILL to the launcher's process group.
Outcome run_attempt(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) usage_error("pipe: " + std::string(std::strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) usage_error("fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGTERM, SIGINT, SIGUSR1, SIGPIPE}) signal(s, SIG_DFL);
    const int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "%s: cannot run %s: %s\n", kName, args[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  close(fds[1]);
  Outcome out;
  std::string partial;
  auto keep = [&](const char* data, std::size_t n) {
    std::fwrite(data, 1, n, stdout);
    std::fflush(stdout);
    partial.append(data, n);
    for (std::size_t nl; (nl = partial.find('\n')) != std::string::npos; partial.erase(0, nl + 1)) {
      out.tail.push_back(partial.substr(0, nl));
      if (out.tail.size() > 400) out.tail.pop_front();
    }
  };
  int forwarded = g_stop_requests.load();  // requests before the start are for the back-off, not this run
  bool exited = false, eof = false;
  std::chrono::steady_clock::time_point exited_at;
  char buf[65536];
  while (!eof) {
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, 200);
    if (ready > 0) {
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n > 0)
        keep(buf, static_cast<std::size_t>(n));
      else if (n == 0 || errno != EINTR)
        eof = true;
    }
    for (int requests = g_stop_requests.load(); forwarded < requests; ++forwarded) {
      const int signal = forwarded == 0 ? SIGUSR1 : forwarded == 1 ? SIGTERM : SIGKILL;
      out.stop_forwarded = true;
      if (signal == SIGKILL)
        kill(-pid, SIGKILL);
      else
        kill(pid, signal);
    }
    if (!exited) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        exited_at = std::chrono::steady_clock::now();
        out.status = status;
      }
    } else if (std::chrono::steady_clock::now() - exited_at > std::chrono::seconds(5)) {
      break;  // something the launcher left behind holds the pipe open
    }
  }
  close(fds[0]);
  if (!exited) waitpid(pid, &out.status, 0);
  if (!partial.empty()) out.tail.push_back(partial);
  // Ranks the launcher left behind on this host would hold ports and devices: a failed launcher's
  // process group goes with it.
  if (exit_code_of(out.status) != 0) kill(-pid, SIGKILL);
  return out;
}

// The line of the job's output that says what went wrong: the launcher's notice of a rank that died
// (the others' errors follow from it), else the first fatal error a rank logged (the runtime's
// "[critical] fatal: ..."), else the last line that reads like an error.
std::string cause_line(const std::deque<std::string>& tail) {
  static const std::regex notice(R"(noticed that process rank|exited on signal|terminated with signal)",
                                 std::regex::icase);
  static const std::regex fatal(R"(\[critical\]|fatal:)");
  static const std::regex error(R"(fatal|critical|error|abort|killed|timed out|watchdog)", std::regex::icase);
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \t\r"));
    s.erase(s.find_last_not_of(" \t\r") + 1);
    if (s.size() > 240) s = s.substr(0, 237) + "...";
    return s;
  };
  for (const std::regex* pattern : {&notice, &fatal})
    for (const std::string& line : tail)
      if (std::regex_search(line, *pattern)) return trim(line);
  for (auto it = tail.rbegin(); it != tail.rend(); ++it)
    if (it->rfind("NOTE:", 0) != 0 && std::regex_search(*it, error)) return trim(*it);
  return "";
}

// ---- progress on disk -----------------------------------------------------------------------

// The step of the checkpoint `checkpoint.load: latest` would load, or -1 when there is none.
int64_t checkpoint_step(const std::string& root) {
  try {
    if (checkpoint::list_steps(root).empty()) return -1;
    return checkpoint::read_info(root).step;
  } catch (const std::exception&) {
    return -1;
  }
}

// The last training step metrics.jsonl logged (0 when none).
int64_t last_logged_step(const fs::path& metrics) {
  std::ifstream in(metrics);
  static const std::regex step(R"("step"\s*:\s*([0-9]+))");
  std::string line;
  int64_t last = 0;
  std::smatch m;
  while (std::getline(in, line))
    if (line.find("\"loss\"") != std::string::npos && std::regex_search(line, m, step))
      last = std::stoll(m[1].str());
  return last;
}

}  // namespace

int main(int argc, char** argv) {
  // Everything after "--" is the launch command; CLI11 reads what comes before.
  int separator = 1;
  while (separator < argc && std::strcmp(argv[separator], "--") != 0) ++separator;
  std::vector<std::string> command(argv + std::min(separator + 1, argc), argv + argc);

  CLI::App app{
      "Runs a training job and relaunches it from its latest checkpoint when it fails; with --elastic, on "
      "the ranks still there (docs/restart.md).\n"
      "  train_supervisor [options] -- mpirun -np {ranks} pretrain_gpt --config C.yaml [--set k=v ...]\n"
      "The command may use {ranks}, {nodes}, {hosts} (comma-separated), {hostfile} (a file in Open MPI's "
      "format) and {ranks_per_node}; the trainer's --config and --set are read from it."};
  int max_restarts = 3, ranks = 0, min_ranks = 1, ranks_per_node = 1;
  double backoff = 10, backoff_max = 300, rank_memory_gib = 0;
  bool elastic = false, restart_on_stop = false;
  std::string hostfile, hosts_cmd, log_path;
  app.add_option("--max-restarts", max_restarts, "relaunches after failures before giving up (default 3)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backoff", backoff,
                 "seconds before the first relaunch, doubled for each further one (default 10)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backoff-max", backoff_max, "the longest back-off, seconds (default 300)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ranks", ranks,
                 "ranks of the first launch (default: the slots of --hostfile / --hosts-cmd); the config is "
                 "validated for it")
      ->check(CLI::PositiveNumber);
  app.add_flag(
      "--elastic", elastic,
      "relaunch on the ranks still there (--hostfile / --hosts-cmd re-read before each launch), in a "
      "layout that fits: data parallelism shrinks first, the global batch stays");
  app.add_option("--min-ranks", min_ranks, "--elastic: give up below this many ranks (default 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--hostfile", hostfile,
                 "hosts now usable, re-read before each launch: 'host slots=N' (Open MPI), 'host:N' (MPICH) "
                 "or 'host' (--ranks-per-node slots)");
  app.add_option("--hosts-cmd", hosts_cmd,
                 "a shell command printing the hosts now usable, one per line as in --hostfile, run before "
                 "each launch (Slurm: docs/restart.md)");
  app.add_option("--ranks-per-node", ranks_per_node, "slots of a host line that gives none (default 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--rank-memory", rank_memory_gib,
                 "GiB a rank may use, for the memory plan's check of an elastic layout (default: CPU: this "
                 "host's available memory shared by the ranks per node; CUDA: no check)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--restart-on-stop", restart_on_stop,
               "relaunch after a requested stop (SIGTERM / SIGUSR1 at the ranks) too");
  app.add_option("--log", log_path, "the event log (default: <train.output_dir>/restarts.log)");
  try {
    app.parse(separator, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (command.empty())
    usage_error(
        "no launch command: give it after '--', e.g. -- mpirun -np {ranks} pretrain_gpt --config C.yaml");

  std::string config_file;
  std::vector<std::string> overrides;
  read_trainer_args(command, config_file, overrides);
  if (config_file.empty())
    usage_error("the command has no --config FILE: the supervisor reads the trainer's config from it");
  bool has_ranks_placeholder = false;
  for (const std::string& a : command) has_ranks_placeholder |= a.find("{ranks}") != std::string::npos;
  if (elastic && !has_ranks_placeholder)
    usage_error(
        "--elastic needs {ranks} in the command where the launcher takes the rank count "
        "(mpirun -np {ranks}, srun --ntasks={ranks})");
  if (elastic && hostfile.empty() && hosts_cmd.empty())
    usage_error("--elastic needs --hostfile or --hosts-cmd: how else would it learn which ranks are left?");
  if (!hostfile.empty() && !hosts_cmd.empty()) usage_error("give --hostfile or --hosts-cmd, not both");
  for (const char* placeholder : {"{hosts}", "{nodes}", "{hostfile}", "{ranks_per_node}"})
    for (const std::string& a : command)
      if (a.find(placeholder) != std::string::npos && hostfile.empty() && hosts_cmd.empty())
        usage_error(std::string(placeholder) +
                    " in the command needs --hostfile or --hosts-cmd (the hosts to name)");

  std::optional<std::vector<Host>> hosts = probe_hosts(hostfile, hosts_cmd, ranks_per_node);
  if (ranks == 0) {
    if (!hosts)
      usage_error("--ranks N is required (the ranks the command launches) without --hostfile / --hosts-cmd");
    ranks = total_slots(*hosts);
    if (ranks == 0) usage_error("no host has a slot: nothing to launch on");
  }

  Config config;
  try {
    config = load_config(config_file, overrides, ranks);
  } catch (const std::exception& e) {
    usage_error(e.what());
  }
  if (config.checkpoint.dir.empty())
    usage_error(
        "config: checkpoint.dir is not set: a relaunch would start again from step 0; set checkpoint.dir "
        "and checkpoint.save_interval");
  if (log_path.empty()) log_path = (fs::path(config.train.output_dir) / "restarts.log").string();
  EventLog log(log_path);
  if (config.checkpoint.save_interval == 0)
    log("warning: checkpoint.save_interval is 0: the job saves only at its end, so a failure loses every "
        "step");

  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGUSR1}) sigaction(s, &sa, nullptr);

  ElasticOptions elastic_options{.min_ranks = min_ranks, .max_ranks = ranks};
  if (rank_memory_gib > 0) {
    elastic_options.rank_memory_bytes = static_cast<int64_t>(rank_memory_gib * (1 << 30));
    elastic_options.memory_source = "--rank-memory";
  } else if (config.train.device == DeviceKind::CPU) {
    const MemoryLimit host = host_memory_limit(1);
    elastic_options.node_memory_bytes = host.bytes;
    elastic_options.memory_source = host.source;
  }

  // The layout of the next launch: as configured, or (elastic) what fits the hosts there now.
  auto pick_layout = [&](std::string& why_not) -> std::optional<ElasticLayout> {
    if (!elastic) return layout_of(config, ranks);
    hosts = probe_hosts(hostfile, hosts_cmd, ranks_per_node);
    elastic_options.nodes = std::max<int>(1, static_cast<int>(hosts->size()));
    const ElasticChoice choice = choose_elastic_layout(config, total_slots(*hosts), elastic_options);
    if (!choice.layout) why_not = choice.refused.empty() ? "" : choice.refused.back();
    return choice.layout;
  };

  const fs::path metrics = fs::path(config.train.output_dir) / "metrics.jsonl";
  std::string why_not;
  std::optional<ElasticLayout> layout = pick_layout(why_not);
  if (!layout) {
    log("giving up before the first launch: no layout fits: " + why_not);
    return 1;
  }
  int restarts = 0;
  for (int attempt = 1;; ++attempt) {
    // The command of this attempt: placeholders filled, the layout (elastic) and, once a checkpoint
    // exists, the resume appended as --set (the trainer applies overrides in order: ours win).
    const std::vector<Host> used = hosts ? hosts_for(*hosts, layout->world_size) : std::vector<Host>{};
    std::string host_names, hostfile_path;
    for (const Host& h : used) host_names += (host_names.empty() ? "" : ",") + h.name;
    bool wants_hostfile = false;
    for (const std::string& a : command) wants_hostfile |= a.find("{hostfile}") != std::string::npos;
    if (wants_hostfile) {
      std::error_code ec;
      fs::create_directories(config.train.output_dir, ec);
      hostfile_path = (fs::path(config.train.output_dir) / "supervisor_hosts").string();
      std::ofstream hf(hostfile_path, std::ios::trunc);
      for (const Host& h : used) hf << h.name << " slots=" << h.slots << "\n";
      if (!hf.flush()) usage_error("cannot write " + hostfile_path);
    }
    const int nodes = std::max<int>(1, static_cast<int>(used.size()));
    std::vector<std::string> argv_now;
    for (const std::string& a : command) {
      std::string s = replace_all(a, "{ranks}", std::to_string(layout->world_size));
      s = replace_all(s, "{nodes}", std::to_string(nodes));
      s = replace_all(s, "{hosts}", host_names);
      s = replace_all(s, "{hostfile}", hostfile_path);
      s = replace_all(s, "{ranks_per_node}", std::to_string((layout->world_size + nodes - 1) / nodes));
      argv_now.push_back(s);
    }
    if (elastic)
      for (const std::string& o : layout->overrides()) argv_now.insert(argv_now.end(), {"--set", o});
    const int64_t resume_from = checkpoint_step(config.checkpoint.dir);
    if (resume_from >= 0) argv_now.insert(argv_now.end(), {"--set", "checkpoint.load=latest"});
    std::string shown;
    for (const std::string& a : argv_now) shown += (shown.empty() ? "" : " ") + shell_quote(a);
    log(fmt::format(
        "attempt {}: {}; {}: {}", attempt, layout->describe(),
        resume_from >= 0 ? fmt::format("from the checkpoint of step {}", resume_from) : "from the start",
        shown));

    const Outcome outcome = run_attempt(argv_now);
    const int code = exit_code_of(outcome.status);
    const int64_t saved = checkpoint_step(config.checkpoint.dir);
    // An attempt that failed before logging a step reached its checkpoint's step, no further.
    const int64_t reached = std::max<int64_t>(last_logged_step(metrics), std::max<int64_t>(saved, 0));

    if (code == 0) {
      if (saved >= config.train.steps) {
        log(fmt::format("finished: step {} of {} saved after {} restart{}", saved, config.train.steps,
                        restarts, restarts == 1 ? "" : "s"));
        return 0;
      }
      if (!restart_on_stop || outcome.stop_forwarded || g_stop_requests.load() > 0) {
        log(fmt::format("stopped on request at step {} of {} (exit status 0); not relaunching{}",
                        std::max<int64_t>(saved, 0), config.train.steps,
                        restart_on_stop ? " (the supervisor itself was asked to stop)"
                                        : ": resume with checkpoint.load=latest, or use --restart-on-stop"));
        return 0;
      }
    }
    std::string cause = describe_status(outcome.status);
    if (const std::string line = cause_line(outcome.tail); !line.empty()) cause += ": " + line;
    if (code == 0) cause = "stopped on request (exit status 0)";
    if (g_stop_requests.load() > 0) {
      log(fmt::format(
          "stopped: the supervisor got SIG{} and forwarded it; the job ended with {}; not relaunching",
          sigabbrev_np(g_stop_signal.load()), cause));
      return code;
    }
    if (code == 2 || code == 3) {
      log(fmt::format("giving up: {}; exit status {} is {}, which a relaunch would repeat", cause, code,
                      code == 2 ? "a configuration error" : "the training guard's stop"));
      return code;
    }
    const std::string lost = fmt::format(
        "steps lost: {} (reached step {}, {})", std::max<int64_t>(0, reached - std::max<int64_t>(saved, 0)),
        reached, saved >= 0 ? fmt::format("the checkpoint holds step {}", saved) : "no checkpoint yet");
    if (code != 0 && restarts >= max_restarts) {
      log(fmt::format("giving up after {} restart{} (--max-restarts {}): attempt {} failed: {}; {}; {}",
                      restarts, restarts == 1 ? "" : "s", max_restarts, attempt, cause, lost,
                      saved >= 0 ? fmt::format("the latest checkpoint is step {} in {}: rerun with --set "
                                               "checkpoint.load=latest to resume",
                                               saved, config.checkpoint.dir)
                                 : fmt::format("nothing was saved in {}", config.checkpoint.dir)));
      return code;
    }
    // Keep the failed attempt's metrics: the trainer starts metrics.jsonl afresh.
    std::error_code ec;
    if (fs::exists(metrics, ec))
      fs::rename(metrics, metrics.parent_path() / fmt::format("metrics.attempt_{}.jsonl", attempt), ec);
    double delay = 0;
    if (code != 0) {
      ++restarts;
      delay = std::min(backoff_max, backoff * std::pow(2.0, restarts - 1));
      log(fmt::format("attempt {} failed: {}; relaunching in {:.0f} s", attempt, cause, delay));
    }
    for (auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(delay);
         std::chrono::steady_clock::now() < until && g_stop_requests.load() == 0;)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_stop_requests.load() > 0) {
      log(fmt::format("stopped: the supervisor got SIG{} during the back-off; not relaunching",
                      sigabbrev_np(g_stop_signal.load())));
      return code;
    }
    const ElasticLayout before = *layout;
    layout = pick_layout(why_not);
    if (!layout) {
      log(fmt::format("giving up: {}; {}; no layout fits the ranks left: {}", cause, lost, why_not));
      return code != 0 ? code : 1;
    }
    log(fmt::format("{}: {}; {}; layout {} -> {}; back-off {:.0f} s",
                    code != 0 ? fmt::format("restart {} of {}", restarts, max_restarts)
                              : std::string("relaunch after a requested stop"),
                    cause, lost, before.describe(), layout->describe(), delay));
  }
}
