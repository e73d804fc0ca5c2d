// How fast the cluster notices a failure and serves again: real
// tessera-server daemons on this host (tests/testing/daemon_cluster.h), a
// tensor spread over all of them, nothing running while the failure
// happens (the worst case for noticing it: no collective fails, only the
// lease tells). JSON lines, each with the world size, --lease and the
// seconds of every repetition:
//   {"bench":"resilience_kill_detect", ...}  SIGKILL of the last rank until
//       rank 0 reports it waits for that rank (operations are refused
//       naming it from then on)
//   {"bench":"resilience_restart_to_serving", ...}  the killed daemon
//       started again (as systemd would) until a create through rank 0
//       succeeds; "process_start" is the part until the new process serves
//       its address
//   {"bench":"resilience_stall_detect", ...}   SIGSTOP of rank 1 until
//       rank 0 reports it waits for it
//   {"bench":"resilience_resume_to_serving", ...}  SIGCONT until a create
//       succeeds
//   {"bench":"resilience_replicated_writes", "skipped": why}  replicas are
//       not built yet
// With --etcd the store is a 3-member etcd cluster (--store), every line
// says "store":"etcd", and three more are measured:
//   {"bench":"resilience_rank0_kill_detect", ...}  SIGKILL of rank 0 until
//       rank 1 reports it waits for it
//   {"bench":"resilience_rank0_restart_to_serving", ...}  rank 0 started
//       again until a create through rank 1 succeeds
//   {"bench":"resilience_etcd_member_loss", ...}  SIGKILL of the etcd
//       member the daemons talk to, until a create succeeds
#include <signal.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/daemon_state.h"
#include "tests/testing/etcd_cluster.h"

