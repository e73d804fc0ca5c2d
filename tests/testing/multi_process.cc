#include "tests/testing/multi_process.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/store/grpc_store.h"
#include "tests/testing/rank_launcher.h"

namespace tessera::testing {
namespace {

// The reason GoogleTest printed for a skip in a rank's output, if any.
std::optional<std::string> SkipReason(const std::string& log) {
  std::string text = ReadTail(log, 1 << 16);
  if (text.find("[  SKIPPED ]") == std::string::npos) return std::nullopt;
  size_t skipped = text.find("Skipped\n");
  if (skipped == std::string::npos) return std::string("skipped");
  size_t start = skipped + 8;
  return text.substr(start, text.find('\n', start) - start);
}

}  // namespace

bool MultiProcessTest::IsRankProcess() { return RankFromEnv().has_value(); }

void MultiProcessTest::SetUp() {
  if (!IsRankProcess()) return;
  rank_ = *RankFromEnv();
  world_size_ = WorldSizeFromEnv();
}

void MultiProcessTest::TearDown() {
  if (runtime_ != nullptr) {
    EXPECT_TRUE(DestroyComms().ok());
  }
}

void MultiProcessTest::RunRanks(absl::Duration deadline) {
  const ::testing::TestInfo* info =
      ::testing::UnitTest::GetInstance()->current_test_info();
  std::string filter = absl::StrCat(info->test_suite_name(), ".", info->name());
  auto server = StoreServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();

  LaunchOptions launch;
  launch.world_size = kWorldSize;
  launch.args = {absl::StrCat("--gtest_filter=", filter)};
  launch.store_address = (*server)->address();
  // Parameterized names contain '/', which a file name cannot.
  std::string name = absl::StrCat("tessera_", getpid(), "_", filter, "_");
  std::replace(name.begin(), name.end(), '/', '_');
  launch.log_prefix = absl::StrCat(::testing::TempDir(), name);
  launch.deadline = deadline;
  auto results = LaunchRanks(launch);
  (*server)->Shutdown();
  ASSERT_TRUE(results.ok()) << results.status();

  int skipped = 0;
  std::string skip_reason;
  for (const RankResult& result : *results) {
    if (!result.ok()) {
      ADD_FAILURE() << "rank " << result.rank << " failed ("
                    << result.Describe() << "); its output ends with:\n"
                    << ReadTail(result.log_path, 6000);
    } else if (auto reason = SkipReason(result.log_path)) {
      ++skipped;
      skip_reason = *reason;
    }
    std::filesystem::remove(result.log_path);
  }
  if (skipped == kWorldSize) GTEST_SKIP() << skip_reason;
}

const std::shared_ptr<Store>& MultiProcessTest::store() {
  if (store_ == nullptr) {
    auto store = GrpcStore::Connect(StoreFromEnv(), kRankTimeout);
    if (store.ok()) {
      (*store)->set_timeout(kRankTimeout);
      store_ = *store;
    }
  }
  return store_;
}

absl::Status MultiProcessTest::InitPg(const std::string& backend) {
  if (store() == nullptr) {
    return absl::UnavailableError("cannot reach the test's store");
  }
  RankOptions options;
  options.rank = rank_;
  options.world_size = world_size_;
  options.store = store();
  options.backend = backend;
  options.timeout = kRankTimeout;
  auto runtime = Rank::Init(options);
  if (!runtime.ok()) return runtime.status();
  runtime_ = *runtime;
  SetDefaultRank(runtime_);
  return absl::OkStatus();
}

absl::Status MultiProcessTest::InitRpc(const RpcOptions& options) {
  if (runtime_ == nullptr) {
    return absl::FailedPreconditionError("InitPg before InitRpc");
  }
  return runtime_->InitRpc(options);
}

absl::Status MultiProcessTest::InitComms(bool init_rpc,
                                         const std::string& backend) {
  absl::Status status = InitPg(backend);
  if (status.ok() && init_rpc) status = InitRpc();
  return status;
}

void MultiProcessTest::AbandonComms() {
  SetDefaultRank(nullptr);
  runtime_.reset();
}

absl::Status MultiProcessTest::DestroyComms() {
  if (runtime_ == nullptr) return absl::OkStatus();
  absl::Status status = runtime_->Shutdown();
  SetDefaultRank(nullptr);
  runtime_.reset();
  return status;
}

}  // namespace tessera::testing
