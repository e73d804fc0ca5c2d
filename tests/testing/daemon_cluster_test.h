// A gtest fixture over one DaemonCluster per test suite: a suite starts its
// cluster in SetUpTestSuite (StartSuiteCluster) and stops it in
// TearDownTestSuite; every test gets a client of rank 0 and, after it, a
// check that every daemon still runs (ExpectDaemonsRunning, also for
// fixtures of their own, quoting the log of one that died).
// Header-only: the tests that use it link the client library.
#ifndef TESSERA_TESTS_TESTING_DAEMON_CLUSTER_TEST_H_
#define TESSERA_TESTS_TESTING_DAEMON_CLUSTER_TEST_H_

#include <memory>
#include <utility>

#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {

// Every daemon of `cluster` still runs (the log of one that died quoted).
inline void ExpectDaemonsRunning(DaemonCluster& cluster) {
  for (int r = 0; r < cluster.world_size(); ++r) {
    EXPECT_FALSE(cluster.daemon(r).WaitFor(absl::ZeroDuration()))
        << "daemon " << r << " died:\n"
        << cluster.Log(r);
  }
}

class DaemonClusterTest : public ::testing::Test {
 protected:
  static void StartSuiteCluster(DaemonClusterOptions options) {
    absl::StatusOr<std::unique_ptr<DaemonCluster>> cluster =
        DaemonCluster::Start(std::move(options));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(cluster_->address(0)));
  }

  // After every test: all daemons still run.
  void TearDown() override {
    if (cluster_ != nullptr) ExpectDaemonsRunning(*cluster_);
  }

  inline static DaemonCluster* cluster_ = nullptr;
  std::shared_ptr<Client> client_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_DAEMON_CLUSTER_TEST_H_
