#include "client/cli/launch/launch_command.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/launch/local_etcd.h"
#include "client/cli/launch/secure_setup.h"
#include "common/status_macros.h"
#include "io/errno.h"
#include "io/file.h"
#include "io/socket.h"
#include "io/subprocess.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kLaunchCommand = "launch";
constexpr absl::string_view kEmbeddedStore = "embedded";

// Where the daemons keep the store.
enum class StoreKind {
  kLocalEtcd,  // an etcd member this launch runs (local_etcd.h)
  kEtcd,       // --store etcd://..., given to the launcher or after "--"
  kEmbedded,   // rank 0 serves it: rank 0 cannot restart alone
};

// The store `options` ask for; kLocalEtcd when etcd is to be looked for.
StoreKind RequestedStore(const LaunchOptions& options) {
  if (options.store == kEmbeddedStore) return StoreKind::kEmbedded;
  if (!options.store.empty()) return StoreKind::kEtcd;
  for (const std::string& flag : options.server_flags) {
    if (flag == "--store" || absl::StartsWith(flag, "--store=")) {
      return StoreKind::kEtcd;
    }
  }
  return StoreKind::kLocalEtcd;
}

constexpr char kServerName[] = "tessera-server";
constexpr int kMaxProcesses = 4096;
constexpr absl::string_view kLogLevels[] = {"trace", "debug", "info", "warn",
                                            "error"};
// Variables the launcher sets for each daemon, and Slurm's, which would
// otherwise leak a surrounding job's ranks into them.
constexpr absl::string_view kRankVariables[] = {
    "RANK",        "WORLD_SIZE",   "LOCAL_RANK",   "MASTER_ADDR",
    "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};

// "exit code 1", "signal 9 (Killed)".
std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return absl::StrCat("signal ", WTERMSIG(status),
                        name != nullptr ? absl::StrCat(" (", name, ")") : "");
  }
  return absl::StrCat("wait status ", status);
}

// "host:port" once the daemon wrote its address file whole (it ends in a
// newline); nullopt before.
std::optional<std::string> ReadAddressFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string contents = buffer.str();
  if (contents.empty() || contents.back() != '\n') return std::nullopt;
  return std::string(absl::StripAsciiWhitespace(contents));
}

// ", metrics http://HOST:PORT/metrics" once `daemon` (serving) wrote its
// metrics address; "" when it serves none.
template <typename Daemon>
std::string MetricsNote(const Daemon& daemon) {
  if (daemon.metrics_address_file.empty()) return "";
  const std::optional<std::string> address =
      ReadAddressFile(daemon.metrics_address_file);
  if (!address.has_value()) return "";
  return absl::StrCat(", metrics http://", *address, "/metrics");
}

// The signals the launcher waits for instead of handling them.
sigset_t LauncherSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGCHLD);
  return set;
}

bool IsStopSignal(int signal) {
  return signal == SIGINT || signal == SIGTERM || signal == SIGHUP;
}

// The daemons of one launch, and the process state the launch changed.
// The destructor kills and reaps any daemon still running, removes the
// address files and restores the signal mask.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, const CommandContext& context)
      : options_(options), context_(context) {}
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Blocks the launcher's signals, creates the address directory and
  // starts the local etcd member unless another store is asked for (or
  // etcd is not installed: then rank 0 serves the store, with a warning).
  absl::Status Prepare();
  // Starts every daemon; stops those started when one cannot be.
  absl::Status StartAll(const std::string& server);
  // Runs until a stop signal (exit 0) or a daemon's exit (exit 1).
  int Supervise();

 private:
  struct Daemon {
    int rank = 0;
    pid_t pid = -1;
    std::string address_file;
    std::string address;
    std::string metrics_address_file;  // Empty: no metrics.
    std::optional<int> wait_status;    // once reaped
    int restarts = 0;
  };

  // Starts rank `rank`'s daemon into daemons_[rank] (appended when new).
  absl::Status Start(int rank);
  // Chooses the store and starts the local etcd member when it is the one.
  absl::Status PrepareStore();
  // After `daemon` exited while serving: starts it again when
  // --max-restarts allows (rank 0 only when it does not serve the store).
  // The exit code when the launch must end instead, nullopt when it goes
  // on.
  std::optional<int> RestartOrFail(Daemon& daemon, const std::string& exited);
  // The next signal of LauncherSignals() within `timeout`; 0 on timeout.
  int WaitSignal(absl::Duration timeout);
  // Reaps every daemon that exited; returns the first newly exited one.
  Daemon* Reap();
  int Running() const;
  // SIGTERM, a bounded wait, then SIGKILL; every daemon is reaped after.
  void StopAll();
  // Stops every daemon after a stop signal, then the local etcd; the exit
  // code (0).
  int StopOnSignal(int signal);
  // The local etcd after the daemons: SIGTERM, --stop-timeout, SIGKILL.
  void StopStore();
  // "store: ..." for the ready output.
  std::string StoreLine() const;
  // A one-line error; the exit code for a failure.
  int Fail(absl::string_view message);
  // When the local etcd exited: stops the daemons; the exit code (1).
  std::optional<int> FailIfStoreExited();

  const LaunchOptions& options_;
  const CommandContext& context_;
  std::string server_;
  std::vector<Daemon> daemons_;
  std::string address_dir_;
  std::optional<SecureSetup> secure_;  // with --secure, in address_dir_
  StoreKind store_ = StoreKind::kEmbedded;
  std::unique_ptr<LocalEtcd> etcd_;  // with kLocalEtcd, in address_dir_
  sigset_t old_mask_;
  bool mask_changed_ = false;
  struct sigaction old_sigchld_;
  bool sigchld_changed_ = false;
};

