// MultiProcessTest: a GoogleTest fixture whose tests run in W real rank
// processes on loopback (PyTorch's MultiProcessTestCase).
//
//   TEST_F(TestShardedTensorChunked, CompleteWorldSize) {
//     TESSERA_RUN_IN_RANKS();      // the parent stops here
//     ASSERT_OK(InitComms());      // rank processes go on
//     ...
//   }
//
// The parent process (the one ctest starts) starts a fresh StoreServer on
// 127.0.0.1:0, launches W copies of the test binary filtered to the
// current test with TESSERA_TEST_RANK / _WORLD_SIZE / _STORE set, and waits.
// It reports each failing rank's exit status and the tail of its output,
// turns "every rank skipped" into a skip, kills every rank when one has
// failed and the others have not finished within a grace period, and kills
// all of them at the test's deadline — the suite never hangs.
//
// In a rank process the fixture offers PyTorch's with_comms pieces:
// InitPg (default group over Gloo, through the gRPC store), InitRpc (the
// shard server, worker names "worker<rank>"), InitComms (both), and
// TearDown runs DestroyComms (barrier, shutdown) when the test did not.
//
// Thread-safety: a fixture is used by one test thread.
#ifndef TESSERA_TESTS_TESTING_MULTI_PROCESS_H_
#define TESSERA_TESTS_TESTING_MULTI_PROCESS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/rank/rank.h"
#include "server/store/store.h"

namespace tessera::testing {

class MultiProcessTest : public ::testing::Test {
 protected:
  // PyTorch's TEST_GPU_NUM.
  static constexpr int kWorldSize = 4;

  // Whether this process is one of the ranks (rather than the launcher).
  static bool IsRankProcess();
  // Launches the ranks for the current test and records their outcome.
  void RunRanks(absl::Duration deadline = absl::Seconds(120));

  // In a rank process:
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::shared_ptr<Store>& store();
  absl::Status InitPg(const std::string& backend = "gloo");
  absl::Status InitRpc(const RpcOptions& options = {});
  absl::Status InitComms(bool init_rpc = true,
                         const std::string& backend = "gloo");
  absl::Status DestroyComms();
  // Drops this rank without the closing barrier (for tests where a peer has
  // died and a barrier could only time out).
  void AbandonComms();
  const std::shared_ptr<Rank>& rank_runtime() const { return runtime_; }

  void SetUp() override;
  void TearDown() override;

  // How long collectives and rendezvous wait for a peer in rank processes:
  // well below RunRanks' deadline, so a dead peer fails a test quickly.
  static constexpr absl::Duration kRankTimeout = absl::Seconds(30);

 private:
  int rank_ = -1;
  int world_size_ = 0;
  std::shared_ptr<Store> store_;
  std::shared_ptr<Rank> runtime_;
};

// The first statement of a multi-process test body.
#define TESSERA_RUN_IN_RANKS() \
  do {                         \
    if (!IsRankProcess()) {    \
      RunRanks();              \
      return;                  \
    }                          \
  } while (false)

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_MULTI_PROCESS_H_
