#include "tests/testing/daemon_cluster.h"

#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace tessera::testing {
namespace {

// The address a daemon wrote once serving; nullopt until it did.
std::optional<std::string> ReadAddressFile(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line) || line.empty()) return std::nullopt;
  return std::string(absl::StripAsciiWhitespace(line));
}

}  // namespace

absl::StatusOr<int> PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    int error = errno;
    close(fd);
    return absl::InternalError(strerror(error));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

absl::StatusOr<std::unique_ptr<DaemonCluster>> DaemonCluster::Start(
    DaemonClusterOptions options) {
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<std::unique_ptr<DaemonCluster>> cluster = StartOnce(options);
    // Rank 0's words when its store port was taken (server/daemon).
    if (cluster.ok() || attempt == 3 ||
        !absl::StrContains(cluster.status().message(), "(--master-port)")) {
      return cluster;
    }
  }
}

absl::StatusOr<std::unique_ptr<DaemonCluster>> DaemonCluster::StartOnce(
    const DaemonClusterOptions& options) {
  std::unique_ptr<DaemonCluster> cluster(new DaemonCluster());
  char dir_template[] = "/tmp/tessera-daemons-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  cluster->dir_ = dir_template;
  absl::StatusOr<int> master_port = PickFreePort();
  if (!master_port.ok()) return master_port.status();

  const bool hosts = !options.hosts.empty();
  if (hosts && static_cast<int>(options.hosts.size()) != options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("DaemonClusterOptions::hosts names ", options.hosts.size(),
                     " hosts for ", options.world_size, " daemons"));
  }
  const std::string master =
      hosts ? options.hosts[0].address : std::string("127.0.0.1");
  cluster->store_address_ = absl::StrCat(master, ":", *master_port);
  for (int rank = 0; rank < options.world_size; ++rank) {
    // Local rank and local world size: per host.
    int local_rank = rank;
    int local_world = options.world_size;
    if (hosts) {
      local_rank = 0;
      local_world = 0;
      for (int r = 0; r < options.world_size; ++r) {
        if (options.hosts[r].netns != options.hosts[rank].netns) continue;
        if (r < rank) ++local_rank;
        ++local_world;
      }
    }
    SpawnOptions spawn;
    spawn.program = options.server_path;
    spawn.args = {"--rank",
                  absl::StrCat(rank),
                  "--world-size",
                  absl::StrCat(options.world_size),
                  "--master-addr",
                  master,
                  "--master-port",
                  absl::StrCat(*master_port),
                  "--host",
                  hosts ? options.hosts[rank].address : "127.0.0.1",
                  "--port",
                  "0",
                  "--local-rank",
                  absl::StrCat(local_rank),
                  "--local-world-size",
                  absl::StrCat(local_world),
                  "--device",
                  options.device,
                  "--address-file",
                  absl::StrCat(cluster->dir_, "/rank", rank, ".address")};
    if (options.checkpoint_root) {
      spawn.args.push_back("--checkpoint-root");
      spawn.args.push_back(cluster->dir_);
    }
    spawn.args.insert(spawn.args.end(), options.extra_args.begin(),
                      options.extra_args.end());
    // The daemons must not pick up a launcher's environment.
    spawn.unset_env = {"RANK",          "WORLD_SIZE",
                       "LOCAL_RANK",    "LOCAL_WORLD_SIZE",
                       "MASTER_ADDR",   "MASTER_PORT",
                       "SLURM_PROCID",  "SLURM_NTASKS",
                       "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"};
    spawn.log_path = absl::StrCat(cluster->dir_, "/rank", rank, ".log");
    if (hosts) {
      // `ip netns exec` enters the namespace and execs the daemon: the pid
      // stays the daemon's.
      spawn.args.insert(
          spawn.args.begin(),
          {"netns", "exec", options.hosts[rank].netns, options.server_path});
      spawn.program = "ip";
      spawn.search_path = true;
    }
    cluster->spawns_.push_back(spawn);
    absl::StatusOr<Subprocess> daemon = Subprocess::Spawn(std::move(spawn));
    if (!daemon.ok()) return daemon.status();
    cluster->daemons_.push_back(*std::move(daemon));
  }

  cluster->addresses_.resize(options.world_size);
  cluster->start_timeout_ = options.start_timeout;
  const absl::Time deadline = absl::Now() + options.start_timeout;
  for (int rank = 0; rank < options.world_size; ++rank) {
    absl::Status serving = cluster->WaitServing(rank, deadline);
    if (!serving.ok()) return serving;
  }
  return cluster;
}