Supervisor::~Supervisor() {
  for (Daemon& daemon : daemons_) {
    if (daemon.pid > 0 && !daemon.wait_status.has_value()) {
      ::kill(daemon.pid, SIGKILL);
      int status = 0;
      while (::waitpid(daemon.pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  StopStore();  // after the daemons, before its directory goes
  if (!address_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(address_dir_, ignored);
  }
  if (sigchld_changed_) ::sigaction(SIGCHLD, &old_sigchld_, nullptr);
  if (mask_changed_) ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
}

absl::Status Supervisor::Prepare() {
  // An inherited SIG_IGN for SIGCHLD would reap the daemons behind our back.
  struct sigaction default_action;
  std::memset(&default_action, 0, sizeof(default_action));
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  if (::sigaction(SIGCHLD, &default_action, &old_sigchld_) == 0) {
    sigchld_changed_ = true;
  }
  const sigset_t signals = LauncherSignals();
  if (::sigprocmask(SIG_BLOCK, &signals, &old_mask_) != 0) {
    return ErrnoError(errno, "cannot block signals",
                      absl::StatusCode::kInternal);
  }
  mask_changed_ = true;

  const char* tmpdir = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp",
                   "/tessera-launch.XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    return ErrnoError(errno,
                      absl::StrCat("cannot create a directory like ", pattern),
                      absl::StatusCode::kInternal);
  }
  address_dir_ = pattern;
  if (options_.secure) {
    absl::StatusOr<SecureSetup> secure =
        MakeSecureSetup(address_dir_, options_.host);
    if (!secure.ok()) {
      return absl::Status(
          secure.status().code(),
          absl::StrCat("--secure: ", secure.status().message()));
    }
    secure_ = *std::move(secure);
  }
  if (!options_.log_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options_.log_dir, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot create --log-dir '",
                                              options_.log_dir,
                                              "': ", error.message()));
    }
  }
  return PrepareStore();
}

absl::Status Supervisor::PrepareStore() {
  store_ = RequestedStore(options_);
  if (store_ != StoreKind::kLocalEtcd) return absl::OkStatus();
  const char* path_env = std::getenv("PATH");
  absl::StatusOr<std::string> etcd =
      FindEtcdBinary(path_env != nullptr ? path_env : "");
  if (!etcd.ok()) {
    store_ = StoreKind::kEmbedded;
    context_.err() << "tessera launch: warning: " << etcd.status().message()
                   << "; rank 0 serves the store instead, so it cannot be "
                      "restarted"
                   << std::endl;
    return absl::OkStatus();
  }
  LocalEtcdOptions local;
  local.etcd = *etcd;
  local.dir = absl::StrCat(address_dir_, "/etcd");
  if (!options_.log_dir.empty()) {
    local.log_path = absl::StrCat(options_.log_dir, "/etcd.log");
  }
  // Not --start-timeout, which is the daemons': etcd serves in about a
  // second, and a tight --start-timeout must still fail naming a daemon.
  local.start_timeout = absl::Seconds(30);
  local.signal_mask = old_mask_;
  absl::StatusOr<std::unique_ptr<LocalEtcd>> started =
      LocalEtcd::Start(std::move(local));
  if (!started.ok()) return started.status();
  etcd_ = *std::move(started);
  return absl::OkStatus();
}

absl::Status Supervisor::StartAll(const std::string& server) {
  server_ = server;
  for (int rank = 0; rank < options_.nproc; ++rank) {
    absl::Status started = Start(rank);
    if (!started.ok()) {
      StopAll();
      return started;
    }
  }
  return absl::OkStatus();
}