namespace tessera {
namespace {

using bench::JsonLine;
using bench::Median;
using bench::PrintJsonLine;
using bench::Seconds;

struct Config {
  std::string server = TESSERA_SERVER_PATH;
  int world = 4;
  double lease_seconds = 5;
  int reps = 3;
  bool etcd = false;
};

std::function<bool(const v1::ClusterInfo&)> WaitsFor(int rank) {
  const std::string waits = absl::StrCat("waits for ranks [", rank, "]");
  return [waits](const v1::ClusterInfo& info) {
    return absl::StrContains(info.state(), waits);
  };
}

ShardingSpec Spread(int world) {
  std::vector<std::string> placements;
  for (int r = 0; r < world; ++r) {
    placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  }
  return *ChunkShardingSpec::Create(0, placements);
}

// Creates tensors through `via` until one succeeds; the time it took.
absl::StatusOr<absl::Duration> TimeUntilCreate(
    const testing::DaemonCluster& cluster, int world, const std::string& name,
    absl::Time since, absl::Duration timeout, int via = 0) {
  ClientOptions options;
  options.timeout = absl::Seconds(5);
  absl::Status last;
  while (absl::Now() - since < timeout) {
    absl::StatusOr<std::shared_ptr<Client>> client =
        Client::Connect(cluster.address(via), options);
    if (client.ok()) {
      last = (*client)->Create(name, {world * 4, 256}, Spread(world)).status();
      // ALREADY_EXISTS: an earlier try whose call ended (its deadline) went
      // through after all; the cluster serves.
      if (last.ok() || absl::IsAlreadyExists(last)) {
        return absl::Now() - since;
      }
    } else {
      last = client.status();
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat("no create succeeded within ",
                                                  absl::FormatDuration(timeout),
                                                  ": ", last.ToString()));
}

struct Samples {
  std::vector<double> kill_detect, restart_serving, process_start, stall_detect,
      resume_serving, rank0_kill_detect, rank0_restart_serving,
      etcd_member_loss;
};

absl::Status RunOnce(const Config& config, int rep, Samples* samples) {
  testing::DaemonClusterOptions options;
  options.world_size = config.world;
  options.server_path = config.server;
  options.extra_args = {"--lease",     absl::StrCat(config.lease_seconds, "s"),
                        "--timeout",   "30s",
                        "--log-level", "error"};
  std::unique_ptr<testing::EtcdCluster> etcd;
  if (config.etcd) {
    ASSIGN_OR_RETURN(etcd, testing::EtcdCluster::Start(3));
    options.extra_args.push_back("--store");
    options.extra_args.push_back(etcd->Url(absl::StrCat("bench", rep)));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<testing::DaemonCluster> cluster,
                   testing::DaemonCluster::Start(options));
  const absl::Duration patience = absl::Seconds(config.lease_seconds * 4 + 30);
  const int last = config.world - 1;
  RETURN_IF_ERROR(
      TimeUntilCreate(*cluster, config.world, "before", absl::Now(), patience)
          .status());

  // A death, noticed by the lease alone.
  absl::Time start = absl::Now();
  cluster->Kill(last);
  ASSIGN_OR_RETURN(absl::Duration detected,
                   testing::TimeUntilDaemonState(
                       cluster->address(0), WaitsFor(last), start, patience));
  samples->kill_detect.push_back(Seconds(detected));
  // Started again, as systemd would.
  start = absl::Now();
  RETURN_IF_ERROR(cluster->Restart(last));
  samples->process_start.push_back(Seconds(absl::Now() - start));
  ASSIGN_OR_RETURN(
      absl::Duration serving,
      TimeUntilCreate(*cluster, config.world,
                      absl::StrCat("after_restart_", rep), start, patience));
  samples->restart_serving.push_back(Seconds(serving));

  // A stall, noticed by the lease, then a resume.
  const pid_t stalled = cluster->daemon(1).pid();
  start = absl::Now();
  ::kill(stalled, SIGSTOP);
  absl::StatusOr<absl::Duration> stall_detected = testing::TimeUntilDaemonState(
      cluster->address(0), WaitsFor(1), start, patience);
  start = absl::Now();
  ::kill(stalled, SIGCONT);
  RETURN_IF_ERROR(stall_detected.status());
  samples->stall_detect.push_back(Seconds(*stall_detected));
  ASSIGN_OR_RETURN(
      absl::Duration resumed,
      TimeUntilCreate(*cluster, config.world, absl::StrCat("after_stall_", rep),
                      start, patience));
  samples->resume_serving.push_back(Seconds(resumed));
  if (!config.etcd) return absl::OkStatus();

  // Rank 0 is no different with the store in etcd: rank 1 watches it.
  start = absl::Now();
  cluster->Kill(0);
  ASSIGN_OR_RETURN(absl::Duration rank0_detected,
                   testing::TimeUntilDaemonState(cluster->address(1),
                                                 WaitsFor(0), start, patience));
  samples->rank0_kill_detect.push_back(Seconds(rank0_detected));
  start = absl::Now();
  RETURN_IF_ERROR(cluster->Restart(0));
  ASSIGN_OR_RETURN(
      absl::Duration rank0_serving,
      TimeUntilCreate(*cluster, config.world, absl::StrCat("after_rank0_", rep),
                      start, patience, /*via=*/1));
  samples->rank0_restart_serving.push_back(Seconds(rank0_serving));

  // The etcd member every daemon talks to first dies.
  start = absl::Now();
  etcd->Kill(0);
  ASSIGN_OR_RETURN(absl::Duration member_lost,
                   TimeUntilCreate(*cluster, config.world,
                                   absl::StrCat("after_member_", rep), start,
                                   patience, /*via=*/1));
  samples->etcd_member_loss.push_back(Seconds(member_lost));
  return absl::OkStatus();
}

void Print(const Config& config, const char* name,
           const std::vector<double>& seconds,
           const std::vector<double>* part = nullptr) {
  JsonLine line = {{"bench", name},
                   {"store", config.etcd ? "etcd" : "embedded"},
                   {"world", config.world},
                   {"lease_s", config.lease_seconds},
                   {"median_s", Median(seconds)},
                   {"seconds", seconds}};
  if (part != nullptr) line["process_start_s"] = *part;
  PrintJsonLine(line);
}

int Main(int argc, char** argv) {
  Config config;
  bool quick = false;
  CLI::App app("How fast the cluster notices a failure and serves again");
  app.add_option("--world", config.world, "daemons")->capture_default_str();
  app.add_option("--lease", config.lease_seconds, "--lease of the daemons, s")
      ->capture_default_str();
  app.add_option("--reps", config.reps, "repetitions")->capture_default_str();
  app.add_option("--server", config.server, "tessera-server")
      ->capture_default_str();
  app.add_flag("--quick", quick, "3 daemons, a 1 s lease, one repetition");
  app.add_flag("--etcd", config.etcd,
               "the store in a 3-member etcd cluster; rank 0's death and an "
               "etcd member's too");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    config.world = 3;
    config.lease_seconds = 1;
    config.reps = 1;
  }
  if (config.world < 2 || config.reps < 1 || config.lease_seconds <= 0) {
    std::cerr << "resilience_bench: --world >= 2, --reps >= 1, --lease > 0\n";
    return 2;
  }
  Samples samples;
  for (int rep = 0; rep < config.reps; ++rep) {
    absl::Status ran = RunOnce(config, rep, &samples);
    if (!ran.ok()) {
      std::cerr << "resilience_bench: " << ran << "\n";
      return 1;
    }
  }
  Print(config, "resilience_kill_detect", samples.kill_detect);
  Print(config, "resilience_restart_to_serving", samples.restart_serving,
        &samples.process_start);
  Print(config, "resilience_stall_detect", samples.stall_detect);
  Print(config, "resilience_resume_to_serving", samples.resume_serving);
  if (config.etcd) {
    Print(config, "resilience_rank0_kill_detect", samples.rank0_kill_detect);
    Print(config, "resilience_rank0_restart_to_serving",
          samples.rank0_restart_serving);
    Print(config, "resilience_etcd_member_loss", samples.etcd_member_loss);
  }
  PrintJsonLine(
      {{"bench", "resilience_replicated_writes"},
       {"skipped", "replicas (create --replicas) are not built yet"}});
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
