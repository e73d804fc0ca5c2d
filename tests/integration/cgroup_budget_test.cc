// Daemons under a real cgroup memory limit (tests/testing/test_cgroup.h),
// cgroup v1 and v2, with no --memory-limit: each of 4 real
// `tessera-server` processes joins a cgroup of its own, limited to 384 MiB,
// before it execs (as under a systemd unit, a Kubernetes pod or Slurm's
// task/cgroup), and must take its default budget from that cgroup
// (server/daemon/cgroup_memory.h) rather than from the host: creates
// beyond it and concurrent region reads and writes that would stage more
// than it are refused with RESOURCE_EXHAUSTED, and no daemon is OOM-killed.
// The issue this answers: 4 daemons in 768 MiB v1 cgroups took 2.75 GiB of
// creates and were killed, as were 8 concurrent ReadRegion calls in a 2 GiB
// one, because the budget read the root cgroup's file.
//
// A hierarchy this host lacks (or cannot delegate, or a run without root)
// skips its instance, saying why.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/region_transfer.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/gauge.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_cgroup.h"
#include "wire/auth.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::GaugeValue;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TestCgroup;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kWorld = 4;
constexpr int64_t kMiB = int64_t{1} << 20;
// Each daemon's cgroup. Its default budget is half of it (the reserve is a
// tenth, at least 256 MiB, at most half): 192 MiB, of which rank 0 sets
// some aside for the store.
constexpr int64_t kCgroupLimit = 384 * kMiB;

ShardingSpec ChunksOf(int dim) {
  return *ChunkShardingSpec::Create(
      dim, {"rank:0/cpu", "rank:1/cpu", "rank:2/cpu", "rank:3/cpu"});
}

class CgroupBudgetTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    static int next = 0;
    const std::string prefix =
        absl::StrCat("tessera-test-", getpid(), "-", next++, "-rank");
    for (int r = 0; r < kWorld; ++r) {
      absl::StatusOr<std::unique_ptr<TestCgroup>> cgroup =
          TestCgroup::Create(GetParam(), absl::StrCat(prefix, r), kCgroupLimit);
      if (!cgroup.ok()) {
        GTEST_SKIP() << "no real cgroup v" << GetParam()
                     << " for this test: " << cgroup.status().message();
      }
      cgroups_.push_back(*std::move(cgroup));
    }
    // Every daemon joins its rank's cgroup, then becomes tessera-server
    // (the same pid, as a service manager starts it).
    char dir[] = "/tmp/tessera_cgroup_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr) << std::strerror(errno);
    wrapper_dir_ = dir;
    const std::string base = cgroups_[0]->dir().substr(
        0, cgroups_[0]->dir().size() - 1);  // "...-rank"
    const std::string wrapper = wrapper_dir_ + "/tessera-server-in-cgroup";
    std::ofstream(wrapper)
        << "#!/bin/sh\n"
           "rank=\n"
           "prev=\n"
           "for arg in \"$@\"; do\n"
           "  if [ \"$prev\" = --rank ]; then rank=$arg; fi\n"
           "  prev=$arg\n"
           "done\n"
           "echo $$ > '"
        << base
        << "'$rank/cgroup.procs || exit 97\n"
           "exec '" TESSERA_SERVER_PATH "' \"$@\"\n";
    ASSERT_EQ(chmod(wrapper.c_str(), 0755), 0);

    DaemonClusterOptions options;
    options.world_size = kWorld;
    options.server_path = wrapper;
    options.extra_args = {"--timeout", "20", "--log-level", "info"};
    ASSERT_OK_AND_ASSIGN(cluster_, DaemonCluster::Start(std::move(options)));
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(cluster_->address(0)));
  }

  void TearDown() override {
    // The daemons leave their cgroups before these are removed.
    client_.reset();
    cluster_.reset();
    cgroups_.clear();
    if (!wrapper_dir_.empty()) std::filesystem::remove_all(wrapper_dir_);
  }

  // Every daemon still serves, and the kernel killed nothing.
  void ExpectAliveAndNeverOomKilled() {
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_FALSE(cluster_->daemon(r).WaitFor(absl::ZeroDuration()))
          << "daemon " << r << " died:\n"
          << cluster_->Log(r);
      EXPECT_THAT(cgroups_[r]->OomKills(), IsOkAndHolds(0)) << "rank " << r;
    }
  }

  std::unique_ptr<v1::ControlService::Stub> Stub(int r) {
    // With the process's token, as the daemons require of root's clients.
    return v1::ControlService::NewStub(
        CreateTesseraChannel(cluster_->address(r)));
  }

  // What rank r's budget has reserved (its tessera_memory_budget_used_bytes
  // gauge, through GetStats); -1 when it cannot say.
  int64_t BudgetUsed(int r) {
    v1::DaemonStats stats;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (!Stub(r)->GetStats(&context, v1::GetStatsRequest(), &stats).ok()) {
      return -1;
    }
    return GaugeValue(stats.metrics(), "tessera_memory_budget_used_bytes");
  }

  // Waits until rank r's budget is back to `used` bytes: a call gives its
  // reservation back when the daemon is done with it, which may be just
  // after its caller heard the answer.
  void ExpectBudgetBackTo(int r, int64_t used) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (BudgetUsed(r) != used && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(BudgetUsed(r), used) << "rank " << r;
  }

  // Declared first: destroyed after the daemons in them.
  std::vector<std::unique_ptr<TestCgroup>> cgroups_;
  std::string wrapper_dir_;
  std::unique_ptr<DaemonCluster> cluster_;
  std::shared_ptr<Client> client_;
};