absl::Status Supervisor::Start(int rank) {
  std::vector<std::string> flags;
  if (secure_.has_value()) flags = secure_->DaemonFlags();
  if (etcd_ != nullptr) {
    const std::vector<std::string> store = etcd_->DaemonFlags();
    flags.insert(flags.end(), store.begin(), store.end());
  }
  DaemonCommand command =
      BuildDaemonCommand(options_, rank, address_dir_, flags);
  SpawnOptions spawn;
  spawn.program = server_;
  spawn.args = command.args;
  spawn.env = command.env;
  for (absl::string_view name : kRankVariables) {
    spawn.unset_env.emplace_back(name);
  }
  if (!options_.log_dir.empty()) {
    spawn.log_path = absl::StrCat(options_.log_dir, "/rank", rank, ".log");
    spawn.append_log = true;  // a restarted daemon's log follows the last
  }
  spawn.stdin_null = true;
  spawn.new_process_group = true;  // Ctrl-C reaches only the launcher
  spawn.die_with_parent = true;
  spawn.signal_mask = old_mask_;
  // The address file says when this process serves; an old one would say
  // so at once.
  std::error_code ignored;
  std::filesystem::remove(command.address_file, ignored);
  if (!command.metrics_address_file.empty()) {
    std::filesystem::remove(command.metrics_address_file, ignored);
  }
  ASSIGN_OR_RETURN(const pid_t pid, SpawnProcess(spawn));
  if (rank >= static_cast<int>(daemons_.size())) daemons_.resize(rank + 1);
  Daemon& daemon = daemons_[rank];
  daemon.rank = rank;
  daemon.pid = pid;
  daemon.address_file = command.address_file;
  daemon.metrics_address_file = command.metrics_address_file;
  daemon.address.clear();
  daemon.wait_status.reset();
  return absl::OkStatus();
}

std::optional<int> Supervisor::RestartOrFail(Daemon& daemon,
                                             const std::string& exited) {
  if (daemon.restarts >= options_.max_restarts) {
    StopAll();
    return Fail(absl::StrCat(exited,
                             options_.max_restarts > 0
                                 ? absl::StrCat(" after ", daemon.restarts,
                                                " restarts (--max-restarts)")
                                 : std::string(),
                             "; stopped the others"));
  }
  if (daemon.rank == 0 && store_ == StoreKind::kEmbedded) {
    StopAll();
    return Fail(absl::StrCat(
        exited,
        "; rank 0 serves the cluster's store (--store embedded, or no etcd "
        "installed), so it cannot be restarted alone; stopped the others"));
  }
  ++daemon.restarts;
  context_.err() << "tessera launch: " << exited << "; restarting it ("
                 << daemon.restarts << " of " << options_.max_restarts << ")"
                 << std::endl;
  absl::Status started = Start(daemon.rank);
  if (!started.ok()) {
    StopAll();
    return Fail(absl::StrCat("restarting rank ", daemon.rank, ": ",
                             started.message(), "; stopped the others"));
  }
  return std::nullopt;
}

int Supervisor::WaitSignal(absl::Duration timeout) {
  const sigset_t signals = LauncherSignals();
  const absl::Duration bounded = std::max(timeout, absl::ZeroDuration());
  struct timespec wait = absl::ToTimespec(bounded);
  const int signal = ::sigtimedwait(&signals, nullptr, &wait);
  return signal > 0 ? signal : 0;
}

Supervisor::Daemon* Supervisor::Reap() {
  Daemon* first = nullptr;
  for (Daemon& daemon : daemons_) {
    if (daemon.pid <= 0 || daemon.wait_status.has_value()) continue;
    int status = 0;
    const pid_t reaped = ::waitpid(daemon.pid, &status, WNOHANG);
    if (reaped == daemon.pid) {
      daemon.wait_status = status;
      if (first == nullptr) first = &daemon;
    }
  }
  return first;
}

int Supervisor::Running() const {
  int running = 0;
  for (const Daemon& daemon : daemons_) {
    if (daemon.pid > 0 && !daemon.wait_status.has_value()) ++running;
  }
  return running;
}