absl::Status DaemonCluster::WaitServing(int rank, absl::Time deadline) {
  const std::string path = absl::StrCat(dir_, "/rank", rank, ".address");
  while (true) {
    if (std::optional<std::string> address = ReadAddressFile(path)) {
      addresses_[rank] = *address;
      return absl::OkStatus();
    }
    Subprocess& daemon = daemons_[rank];
    if (std::optional<int> status = daemon.WaitFor(absl::ZeroDuration())) {
      return absl::InternalError(absl::StrCat(
          "daemon ", rank, " exited (", DescribeWaitStatus(*status),
          ") before serving:\n", daemon.LogTail()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "daemon ", rank, " did not serve within ",
          absl::FormatDuration(start_timeout_), ":\n", daemon.LogTail()));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::Status DaemonCluster::Restart(int rank) {
  if (!daemons_[rank].WaitFor(absl::ZeroDuration()).has_value()) {
    daemons_[rank].Kill();
    daemons_[rank].WaitFor(absl::Seconds(10));
  }
  std::filesystem::remove(absl::StrCat(dir_, "/rank", rank, ".address"));
  SpawnOptions spawn = spawns_[rank];
  spawn.log_path = absl::StrCat(dir_, "/rank", rank, ".", ++restarts_, ".log");
  absl::StatusOr<Subprocess> daemon = Subprocess::Spawn(std::move(spawn));
  if (!daemon.ok()) return daemon.status();
  daemons_[rank] = *std::move(daemon);
  return WaitServing(rank, absl::Now() + start_timeout_);
}

DaemonCluster::~DaemonCluster() {
  for (Subprocess& daemon : daemons_) daemon.Signal(SIGTERM);
  for (Subprocess& daemon : daemons_) {
    if (!daemon.WaitFor(absl::Seconds(10)).has_value()) daemon.Kill();
  }
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

std::string DaemonCluster::Log(int rank, size_t max_bytes) const {
  return daemons_[rank].LogTail(max_bytes);
}

void DaemonCluster::Kill(int rank) { daemons_[rank].Kill(); }

absl::Status DaemonCluster::Stop(int rank) {
  return StopProcess(daemons_[rank].pid());
}

void DaemonCluster::Resume(int rank) { daemons_[rank].Signal(SIGCONT); }

absl::Status StopProcess(pid_t pid, absl::Duration timeout) {
  if (kill(pid, SIGSTOP) != 0) {
    return absl::InternalError(
        absl::StrCat("SIGSTOP to ", pid, ": ", std::strerror(errno)));
  }
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  const absl::Time deadline = absl::Now() + timeout;
  int stopped = 0, threads = 0;
  while (absl::Now() < deadline) {
    stopped = threads = 0;
    std::error_code error;
    for (const auto& task : std::filesystem::directory_iterator(tasks, error)) {
      std::ifstream in(task.path() / "stat");
      std::string line;
      std::getline(in, line);
      // "tid (comm) S ...": the state follows the last parenthesis.
      const size_t paren = line.rfind(')');
      ++threads;
      if (paren != std::string::npos && paren + 2 < line.size() &&
          (line[paren + 2] == 'T' || line[paren + 2] == 't')) {
        ++stopped;
      }
    }
    if (!error && threads > 0 && stopped == threads) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::InternalError(absl::StrCat("process ", pid, ": ", stopped,
                                          " of its ", threads,
                                          " threads stopped after SIGSTOP"));
}

std::optional<int> DaemonCluster::Terminate(int rank, absl::Duration timeout) {
  daemons_[rank].Signal(SIGTERM);
  return daemons_[rank].WaitFor(timeout);
}

}  // namespace tessera::testing