// What a ReadRegion call through rank 0 got.
struct ReadOutcome {
  grpc::Status status;
  int64_t bytes = 0;
  bool all_equal = true;  // every float was `value`
};

ReadOutcome ReadThrough(v1::ControlService::Stub& stub, const std::string& name,
                        std::vector<int64_t> offsets,
                        std::vector<int64_t> sizes, float value) {
  v1::ReadRegionRequest request;
  request.set_name(name);
  for (int64_t x : offsets) request.add_offsets(x);
  for (int64_t x : sizes) request.add_sizes(x);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = stub.ReadRegion(&context, request);
  v1::ShardChunk chunk;
  ReadOutcome outcome;
  while (reader->Read(&chunk)) {
    const std::string& data = chunk.data();
    for (size_t i = 0; i + sizeof(float) <= data.size(); i += sizeof(float)) {
      float x;
      std::memcpy(&x, data.data() + i, sizeof(x));
      if (x != value) outcome.all_equal = false;
    }
    outcome.bytes += static_cast<int64_t>(data.size());
  }
  outcome.status = reader->Finish();
  return outcome;
}

TEST_P(CgroupBudgetTest, DaemonsBudgetFromTheirCgroupAndRefuseCreates) {
  for (int r = 0; r < kWorld; ++r) {
    // "memory budget: 192 MiB (the default: the memory limit of its cgroup
    // (<its dir>/memory.limit_in_bytes: 402653184 bytes), less a reserve)"
    EXPECT_THAT(cluster_->Log(r, 1 << 20),
                AllOf(HasSubstr("memory budget: 192 MiB"),
                      HasSubstr(absl::StrCat(cgroups_[r]->limit_file(), ": ",
                                             kCgroupLimit, " bytes"))))
        << "rank " << r;
  }
  // 32 MiB per daemon each, filled (every page touched): twice the cgroup
  // in all, if nothing refused them.
  CreateOptions ones;
  ones.init = TensorInit::kOnes;
  int created = 0;
  absl::Status refused;
  for (int i = 0; i < 24 && refused.ok(); ++i) {
    refused = client_
                  ->Create(absl::StrCat("t", i), {kWorld * 32 * 256, 1024},
                           ChunksOf(0), ones)
                  .status();
    if (refused.ok()) ++created;
  }
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                AllOf(HasSubstr("bytes of host memory"),
                                      HasSubstr("the memory limit of its "
                                                "cgroup"))));
  // Within the 192 MiB budget of every daemon.
  EXPECT_GE(created, 3);
  EXPECT_LE(created, 6);
  ExpectAliveAndNeverOomKilled();
  // What was created still reads back.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView t0, client_->Open("t0"));
  ASSERT_OK_AND_ASSIGN(Tensor corner, t0.ReadRegion({8191, 1022}, {2, 2}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(corner.data<float>()[i], 1.0f);
}

TEST_P(CgroupBudgetTest, ConcurrentRegionCallsStageWithinTheLimit) {
  // 80 MiB per daemon, in columns: rank 0 has 64 MiB of its budget left
  // (less the store's share).
  CreateOptions ones;
  ones.init = TensorInit::kOnes;
  ASSERT_OK(client_->Create("wide", {20480, kWorld * 1024}, ChunksOf(1), ones)
                .status());
  auto stub = Stub(0);
  const int64_t baseline = BudgetUsed(0);
  ASSERT_GT(baseline, 80 * kMiB);

  // Eight concurrent 12-byte reads across ranks 0 and 1 all go through.
  {
    std::vector<ReadOutcome> outcomes(8);
    std::vector<std::thread> threads;
    for (ReadOutcome& outcome : outcomes) {
      threads.emplace_back([&] {
        outcome = ReadThrough(*stub, "wide", {0, 1023}, {1, 3}, 1.0f);
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (const ReadOutcome& outcome : outcomes) {
      EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
      EXPECT_EQ(outcome.bytes, 12);
      EXPECT_TRUE(outcome.all_equal);
    }
  }

  // Reads of 24 MiB from ranks 1 and 2, whose pieces are strided within
  // the region: 24 MiB more staged on rank 0. One fits at a time; eight at
  // once would stage 384 MiB, the whole cgroup, on rank 0.
  const std::vector<int64_t> offsets = {0, 1536};
  const std::vector<int64_t> sizes = {6144, 1024};
  const int64_t region_bytes = 6144 * 1024 * 4;
  int ok = 0;
  int refused = 0;
  for (int round = 0; round < 3 && refused == 0; ++round) {
    std::vector<ReadOutcome> outcomes(8);
    std::vector<std::thread> threads;
    for (ReadOutcome& outcome : outcomes) {
      threads.emplace_back(
          [&] { outcome = ReadThrough(*stub, "wide", offsets, sizes, 1.0f); });
    }
    for (std::thread& thread : threads) thread.join();
    for (const ReadOutcome& outcome : outcomes) {
      if (outcome.status.ok()) {
        ++ok;
        EXPECT_EQ(outcome.bytes, region_bytes);
        EXPECT_TRUE(outcome.all_equal);
        continue;
      }
      ++refused;
      EXPECT_EQ(outcome.status.error_code(),
                grpc::StatusCode::RESOURCE_EXHAUSTED)
          << outcome.status.error_message();
      EXPECT_THAT(outcome.status.error_message(),
                  AllOf(HasSubstr("ReadRegion of tensor wide [0:6144, "
                                  "1536:2560]"),
                        HasSubstr("bytes left")));
      EXPECT_EQ(outcome.bytes, 0);
    }
  }
  // The first to reserve always fits; the others met the budget.
  EXPECT_GT(ok, 0);
  EXPECT_GT(refused, 0);
  ExpectAliveAndNeverOomKilled();
  ExpectBudgetBackTo(0, baseline);

  // Writes of the same region through rank 0 stage the same: each goes
  // through or is refused whole.
  Tensor twos = *Tensor::Empty(sizes);
  for (int64_t i = 0; i < twos.numel(); ++i) twos.data<float>()[i] = 2.0f;
  std::vector<absl::Status> written(8);
  {
    std::vector<std::thread> threads;
    for (absl::Status& status : written) {
      threads.emplace_back([&] {
        RegionWriteOptions options;
        options.deadline = absl::Now() + absl::Seconds(60);
        status =
            WriteRegion(*stub, "wide", "", offsets, twos, options).status();
      });
    }
    for (std::thread& thread : threads) thread.join();
  }
  int writes_ok = 0;
  for (const absl::Status& status : written) {
    if (status.ok()) {
      ++writes_ok;
      continue;
    }
    EXPECT_THAT(status,
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("WriteRegion of tensor wide [0:6144, "
                                   "1536:2560]")));
  }
  EXPECT_GT(writes_ok, 0);
  ExpectAliveAndNeverOomKilled();
  ExpectBudgetBackTo(0, baseline);
  const ReadOutcome after = ReadThrough(*stub, "wide", offsets, sizes, 2.0f);
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_TRUE(after.all_equal);
}

INSTANTIATE_TEST_SUITE_P(Versions, CgroupBudgetTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("CgroupV", info.param);
                         });

}  // namespace
}  // namespace tessera