void Supervisor::StopAll() {
  Reap();
  if (Running() == 0) return;
  for (const Daemon& daemon : daemons_) {
    if (daemon.pid > 0 && !daemon.wait_status.has_value()) {
      ::kill(daemon.pid, SIGTERM);
    }
  }
  const absl::Time deadline =
      absl::Now() + absl::Seconds(options_.stop_timeout_seconds);
  while (true) {
    Reap();
    if (Running() == 0) return;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    // A second Ctrl-C means now.
    if (IsStopSignal(WaitSignal(std::min(left, absl::Milliseconds(50))))) {
      break;
    }
  }
  for (Daemon& daemon : daemons_) {
    if (daemon.pid <= 0 || daemon.wait_status.has_value()) continue;
    context_.PrintError(kLaunchCommand,
                        absl::StrCat("rank ", daemon.rank, " (pid ", daemon.pid,
                                     ") did not stop in time; killing it"));
    ::kill(daemon.pid, SIGKILL);
    int status = 0;
    while (::waitpid(daemon.pid, &status, 0) < 0 && errno == EINTR) {
    }
    daemon.wait_status = status;
  }
}

int Supervisor::StopOnSignal(int signal) {
  context_.err() << "tessera launch: " << ::strsignal(signal) << ": stopping "
                 << Running() << " daemons" << std::endl;
  StopAll();
  StopStore();
  context_.err() << "tessera launch: stopped" << std::endl;
  return kExitOk;
}

void Supervisor::StopStore() {
  if (etcd_ == nullptr) return;
  const pid_t pid = etcd_->pid();
  if (!etcd_->Stop(absl::Seconds(options_.stop_timeout_seconds))) {
    context_.PrintError(kLaunchCommand,
                        absl::StrCat("the local etcd (pid ", pid,
                                     ") did not stop in time; "
                                     "killed it"));
  }
  etcd_.reset();
}

std::string Supervisor::StoreLine() const {
  switch (store_) {
    case StoreKind::kLocalEtcd:
      return absl::StrCat("store: etcd (local member, pid ", etcd_->pid(),
                          ", https://", etcd_->endpoint(), ", mutual TLS)");
    case StoreKind::kEtcd:
      return absl::StrCat(
          "store: etcd (",
          options_.store.empty() ? "--store after \"--\"" : options_.store,
          ")");
    case StoreKind::kEmbedded:
      break;
  }
  return absl::StrCat(
      "store: rank 0 (embedded, ",
      JoinHostPort(MasterAddress(options_.host), options_.master_port), ")");
}

int Supervisor::Fail(absl::string_view message) {
  context_.PrintError(kLaunchCommand, message);
  return kExitFailure;
}

std::optional<int> Supervisor::FailIfStoreExited() {
  if (etcd_ == nullptr) return std::nullopt;
  const std::optional<int> status = etcd_->Exited();
  if (!status.has_value()) return std::nullopt;
  const std::string message =
      absl::StrCat("the local etcd (pid ", etcd_->pid(), ") exited with ",
                   DescribeWaitStatus(*status), "; stopped every daemon; ",
                   etcd_->LogNote());
  StopAll();
  return Fail(message);
}

int Supervisor::Supervise() {
  const std::string logs_hint =
      options_.log_dir.empty()
          ? std::string()
          : absl::StrCat(" (its log: ", options_.log_dir, "/rank");
  auto describe_exit = [&](const Daemon& daemon, absl::string_view when) {
    std::string message =
        absl::StrCat("rank ", daemon.rank, " (pid ", daemon.pid, ") exited",
                     when, " with ", DescribeWaitStatus(*daemon.wait_status));
    if (!logs_hint.empty()) {
      absl::StrAppend(&message, logs_hint, daemon.rank, ".log)");
    }
    return message;
  };

  // Until every daemon serves.
  const absl::Time deadline =
      absl::Now() + absl::Seconds(options_.start_timeout_seconds);
  while (true) {
    const int signal = WaitSignal(absl::Milliseconds(50));
    if (IsStopSignal(signal)) return StopOnSignal(signal);
    if (Daemon* dead = Reap()) {
      const std::string message = describe_exit(*dead, " before serving");
      StopAll();
      return Fail(absl::StrCat(message, "; stopped the others"));
    }
    if (std::optional<int> code = FailIfStoreExited()) return *code;
    Daemon* waiting = nullptr;
    for (Daemon& daemon : daemons_) {
      if (!daemon.address.empty()) continue;
      if (std::optional<std::string> address =
              ReadAddressFile(daemon.address_file)) {
        daemon.address = *address;
      } else if (waiting == nullptr) {
        waiting = &daemon;
      }
    }
    if (waiting == nullptr) break;
    if (absl::Now() >= deadline) {
      const int rank = waiting->rank;
      StopAll();
      return Fail(absl::StrCat(
          "rank ", rank, " did not serve within ",
          absl::FormatDuration(absl::Seconds(options_.start_timeout_seconds)),
          "; stopped every daemon"));
    }
  }
  context_.out() << StoreLine() << "\n";
  for (const Daemon& daemon : daemons_) {
    context_.out() << "rank " << daemon.rank << ": " << daemon.address
                   << " (pid " << daemon.pid << MetricsNote(daemon) << ")\n";
  }
  context_.out() << "ready: export TESSERA_ADDRESS=" << daemons_[0].address;
  if (secure_.has_value()) {
    for (const auto& [name, value] : secure_->ClientEnvironment()) {
      context_.out() << " " << name << "=" << value;
    }
  }
  context_.out() << std::endl;

  // In the foreground until told to stop or a daemon exits (and may not
  // be restarted). A restarted daemon rejoins the running cluster; its
  // line is printed again once it serves.
  while (true) {
    const bool restarting = std::any_of(
        daemons_.begin(), daemons_.end(),
        [](const Daemon& daemon) { return daemon.address.empty(); });
    const int signal =
        WaitSignal(restarting ? absl::Milliseconds(50) : absl::Seconds(1));
    if (IsStopSignal(signal)) return StopOnSignal(signal);
    if (std::optional<int> code = FailIfStoreExited()) return *code;
    Reap();
    for (Daemon& daemon : daemons_) {
      if (!daemon.wait_status.has_value()) continue;
      if (std::optional<int> code =
              RestartOrFail(daemon, describe_exit(daemon, ""))) {
        return *code;
      }
    }
    for (Daemon& daemon : daemons_) {
      if (!daemon.address.empty()) continue;
      if (std::optional<std::string> address =
              ReadAddressFile(daemon.address_file)) {
        daemon.address = *address;
        context_.out() << "rank " << daemon.rank << ": " << daemon.address
                       << " (pid " << daemon.pid << MetricsNote(daemon)
                       << ", restarted)" << std::endl;
      }
    }
  }
}

}  // namespace

