// A cluster of real `tessera-server` processes on loopback, for
// integration tests: world_size daemons with a fresh master port, each on a
// free gRPC port (--port 0) reported through --address-file, logs in a
// temporary directory. The destructor stops every daemon (SIGTERM, then
// SIGKILL after a grace period).
//
// Thread-compatible.
#ifndef TESSERA_TESTS_TESTING_DAEMON_CLUSTER_H_
#define TESSERA_TESTS_TESTING_DAEMON_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "io/subprocess.h"

namespace tessera::testing {

struct DaemonClusterOptions {
  int world_size = 4;
  // The tessera-server executable.
  std::string server_path;
  // --device of every daemon. All run on this host, so each also gets its
  // index as --local-rank and world_size as --local-world-size: with
  // "cuda" they spread over the visible GPUs, sharing them (over Gloo)
  // when there are fewer GPUs than daemons.
  std::string device = "cpu";
  // Whether the daemons get the scratch directory as --checkpoint-root (so
  // that checkpoint paths inside it are allowed).
  bool checkpoint_root = true;
  // More flags for every daemon.
  std::vector<std::string> extra_args;
  // Daemons as separate hosts (tests/testing/netns.h), by rank: each runs
  // in `netns` (`ip netns exec`) listening on `address`, rank 0's address
  // is the master's, and local ranks count per host. Empty: every daemon
  // on this host's loopback. Addresses beyond loopback need --insecure or
  // authentication in extra_args.
  struct Host {
    std::string netns;
    std::string address;
  };
  std::vector<Host> hosts;
  // Bounds the wait for every daemon to serve.
  absl::Duration start_timeout = absl::Seconds(60);
};

class DaemonCluster {
 public:
  // Starts the daemons and waits until every one serves. On failure the
  // started ones are stopped and the error quotes the failing daemon's log.
  // The store's port is picked free a moment before rank 0 binds it; when
  // another process took it in between, the cluster starts again on a new
  // one (3 tries).
  static absl::StatusOr<std::unique_ptr<DaemonCluster>> Start(
      DaemonClusterOptions options);

  ~DaemonCluster();

  int world_size() const { return static_cast<int>(daemons_.size()); }
  // The gRPC address ("127.0.0.1:port") of `rank`.
  const std::string& address(int rank) const { return addresses_[rank]; }
  // Where rank 0 serves the store ("127.0.0.1:port").
  const std::string& store_address() const { return store_address_; }
  Subprocess& daemon(int rank) { return daemons_[rank]; }
  // Its log so far (the last `max_bytes`).
  std::string Log(int rank, size_t max_bytes = 8192) const;
  // A directory that lives as long as the cluster (checkpoints, files); the
  // daemons' checkpoint root unless the options said otherwise.
  const std::string& scratch_dir() const { return dir_; }

  // SIGKILL: the daemon dies without a goodbye.
  void Kill(int rank);
  // SIGTERM and wait up to `timeout`: its wait status, or nullopt when it
  // did not exit in time.
  std::optional<int> Terminate(int rank, absl::Duration timeout);
  // SIGSTOP, then waits until every thread of `rank` is stopped: kill(2)
  // returns once the signal is queued, and under load a thread of the
  // daemon could still answer (or take part in a publish) for a moment.
  // INTERNAL when they were not all stopped within 10 s.
  absl::Status Stop(int rank);
  // SIGCONT.
  void Resume(int rank);
  // Starts `rank` again with the same flags (after it died; a live one is
  // killed first), as systemd or Kubernetes would, and waits until it
  // serves (its new address in address(rank)).
  absl::Status Restart(int rank);

 private:
  DaemonCluster() = default;
  static absl::StatusOr<std::unique_ptr<DaemonCluster>> StartOnce(
      const DaemonClusterOptions& options);
  // Waits for `rank`'s address file.
  absl::Status WaitServing(int rank, absl::Time deadline);

  std::string dir_;
  std::vector<Subprocess> daemons_;
  std::vector<SpawnOptions> spawns_;
  absl::Duration start_timeout_;
  int restarts_ = 0;
  std::vector<std::string> addresses_;
  std::string store_address_;
};

// The options most suites start with: `world_size` CPU daemons of
// `server_path` with a 10 s rendezvous and collective --timeout, logging
// warnings and worse.
inline DaemonClusterOptions QuietClusterOptions(int world_size,
                                                std::string server_path) {
  DaemonClusterOptions options;
  options.world_size = world_size;
  options.server_path = std::move(server_path);
  options.extra_args = {"--timeout", "10", "--log-level", "warn"};
  return options;
}

// SIGSTOP to `pid`, then waits until /proc says every one of its threads
// is stopped (DaemonCluster::Stop). INTERNAL when the signal cannot be
// sent or they were not all stopped within `timeout`.
absl::Status StopProcess(pid_t pid, absl::Duration timeout = absl::Seconds(10));

// A TCP port that was free on 127.0.0.1 a moment ago.
absl::StatusOr<int> PickFreePort();

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_DAEMON_CLUSTER_H_
