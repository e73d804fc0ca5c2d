// The weight-sync example (examples/weight_sync/weight_sync.py, its
// 2-layer model) as real processes against real daemons: 4 trainer
// processes (a Gloo group) publish a version of their row chunks each
// step, 2 reader processes of a TP=2 engine run a read plan and check
// every box they hold against the trainers' checksums; each process exits
// 0 only when that holds for every version it read.
//
// On one host (daemons on loopback), and across two network-namespace
// hosts (tests/testing/netns.h): daemons and trainers on one, the readers
// on the other, so every reader byte crosses the link. Skipped, with the
// reason, where namespaces cannot be made.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/subprocess.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/netns.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::NetnsHosts;

constexpr int kSteps = 3;
constexpr absl::Duration kTimeout = absl::Seconds(240);

// Runs `role` of the example (in network namespace `netns` when not
// empty), logging into the cluster's scratch directory.
absl::StatusOr<Subprocess> Example(const DaemonCluster& cluster,
                                   const std::string& netns,
                                   const std::string& role, int rank,
                                   const std::string& address,
                                   const std::string& rendezvous) {
  SpawnOptions options;
  std::vector<std::string> command = {TESSERA_PYTHON,
                                      TESSERA_SOURCE_DIR
                                      "/examples/weight_sync/weight_sync.py",
                                      role,
                                      "--rank",
                                      absl::StrCat(rank),
                                      "--address",
                                      address,
                                      "--steps",
                                      absl::StrCat(kSteps),
                                      "--timeout",
                                      "200",
                                      "--tiny"};
  if (!rendezvous.empty()) {
    command.push_back("--rendezvous");
    command.push_back(rendezvous);
  }
  if (netns.empty()) {
    options.program = command[0];
    options.args.assign(command.begin() + 1, command.end());
  } else {
    options.program = "ip";
    options.search_path = true;
    options.args = {"netns", "exec", netns};
    options.args.insert(options.args.end(), command.begin(), command.end());
  }
  options.env = {{"PYTHONPATH", TESSERA_PYTHON_DIR}};
  options.log_path =
      absl::StrCat(cluster.scratch_dir(), "/", role, rank, ".log");
  options.stdin_null = true;
  return Subprocess::Spawn(std::move(options));
}

// Starts 4 trainers (in `trainer_netns`) and 2 readers (in
// `reader_netns`) against `address`, and expects each to exit 0 having
// verified the last step.
void RunExample(const DaemonCluster& cluster, const std::string& address,
                const std::string& trainer_netns,
                const std::string& reader_netns, int port) {
  std::vector<Subprocess> readers;
  std::vector<Subprocess> trainers;
  for (int r = 0; r < 2; ++r) {
    ASSERT_OK_AND_ASSIGN(Subprocess reader, Example(cluster, reader_netns,
                                                    "reader", r, address, ""));
    readers.push_back(std::move(reader));
  }
  const std::string rendezvous = absl::StrCat("tcp://127.0.0.1:", port);
  for (int r = 0; r < 4; ++r) {
    ASSERT_OK_AND_ASSIGN(
        Subprocess trainer,
        Example(cluster, trainer_netns, "trainer", r, address, rendezvous));
    trainers.push_back(std::move(trainer));
  }
  const absl::Time until = absl::Now() + kTimeout;
  for (std::vector<Subprocess>* group : {&readers, &trainers}) {
    for (size_t i = 0; i < group->size(); ++i) {
      Subprocess& p = (*group)[i];
      const std::optional<int> status =
          p.WaitFor(std::max(until - absl::Now(), absl::Seconds(1)));
      ASSERT_TRUE(status.has_value()) << "still running:\n" << p.LogTail();
      EXPECT_EQ(*status, 0) << DescribeWaitStatus(*status) << ":\n"
                            << p.LogTail();
    }
  }
  for (Subprocess& reader : readers) {
    EXPECT_THAT(reader.LogTail(),
                ::testing::HasSubstr(absl::StrCat("(step ", kSteps - 1, ")")));
  }
}

// A port for the trainers' Gloo rendezvous, from the test's pid.
int RendezvousPort(int salt) { return 20000 + (getpid() * 7 + salt) % 20000; }

TEST(WeightSyncTest, TheExampleRunsOnOneHost) {
  ASSERT_OK_AND_ASSIGN(
      auto cluster, DaemonCluster::Start(
                        testing::QuietClusterOptions(4, TESSERA_SERVER_PATH)));
  RunExample(*cluster, cluster->address(0), "", "", RendezvousPort(1));
}

TEST(WeightSyncTest, TrainersOnOneHostReadersOnTheOther) {
  absl::StatusOr<std::unique_ptr<NetnsHosts>> made = NetnsHosts::Create(2);
  if (absl::IsFailedPrecondition(made.status())) {
    GTEST_SKIP() << made.status().message();
  }
  ASSERT_OK(made.status());
  std::unique_ptr<NetnsHosts> hosts = *std::move(made);
  DaemonClusterOptions options;
  options.world_size = 4;
  options.server_path = TESSERA_SERVER_PATH;
  for (int r = 0; r < 4; ++r) {
    options.hosts.push_back({hosts->netns(0), hosts->address(0)});
  }
  // Beyond loopback without authentication: a test network.
  options.extra_args = {"--insecure", "--timeout", "10", "--log-level", "warn"};
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(options));
  RunExample(*cluster, cluster->address(0), hosts->netns(0), hosts->netns(1),
             RendezvousPort(2));
}

}  // namespace
}  // namespace tessera