std::string MasterAddress(const std::string& host) {
  if (host == "0.0.0.0" || host == "::" || host == "[::]") return "127.0.0.1";
  return host;
}

namespace {

using CheckFn = LaunchSettingTable::CheckFn;

// A check of `field` with `ok`, else "<source> must be <what>, got <v>".
template <typename T>
CheckFn Must(T LaunchOptions::*field, bool (*ok)(T), const char* what) {
  return [field, ok, what](absl::string_view source,
                           const LaunchOptions& options) {
    if (ok(options.*field)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(source, " must be ", what, ", got ", options.*field));
  };
}

LaunchSettingTable MakeLaunchSettings() {
  LaunchSettingTable table;
  table.Add("--nproc", &LaunchFlags::nproc)
      .Alias("--nproc-per-node")
      .Required("number of daemons")
      .Help("N", "Number of daemons (ranks), one per GPU or CPU rank")
      .Int(&LaunchOptions::nproc, 1, kMaxProcesses);
  table.Add("--cpu", &LaunchFlags::cpu)
      .Help("",
            "Run every daemon on the CPU (--device cpu); default: --device "
            "auto, cuda:<rank> when that GPU exists")
      .Bool(&LaunchOptions::cpu);
  table.Add("--master-port", &LaunchFlags::master_port)
      .Default("29500")
      .Help("PORT",
            "Port of the rendezvous store rank 0 serves (--store embedded)")
      .Int(&LaunchOptions::master_port, 1, 65535);
  table.Add("--store", &LaunchFlags::store)
      .DefaultNote(
          "a local etcd member this launch runs (mutual TLS, loopback); "
          "embedded when etcd-server is not installed")
      .Help("URL",
            "Where the daemons keep the store: etcd://HOST:PORT[,...][/PREFIX] "
            "(an etcd of yours), or 'embedded' (rank 0 serves it on "
            "--master-port, and cannot restart)")
      .Text(&LaunchOptions::store)
      .Check([](absl::string_view source, const LaunchOptions& options) {
        if (options.store.empty() || options.store == kEmbeddedStore ||
            absl::StartsWith(options.store, "etcd://")) {
          return absl::OkStatus();
        }
        return absl::InvalidArgumentError(absl::StrCat(
            source,
            " must be etcd://HOST:PORT[,HOST:PORT...][/PREFIX] or embedded, "
            "got '",
            options.store, "'"));
      });
  table.Add("--base-port", &LaunchFlags::base_port)
      .Default("29600")
      .Help("PORT", "Rank i listens on this port + i (0: any free port)")
      .Int(&LaunchOptions::base_port)
      .Check(Must<int>(
          &LaunchOptions::base_port,
          [](int port) { return port >= 0 && port <= 65535; },
          "in [1, 65535] (or 0: any free port)"));
  table.Add("--metrics-base-port", &LaunchFlags::metrics_base_port)
      .Default("0")
      .Help("PORT",
            "Rank i serves Prometheus metrics on 127.0.0.1, this port + i (0: "
            "any free port, -1: none)")
      .Int(&LaunchOptions::metrics_base_port)
      .Check([](absl::string_view source, const LaunchOptions& options) {
        const int first = options.metrics_base_port;
        if (first >= -1 && first + options.nproc - 1 <= 65535) {
          return absl::OkStatus();
        }
        return absl::InvalidArgumentError(absl::StrCat(
            source, " must leave room for ", options.nproc,
            " daemons in [1, 65535] (or be 0: free ports, -1: no metrics), "
            "got ",
            first));
      });
  table.Add("--host", &LaunchFlags::host)
      .Default("127.0.0.1")
      .Help("HOST",
            "Address the daemons listen on (0.0.0.0 for every interface) and "
            "the master address")
      .Text(&LaunchOptions::host)
      .Check([](absl::string_view source, const LaunchOptions& options) {
        if (!options.host.empty()) return absl::OkStatus();
        return absl::InvalidArgumentError(
            absl::StrCat(source, " must not be empty"));
      });
  table.Add("--log-level", &LaunchFlags::log_level)
      .DefaultNote("the daemons' own, info")
      .Help("LEVEL", "The daemons' log level: trace, debug, info, warn, error")
      .Text(&LaunchOptions::log_level)
      .Check([](absl::string_view source, const LaunchOptions& options) {
        const std::string& level = options.log_level;
        if (level.empty() ||
            std::find(std::begin(kLogLevels), std::end(kLogLevels), level) !=
                std::end(kLogLevels)) {
          return absl::OkStatus();
        }
        return absl::InvalidArgumentError(
            absl::StrCat("unknown ", source, " '", level, "': expected ",
                         absl::StrJoin(kLogLevels, ", ")));
      });
  table.Add("--log-dir", &LaunchFlags::log_dir)
      .DefaultNote("this terminal")
      .Help("DIR", "Write rank i's output to DIR/rank<i>.log")
      .Text(&LaunchOptions::log_dir);
  table.Add("--checkpoint-root", &LaunchFlags::checkpoint_root)
      .DefaultNote("this directory")
      .Help("DIR", "Where the daemons may save and load checkpoints")
      .Text(&LaunchOptions::checkpoint_root);
  table.Add("--secure", &LaunchFlags::secure)
      .Help("",
            "Mutual TLS and tokens from a throwaway CA made for this launch; "
            "the ready line exports the client's credentials")
      .Bool(&LaunchOptions::secure);
  table.Add("--server", &LaunchFlags::server)
      .DefaultNote("next to this program, in the build tree, or on PATH")
      .Help("PATH", "The tessera-server executable")
      .Text(&LaunchOptions::server);
  table.Add("--start-timeout", &LaunchFlags::start_timeout)
      .Default("120")
      .Help("SECONDS",
            "Give up when a daemon does not serve within this many seconds")
      .Number(&LaunchOptions::start_timeout_seconds)
      .Check(Must<double>(
          &LaunchOptions::start_timeout_seconds,
          [](double seconds) { return seconds > 0; }, "positive"));
  table.Add("--max-restarts", &LaunchFlags::max_restarts)
      .Default("3")
      .Help("N",
            "Start a daemon that exits again, up to this many times per "
            "daemon; it rejoins the running cluster (its shards are lost). "
            "Rank 0 too, unless it serves the store (--store embedded)")
      .Int(&LaunchOptions::max_restarts)
      .Check(Must<int>(
          &LaunchOptions::max_restarts, [](int n) { return n >= 0; }, ">= 0"));
  table.Add("--stop-timeout", &LaunchFlags::stop_timeout)
      .Default("15")
      .Help("SECONDS", "Seconds between SIGTERM and SIGKILL when stopping")
      .Number(&LaunchOptions::stop_timeout_seconds)
      .Check(Must<double>(
          &LaunchOptions::stop_timeout_seconds,
          [](double seconds) { return seconds > 0; }, "positive"));
  table.Add("server_flags", &LaunchFlags::server_flags)
      .Help("FLAGS",
            "More tessera-server flags, after '--' (e.g. -- --timeout 120s)")
      .List(&LaunchOptions::server_flags);
  return table;
}

}  // namespace

const LaunchSettingTable& LaunchSettings() {
  static const LaunchSettingTable* const table =
      new LaunchSettingTable(MakeLaunchSettings());
  return *table;
}

LaunchOptions::LaunchOptions() {
  // Fixed texts the table's tests resolve: they cannot fail.
  LaunchSettings().SetDefaults(*this).IgnoreError();
}

absl::StatusOr<LaunchOptions> ResolveLaunchOptions(
    const LaunchFlags& flags, const SettingGetenv& getenv) {
  LaunchOptions options;
  RETURN_IF_ERROR(LaunchSettings().Resolve(flags, getenv, options));
  RETURN_IF_ERROR(ValidateLaunchOptions(options));
  return options;
}

absl::Status ValidateLaunchOptions(const LaunchOptions& options) {
  RETURN_IF_ERROR(LaunchSettings().Validate(options));
  if (options.base_port > 0) {
    const int last = options.base_port + options.nproc - 1;
    if (last > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--base-port ", options.base_port, " leaves no room for ",
          options.nproc, " daemons: the last would listen on port ", last));
    }
    if (options.master_port >= options.base_port &&
        options.master_port <= last) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--master-port ", options.master_port, " is also a daemon's port (",
          options.base_port, "..", last, "); choose another"));
    }
  }
  if (options.metrics_base_port > 0) {
    const int first = options.metrics_base_port;
    const int last = first + options.nproc - 1;
    const bool master =
        options.master_port >= first && options.master_port <= last;
    const bool daemons = options.base_port > 0 && options.base_port <= last &&
                         first <= options.base_port + options.nproc - 1;
    if (master || daemons) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics-base-port ", first, " gives the metrics ports ", first,
          "..", last, ", which overlap ",
          master ? "--master-port" : "the daemons' ports (--base-port)",
          "; choose another"));
    }
  }
  // Launch gives every daemon its metrics port and file; the same flags
  // again after "--" would make every daemon refuse its command line.
  for (const std::string& flag : options.server_flags) {
    for (absl::string_view owned :
         {"--metrics-port", "--metrics-address-file"}) {
      if (flag == owned || absl::StartsWith(flag, absl::StrCat(owned, "="))) {
        return absl::InvalidArgumentError(absl::StrCat(
            owned,
            " is launch's to give: use --metrics-base-port PORT (rank "
            "i gets PORT + i; 0: free ports, -1: none) instead of passing it "
            "after \"--\""));
      }
    }
  }
  if (!IsLoopbackHost(options.host) && !options.secure &&
      std::find(options.server_flags.begin(), options.server_flags.end(),
                "--insecure") == options.server_flags.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--host ", options.host,
        " listens beyond this host: add --secure (TLS and tokens), or '-- "
        "--insecure' on a network only trusted users reach"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FindServerBinary(const std::string& server,
                                             const std::string& self,
                                             const std::string& path_env) {
  if (!server.empty()) {
    if (IsExecutableFile(server)) return server;
    return absl::NotFoundError(
        absl::StrCat("--server '", server, "' is not an executable file"));
  }
  std::vector<std::string> candidates;
  if (!self.empty()) {
    const std::filesystem::path dir = std::filesystem::path(self).parent_path();
    for (const char* relative :
         {".", "../bin", "../../server/daemon", "../../server"}) {
      candidates.push_back(
          (dir / relative / kServerName).lexically_normal().string());
    }
  }
  for (absl::string_view dir :
       absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
    candidates.push_back(absl::StrCat(dir, "/", kServerName));
  }
  for (const std::string& candidate : candidates) {
    if (IsExecutableFile(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(
      "cannot find ", kServerName, " next to ",
      self.empty() ? std::string("this program") : self,
      ", in the build tree or on PATH; build it (cmake --build build --target ",
      kServerName, ") or pass --server PATH"));
}

DaemonCommand BuildDaemonCommand(const LaunchOptions& options, int rank,
                                 const std::string& address_dir,
                                 const std::vector<std::string>& launch_flags) {
  DaemonCommand command;
  const std::string master = MasterAddress(options.host);
  const int port = options.base_port > 0 ? options.base_port + rank : 0;
  command.address_file = absl::StrCat(address_dir, "/rank", rank, ".address");
  command.args = {"--rank",
                  absl::StrCat(rank),
                  "--world-size",
                  absl::StrCat(options.nproc),
                  "--local-rank",
                  absl::StrCat(rank),
                  "--local-world-size",
                  absl::StrCat(options.nproc),
                  "--master-addr",
                  master,
                  "--master-port",
                  absl::StrCat(options.master_port),
                  "--host",
                  options.host,
                  "--port",
                  absl::StrCat(port),
                  "--device",
                  options.cpu ? "cpu" : "auto",
                  "--address-file",
                  command.address_file};
  if (options.metrics_base_port >= 0) {
    command.metrics_address_file =
        absl::StrCat(address_dir, "/rank", rank, ".metrics");
    const int metrics_port =
        options.metrics_base_port > 0 ? options.metrics_base_port + rank : 0;
    command.args.insert(
        command.args.end(),
        {"--metrics-port", absl::StrCat(metrics_port), "--metrics-address-file",
         command.metrics_address_file});
  }
  if (!options.log_level.empty()) {
    command.args.push_back("--log-level");
    command.args.push_back(options.log_level);
  }
  if (!options.store.empty() && options.store != kEmbeddedStore) {
    command.args.push_back("--store");
    command.args.push_back(options.store);
  }
  if (!options.checkpoint_root.empty()) {
    command.args.push_back("--checkpoint-root");
    command.args.push_back(options.checkpoint_root);
  }
  command.args.insert(command.args.end(), launch_flags.begin(),
                      launch_flags.end());
  command.args.insert(command.args.end(), options.server_flags.begin(),
                      options.server_flags.end());
  command.env = {{"RANK", absl::StrCat(rank)},
                 {"WORLD_SIZE", absl::StrCat(options.nproc)},
                 {"LOCAL_RANK", absl::StrCat(rank)},
                 {"LOCAL_WORLD_SIZE", absl::StrCat(options.nproc)},
                 {"MASTER_ADDR", master},
                 {"MASTER_PORT", absl::StrCat(options.master_port)}};
  return command;
}

int RunLaunch(const LaunchOptions& options, const CommandContext& context) {
  const absl::Status valid = ValidateLaunchOptions(options);
  if (!valid.ok()) return context.ReportUserError(kLaunchCommand, valid);

  std::string self(4096, '\0');
  const ssize_t length = ::readlink("/proc/self/exe", self.data(), self.size());
  self.resize(length > 0 ? static_cast<size_t>(length) : 0);
  const char* path_env = std::getenv("PATH");
  absl::StatusOr<std::string> server = FindServerBinary(
      options.server, self, path_env != nullptr ? path_env : "");
  if (!server.ok()) {
    context.PrintError(kLaunchCommand, server.status().message());
    return kExitFailure;
  }

  LaunchOptions resolved = options;
  if (resolved.checkpoint_root.empty()) {
    std::error_code error;
    resolved.checkpoint_root = std::filesystem::current_path(error).string();
    if (error) {
      context.PrintError(kLaunchCommand, absl::StrCat("cannot read the working "
                                                      "directory: ",
                                                      error.message()));
      return kExitFailure;
    }
  }
  Supervisor supervisor(resolved, context);
  absl::Status status = supervisor.Prepare();
  if (status.ok()) status = supervisor.StartAll(*server);
  if (!status.ok()) {
    context.PrintError(kLaunchCommand, status.message());
    return kExitFailure;
  }
  return supervisor.Supervise();
}

void AddLaunchCommand(CLI::App& app, CommandContext& context) {
  CLI::App* launch = app.add_subcommand(
      std::string(kLaunchCommand),
      "Start N tessera-server daemons on this host (like torchrun), restart "
      "one that dies, and stop them all on Ctrl-C");
  auto flags = std::make_shared<LaunchFlags>();
  LaunchSettings().AddTo(*launch, *flags);
  launch->footer(
      "Examples:\n"
      "  tessera launch --nproc 4 --cpu\n"
      "  tessera launch --nproc 4 --cpu --secure\n"
      "  tessera launch --nproc 8 --host 0.0.0.0 --secure --log-dir "
      "/tmp/tessera\n"
      "  tessera launch --nproc 2 --cpu -- --shutdown-grace 30s\n\n"
      "Each daemon gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and\n"
      "MASTER_PORT (and the same flags). The store is a local etcd member\n"
      "the launch runs (etcd-server; mutual TLS on loopback), so any daemon,\n"
      "rank 0 included, is restarted when it dies (--max-restarts). Once\n"
      "all serve, the store's line, one line per rank and 'ready: export\n"
      "TESSERA_ADDRESS=...' are printed; Ctrl-C stops them all.\n\n"
      "Exit status: 0 after Ctrl-C (SIGINT, SIGTERM, SIGHUP), 1 when a daemon "
      "or the store cannot be started, does not serve in time or exits past "
      "--max-restarts, 2 for a usage error.");
  RunWhenParsed(
      launch, context, kLaunchCommand, flags,
      [](const LaunchFlags& given, const CommandContext& context) {
        absl::StatusOr<LaunchOptions> options =
            ResolveLaunchOptions(given, [](const std::string& name) {
              const char* value = std::getenv(name.c_str());
              return value == nullptr ? std::nullopt
                                      : std::optional<std::string>(value);
            });
        if (!options.ok()) {
          return context.ReportUserError(kLaunchCommand, options.status());
        }
        return RunLaunch(*options, context);
      });
}

}  // namespace tessera::cli
