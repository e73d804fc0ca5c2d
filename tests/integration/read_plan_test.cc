// Read plans (client/read_plan.h) on real `tessera-server` processes on
// loopback (tests/testing/daemon_cluster.h), through the client library.
//
// Covered: every placement kind (row chunks with two shards per daemon,
// enumerable uneven boxes, replicas) read into boxes of other layouts, the
// values checked against the tensor's own; casts (float32 to float16 and
// bfloat16, bfloat16 to float32) rounded as Tensor::ToDType rounds; CUDA
// outs (where a device is);
// fused destinations (q, k and v into one qkv, at their out offsets); a
// plan re-planning by itself after a reshard, a delete and re-create, and
// a daemon restarted between runs; a stalled owner within the deadline
// (read from the replica); a group of versioned tensors published while
// plans run, never mixed, each run's version the one its values say, and
// run(version) of a kept one; tensors numbered apart read at one pinned
// point; the refusals (unknown tensor, boxes outside, overlapping
// sources, a cast between non-floating types); and Client::CreateMany,
// which makes a group of tensors in one logged call, all or none.
#include <signal.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/read_plan.h"
#include "client/version_writer.h"
#include "common/region.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "common/tensor/random.h"
#include "common/tensor/storage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kWorld = 4;

std::string Rank(int r) { return absl::StrCat("rank:", r, "/cpu"); }

// Rows in chunks over every daemon, `times` over: 4 x times shards.
ShardingSpec Rows(int times = 2) {
  std::vector<std::string> placements;
  for (int i = 0; i < times * kWorld; ++i)
    placements.push_back(Rank(i % kWorld));
  return *ChunkShardingSpec::Create(0, placements);
}

// Uneven boxes of a [30, 50] tensor, on ranks 2, 0, 3, 1, 2.
ShardingSpec Uneven() {
  const struct {
    int64_t r, c, rows, cols;
    int rank;
  } boxes[] = {{0, 0, 7, 50, 2},
               {7, 0, 13, 21, 0},
               {7, 21, 13, 29, 3},
               {20, 0, 10, 4, 1},
               {20, 4, 10, 46, 2}};
  std::vector<ShardMetadata> shards;
  for (const auto& b : boxes) {
    shards.push_back(
        *ShardMetadata::Create({b.r, b.c}, {b.rows, b.cols}, Rank(b.rank)));
  }
  return *EnumerableShardingSpec::Create(std::move(shards));
}

// The box [offsets, offsets + sizes) of `whole`, as a contiguous tensor.
Tensor BoxOf(const Tensor& whole, std::vector<int64_t> offsets,
             std::vector<int64_t> sizes) {
  return *(*RegionView(whole, offsets, sizes)).Contiguous();
}

// Whether a and b (same dtype, same sizes) hold the same bytes.
bool Same(const Tensor& a, const Tensor& b) {
  const Tensor x = *a.Contiguous();
  const Tensor y = *b.Contiguous();
  return x.dtype() == y.dtype() && x.sizes() == y.sizes() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

Tensor Empty(std::vector<int64_t> sizes, DType dtype = DType::kFloat32) {
  return *Tensor::Empty(sizes, TensorOptions().WithDType(dtype));
}

// A plan of columns 8-24 of "r" [40, 32], 2 copies of each shard, run
// once: its out and the values it must hold.
struct ReplicatedPlan {
  std::shared_ptr<ReadPlan> plan;
  Tensor out;
  Tensor want;
};

class ReadPlanTest : public ::testing::Test {
 protected:
  void SetUp() override { StartCluster(10); }

  void StartCluster(int timeout_s) {
    testing::DaemonClusterOptions options =
        testing::QuietClusterOptions(kWorld, TESSERA_SERVER_PATH);
    options.extra_args[1] = absl::StrCat(timeout_s);
    ASSERT_OK_AND_ASSIGN(cluster_, DaemonCluster::Start(options));
    ClientOptions patient;
    patient.timeout = absl::Seconds(20);
    ASSERT_OK_AND_ASSIGN(client_,
                         Client::Connect(cluster_->address(0), patient));
  }

  // Creates `name` laid out by `spec` holding random values (seed), and
  // returns them.
  Tensor Make(const std::string& name, std::vector<int64_t> sizes,
              const ShardingSpec& spec, uint64_t seed, int copies = 1,
              DType dtype = DType::kFloat32) {
    CreateOptions options;
    options.copies = copies;
    options.dtype = dtype;
    auto view = client_->Create(name, sizes, spec, options);
    EXPECT_OK(view.status());
    Generator generator(seed);
    Tensor values = *(*Tensor::Randn(sizes, {}, &generator)).ToDType(dtype);
    EXPECT_OK(view->Write(std::vector<int64_t>(sizes.size(), 0), values));
    return values;
  }

  // Runs `plan` within `timeout` while daemon `rank` is stopped (shorter
  // than its --timeout), the `outs` first set to -1: the run's result,
  // expected to take less than the timeout.
  absl::StatusOr<ReadPlanRun> RunWhileStalled(ReadPlan& plan, int rank,
                                              absl::Duration timeout,
                                              const std::vector<Tensor>& outs) {
    for (const Tensor& out : outs) {
      std::fill_n(out.data<float>(), out.numel(), -1.0f);
    }
    TransferOptions bounded;
    bounded.timeout = timeout;
    if (absl::Status stopped = cluster_->Stop(rank); !stopped.ok()) {
      cluster_->Resume(rank);
      return stopped;
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<ReadPlanRun> run = plan.Run(bounded);
    const absl::Duration took = absl::Now() - start;
    cluster_->Resume(rank);
    EXPECT_LT(took, timeout);
    return run;
  }

  // ReplicatedPlan, its values from `seed`.
  absl::StatusOr<ReplicatedPlan> PlanReplicated(uint64_t seed) {
    const Tensor values = Make("r", {40, 32}, Rows(), seed, /*copies=*/2);
    ReplicatedPlan planned;
    planned.out = Empty({40, 16});
    planned.want = BoxOf(values, {0, 8}, {40, 16});
    ASSIGN_OR_RETURN(
        planned.plan,
        client_->PlanReads({ReadItem::Box("r", {0, 8}, planned.out)}));
    RETURN_IF_ERROR(planned.plan->Run().status());
    if (!Same(planned.out, planned.want)) {
      return absl::InternalError("the first run read other values");
    }
    return planned;
  }

  std::unique_ptr<DaemonCluster> cluster_;
  std::shared_ptr<Client> client_;
};

TEST_F(ReadPlanTest, EveryLayoutIsReadIntoOtherBoxes) {
  const Tensor rows = Make("rows", {64, 48}, Rows(), 1);
  const Tensor uneven = Make("uneven", {30, 50}, Uneven(), 2);
  const Tensor copied = Make("copied", {40, 16}, Rows(1), 3, /*copies=*/2);
  // A reader's layouts: column halves, a row band crossing shards, a box
  // inside one uneven shard, one crossing all five, a 1-element box.
  struct Want {
    std::string name;
    std::vector<int64_t> offsets, sizes;
    const Tensor* values;
  };
  const std::vector<Want> wants = {{"rows", {0, 0}, {64, 24}, &rows},
                                   {"rows", {0, 24}, {64, 24}, &rows},
                                   {"rows", {5, 3}, {40, 40}, &rows},
                                   {"uneven", {8, 1}, {3, 4}, &uneven},
                                   {"uneven", {3, 2}, {25, 45}, &uneven},
                                   {"uneven", {29, 49}, {1, 1}, &uneven},
                                   {"copied", {0, 8}, {40, 8}, &copied}};
  std::vector<ReadItem> items;
  std::vector<Tensor> outs;
  for (const Want& want : wants) {
    outs.push_back(Empty(want.sizes));
    items.push_back(ReadItem::Box(want.name, want.offsets, outs.back()));
  }
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ReadPlan> plan,
                       client_->PlanReads(std::move(items)));
  int64_t needed = 0;
  for (const Want& want : wants) needed += want.sizes[0] * want.sizes[1] * 4;
  EXPECT_EQ(plan->bytes(), needed);
  EXPECT_GE(plan->pieces(), wants.size());
  EXPECT_EQ(plan->sources().size(), static_cast<size_t>(kWorld));
  for (int run = 0; run < 3; ++run) {
    ASSERT_OK_AND_ASSIGN(ReadPlanRun done, plan->Run());
    EXPECT_EQ(done.version, 0);
    EXPECT_FALSE(done.replanned);
    EXPECT_EQ(done.bytes, needed);
    for (size_t i = 0; i < wants.size(); ++i) {
      EXPECT_TRUE(Same(
          outs[i], BoxOf(*wants[i].values, wants[i].offsets, wants[i].sizes)))
          << "item " << i << ", run " << run;
    }
  }
  EXPECT_EQ(plan->plans(), 1);  // No run planned again.
}

TEST_F(ReadPlanTest, CastsRoundAsTorchAndFusedDestinationsTakeEveryBox) {
  const Tensor q = Make("q", {16, 12}, Rows(), 4);
  const Tensor k = Make("k", {16, 12}, Rows(), 5);
  const Tensor v = Make("v", {16, 12}, Rows(), 6);
  const Tensor b = Make("b", {8, 8}, Rows(1), 7, 1, DType::kBFloat16);
  // qkv of a TP=2 reader: its column half of q, k and v, one under the
  // other, in float16.
  const Tensor qkv = Empty({48, 6}, DType::kFloat16);
  ReadItem fused;
  fused.out = qkv;
  fused.sources = {{"q", {0, 6}, {16, 6}, {0, 0}},
                   {"k", {0, 6}, {16, 6}, {16, 0}},
                   {"v", {0, 6}, {16, 6}, {32, 0}}};
  const Tensor q16 = Empty({16, 12}, DType::kBFloat16);
  const Tensor b32 = Empty({8, 8}, DType::kFloat32);
  std::vector<ReadItem> items;
  items.push_back(fused);
  items.push_back(ReadItem::Box("q", {0, 0}, q16));
  items.push_back(ReadItem::Box("b", {0, 0}, b32));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ReadPlan> plan,
                       client_->PlanReads(std::move(items)));
  // Bytes moved are the tensors' (float32, bfloat16), not the outs'.
  EXPECT_EQ(plan->bytes(), 3 * 16 * 6 * 4 + 16 * 12 * 4 + 8 * 8 * 2);
  // The tensors in the order first named, with their (not the outs')
  // sizes.
  EXPECT_EQ(plan->names(), (std::vector<std::string>{"q", "k", "v", "b"}));
  EXPECT_EQ(plan->shapes(), (std::vector<std::vector<int64_t>>{
                                {16, 12}, {16, 12}, {16, 12}, {8, 8}}));
  ASSERT_OK(plan->Run().status());
  const Tensor half = *q.ToDType(DType::kFloat16);
  for (int part = 0; part < 3; ++part) {
    const Tensor& source = part == 0 ? q : part == 1 ? k : v;
    EXPECT_TRUE(Same(BoxOf(qkv, {16 * part, 0}, {16, 6}),
                     *BoxOf(source, {0, 6}, {16, 6}).ToDType(DType::kFloat16)))
        << part;
  }
  EXPECT_TRUE(Same(BoxOf(half, {0, 6}, {16, 6}), BoxOf(qkv, {0, 0}, {16, 6})));
  EXPECT_TRUE(Same(q16, *q.ToDType(DType::kBFloat16)));
  EXPECT_TRUE(Same(b32, *b.ToDType(DType::kFloat32)));
}

// A CUDA out (on a machine with a device): pieces land in host staging and
// are copied to the GPU, cast included.
TEST_F(ReadPlanTest, CudaOutsAreFilledOnTheDevice) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  const Tensor q = Make("q", {16, 12}, Rows(), 14);
  ASSERT_OK_AND_ASSIGN(
      Tensor on_gpu, Tensor::Empty({16, 6}, TensorOptions()
                                                .WithDType(DType::kBFloat16)
                                                .WithDevice(Device::Cuda(0))));
  const Tensor whole =
      *Tensor::Empty({16, 12}, TensorOptions().WithDevice(Device::Cuda(0)));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ReadPlan> plan,
                       client_->PlanReads({ReadItem::Box("q", {0, 6}, on_gpu),
                                           ReadItem::Box("q", {0, 0}, whole)}));
  ASSERT_OK(plan->Run().status());
  ASSERT_OK_AND_ASSIGN(const Tensor back, on_gpu.To(Device::Cpu()));
  EXPECT_TRUE(Same(back, *BoxOf(q, {0, 6}, {16, 6}).ToDType(DType::kBFloat16)));
  ASSERT_OK_AND_ASSIGN(const Tensor all, whole.To(Device::Cpu()));
  EXPECT_TRUE(Same(all, q));
}

TEST_F(ReadPlanTest, RefusalsAreClear) {
  Make("t", {16, 12}, Rows(), 8);
  Make("i", {16, 12}, Rows(), 9, 1, DType::kInt32);
  const auto plan = [&](std::vector<ReadItem> items) {
    return client_->PlanReads(std::move(items)).status();
  };
  EXPECT_THAT(plan({ReadItem::Box("nope", {0, 0}, Empty({2, 2}))}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(plan({ReadItem::Box("t", {15, 0}, Empty({2, 2}))}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("tensor t")));
  EXPECT_THAT(plan({ReadItem::Box("i", {0, 0}, Empty({2, 2}))}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("only floating types")));
  ReadItem overlapping;
  overlapping.out = Empty({4, 4});
  overlapping.sources = {{"t", {0, 0}, {2, 4}, {0, 0}},
                         {"t", {4, 0}, {2, 4}, {1, 0}}};
  EXPECT_THAT(plan({overlapping}), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("overlap")));
  ReadItem outside;
  outside.out = Empty({4, 4});
  outside.sources = {{"t", {0, 0}, {2, 4}, {3, 0}}};
  EXPECT_THAT(plan({outside}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out")));
  EXPECT_THAT(plan({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("no items")));
  // Two items whose outs overlap in part (rows 0-3 and 2-5 of one
  // buffer): which piece lands last would decide what rows 2-3 hold.
  const Tensor buffer = Empty({8, 4});
  ASSERT_OK_AND_ASSIGN(const Tensor low, buffer.Narrow(0, 0, 4));
  ASSERT_OK_AND_ASSIGN(const Tensor middle, buffer.Narrow(0, 2, 4));
  ASSERT_OK_AND_ASSIGN(const Tensor high, buffer.Narrow(0, 4, 4));
  EXPECT_THAT(plan({ReadItem::Box("t", {0, 0}, Empty({2, 2})),
                    ReadItem::Box("t", {0, 0}, low),
                    ReadItem::Box("t", {8, 0}, middle)}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items 1 and 2 write the same memory")));
  // Outs side by side in one buffer, or the very same out (tied
  // parameters), are fine.
  EXPECT_OK(plan(
      {ReadItem::Box("t", {0, 0}, low), ReadItem::Box("t", {8, 0}, high)}));
  EXPECT_OK(
      plan({ReadItem::Box("t", {0, 0}, low), ReadItem::Box("t", {0, 0}, low)}));
  ASSERT_OK_AND_ASSIGN(
      auto fine,
      client_->PlanReads({ReadItem::Box("t", {0, 0}, Empty({2, 2}))}));
  EXPECT_THAT(fine->Run({}, 3).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("has no versions")));
}

TEST_F(ReadPlanTest, AReshardOrARecreateMakesTheNextRunPlanAgain) {
  Tensor values = Make("w", {32, 16}, Rows(1), 10);
  const Tensor out = Empty({20, 16});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ReadPlan> plan,
                       client_->PlanReads({ReadItem::Box("w", {6, 0}, out)}));
  ASSERT_OK(plan->Run().status());
  EXPECT_TRUE(Same(out, BoxOf(values, {6, 0}, {20, 16})));
  // Resharded onto other owners: the old placements are gone.
  ASSERT_OK(client_
                ->Reshard("w", *ChunkShardingSpec::Create(
                                   1, {Rank(3), Rank(2), Rank(1)}))
                .status());
  // The old layout may still be served while the daemons confirm the
  // reshard (the same values); once it is gone, a run plans again.
  ReadPlanRun after;
  for (int i = 0; i < 100 && !after.replanned; ++i) {
    ASSERT_OK_AND_ASSIGN(after, plan->Run());
    EXPECT_TRUE(Same(out, BoxOf(values, {6, 0}, {20, 16})));
    if (!after.replanned) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(after.replanned);
  EXPECT_EQ(plan->plans(), 2);
  // Deleted and created again with other values: never the old ones.
  ASSERT_OK(client_->Delete("w"));
  values = Make("w", {32, 16}, Rows(2), 11);
  ASSERT_OK_AND_ASSIGN(after, plan->Run());
  EXPECT_TRUE(after.replanned);  // The deleted tensor's id is gone at once.
  EXPECT_TRUE(Same(out, BoxOf(values, {6, 0}, {20, 16})));
  // Deleted for good: NOT_FOUND, naming it.
  ASSERT_OK(client_->Delete("w"));
  EXPECT_THAT(plan->Run().status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("w")));
}

// Pieces of small shards (biases, norms) are asked of each owner in
// pipelined batches: every value lands, each byte is counted once, and a
// tensor re-created between runs is planned again, never read stale.
TEST_F(ReadPlanTest, SmallPiecesOfManyTensorsArePipelinedPerOwner) {
  constexpr int kTensors = 40;  // 80 pieces per owner: two batches.
  std::vector<Tensor> values;
  std::vector<Tensor> outs;
  std::vector<ReadItem> items;
  for (int i = 0; i < kTensors; ++i) {
    const std::string name = absl::StrCat("small", i);
    values.push_back(Make(name, {8, 6}, Rows(), 100 + i));
    outs.push_back(Empty({8, 6}));
    items.push_back(ReadItem::Box(name, {0, 0}, outs.back()));
  }
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ReadPlan> plan,
                       client_->PlanReads(std::move(items)));
  ASSERT_OK_AND_ASSIGN(ReadPlanRun run, plan->Run());
  EXPECT_EQ(run.bytes, kTensors * 8 * 6 * 4);
  for (int i = 0; i < kTensors; ++i) {
    EXPECT_TRUE(Same(outs[i], values[i])) << i;
  }
  ASSERT_OK(client_->Delete("small7"));
  values[7] = Make("small7", {8, 6}, Rows(), 999);
  ASSERT_OK_AND_ASSIGN(run, plan->Run());
  EXPECT_TRUE(run.replanned);
  for (int i = 0; i < kTensors; ++i) {
    EXPECT_TRUE(Same(outs[i], values[i])) << i;
  }
  ASSERT_OK(client_->Delete("small8"));
  EXPECT_THAT(plan->Run().status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("small8")));
}

TEST_F(ReadPlanTest, AStalledDaemonIsReadAroundWithinTheDeadline) {
  ASSERT_OK_AND_ASSIGN(const ReplicatedPlan planned, PlanReplicated(12));
  const auto& [plan, out, want] = planned;
  // Rank 1 stalled (shorter than --timeout): its pieces come from the
  // replicas, within the run's deadline.
  ASSERT_OK(RunWhileStalled(*plan, 1, absl::Seconds(6), {out}).status());
  EXPECT_TRUE(Same(out, want));
  // Back: read from its owner again.
  TransferOptions bounded;
  bounded.timeout = absl::Seconds(6);
  ASSERT_OK(plan->Run(bounded).status());
  EXPECT_TRUE(Same(out, want));
}

// A stalled owner costs one holder patience (2 s) per run, however many
// of its pieces the run reads: small pieces of replicated shards go in
// pipelined batches, given up after the patience, and pieces of large
// shards go one by one; either way the owner is passed over for the rest
// of the run, its pieces read from the replicas within the run's deadline
// (one patience per piece, 16 at a time, would take 10 s and more).
TEST_F(ReadPlanTest, AStalledOwnerCostsOnePatiencePerRun) {
  constexpr int kTensors = 40;
  // 80 pieces per owner: small ones (two batches), or shards of 128 KiB
  // (fetched one by one).
  for (const bool large : {false, true}) {
    SCOPED_TRACE(large ? "large shards" : "small shards");
    const std::vector<int64_t> sizes =
        large ? std::vector<int64_t>{128, 1024} : std::vector<int64_t>{8, 6};
    std::vector<Tensor> values;
    std::vector<Tensor> outs;
    std::vector<ReadItem> items;
    for (int i = 0; i < kTensors; ++i) {
      const std::string name = absl::StrCat(large ? "lr" : "sr", i);
      values.push_back(Make(name, sizes, Rows(), 200 + i, /*copies=*/2));
      outs.push_back(Empty(sizes));
      items.push_back(ReadItem::Box(name, {0, 0}, outs.back()));
    }
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<ReadPlan> plan,
                         client_->PlanReads(std::move(items)));
    ASSERT_OK(plan->Run().status());
    for (int i = 0; i < kTensors; ++i) {
      EXPECT_TRUE(Same(outs[i], values[i])) << i;
    }
    ASSERT_OK_AND_ASSIGN(const ReadPlanRun stalled,
                         RunWhileStalled(*plan, 1, absl::Seconds(8), outs));
    EXPECT_EQ(stalled.bytes, kTensors * sizes[0] * sizes[1] * 4);
    for (int i = 0; i < kTensors; ++i) {
      EXPECT_TRUE(Same(outs[i], values[i])) << i;
    }
  }
}

TEST_F(ReadPlanTest, ADaemonRestartedBetweenRunsIsReadAround) {
  cluster_.reset();
  StartCluster(/*timeout_s=*/3);  // A dead daemon is noticed soon.
  ASSERT_OK_AND_ASSIGN(const ReplicatedPlan planned, PlanReplicated(13));
  const auto& [plan, out, want] = planned;
  TransferOptions bounded;
  bounded.timeout = absl::Seconds(10);
  // Rank 2 killed: its pieces come from the replicas.
  cluster_->Kill(2);
  std::fill_n(out.data<float>(), out.numel(), -1.0f);
  ASSERT_OK(plan->Run(bounded).status());
  EXPECT_TRUE(Same(out, want));
  // Restarted (it refills its copies): the runs go on, planning again when
  // they must, and read the same values.
  absl::Status restarted = absl::UnavailableError("not restarted");
  for (int attempt = 0; attempt < 5 && !restarted.ok(); ++attempt) {
    restarted = cluster_->Restart(2);
    if (!restarted.ok()) absl::SleepFor(absl::Seconds(2));
  }
  ASSERT_OK(restarted) << cluster_->Log(2);
  absl::Status status = absl::UnavailableError("not run");
  for (const absl::Time until = absl::Now() + absl::Seconds(30);
       absl::Now() < until; absl::SleepFor(absl::Milliseconds(200))) {
    std::fill_n(out.data<float>(), out.numel(), -1.0f);
    status = plan->Run(bounded).status();
    if (status.ok()) break;
  }
  ASSERT_OK(status) << cluster_->Log(2);
  EXPECT_TRUE(Same(out, want));
}

// A group of versioned tensors published while a plan runs: no run mixes
// two versions, and the version it reports is the one its values say.
TEST_F(ReadPlanTest, RunsOfAGroupNeverMixVersions) {
  const std::vector<std::string> names = {"a", "b", "c"};
  for (const std::string& name : names) {
    CreateOptions options;
    options.init = TensorInit::kZeros;
    options.versions = 3;
    ASSERT_OK(client_->Create(name, {32, 64}, Rows(), options).status());
  }
  std::vector<Tensor> outs;
  std::vector<ReadItem> items;
  for (const std::string& name : names) {
    for (int64_t half : {0, 32}) {
      outs.push_back(Empty({32, 32}));
      items.push_back(ReadItem::Box(name, {0, half}, outs.back()));
    }
  }
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ReadPlan> plan,
                       client_->PlanReads(std::move(items)));
  std::atomic<bool> done{false};
  std::atomic<int64_t> published{1};
  std::thread writer([&] {
    for (int step = 0; step < 25 && !done; ++step) {
      absl::StatusOr<VersionWriter> version = client_->Begin(names);
      if (!version.ok()) break;
      for (const std::string& name : names) {
        const int64_t number = version->group().versions(0).number();
        const Tensor fill =
            *Tensor::Full({32, 64}, static_cast<double>(number));
        if (!version->view(name)->Write({0, 0}, fill).ok()) return;
      }
      if (!version->Publish().ok()) break;
      published = version->group().versions(0).number();
    }
  });
  int runs = 0;
  int64_t last = 0;
  std::string mixed;
  while (published < 20 && runs < 2000) {
    const absl::StatusOr<ReadPlanRun> run = plan->Run();
    ASSERT_OK(run.status());
    ++runs;
    EXPECT_GE(run->version, last);
    last = run->version;
    for (const Tensor& out : outs) {
      const float* data = out.data<float>();
      for (int64_t i = 0; i < out.numel(); ++i) {
        // Version 1 is the zeros the tensors were created with.
        const float want = run->version == 1 ? 0.0f : run->version;
        if (data[i] != want && mixed.empty()) {
          mixed = absl::StrCat("run ", runs, " says version ", run->version,
                               " but holds ", data[i]);
        }
      }
    }
  }
  done = true;
  writer.join();
  EXPECT_EQ(mixed, "");
  EXPECT_GT(runs, 5);
  ASSERT_OK_AND_ASSIGN(const ReadPlanRun latest, plan->Run());
  last = latest.version;
  // A kept older version, by number.
  const int64_t older = last - 1;
  ASSERT_OK_AND_ASSIGN(ReadPlanRun at, plan->Run({}, older));
  EXPECT_EQ(at.version, older);
  EXPECT_EQ(outs[0].data<float>()[0], older == 1 ? 0.0f : older);
  EXPECT_THAT(plan->Run({}, 1000).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not kept")));
}

// Tensors published apart (numbered differently) are read at one pinned
// point of the log.
TEST_F(ReadPlanTest, TensorsNumberedApartAreReadAtOnePinnedPoint) {
  for (const std::string name : {"x", "y"}) {
    CreateOptions options;
    options.init = TensorInit::kZeros;
    options.versions = 2;
    ASSERT_OK(client_->Create(name, {8, 8}, Rows(1), options).status());
  }
  const auto publish = [&](const std::string& name, double value) {
    ASSERT_OK_AND_ASSIGN(VersionWriter writer, client_->Begin({name}));
    ASSERT_OK(writer.view(name)->Write({0, 0}, *Tensor::Full({8, 8}, value)));
    ASSERT_OK(writer.Publish().status());
  };
  publish("x", 2);
  publish("x", 3);
  publish("y", 7);  // x is at 3, y at 2.
  const Tensor x = Empty({8, 8});
  const Tensor y = Empty({8, 8});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ReadPlan> plan,
                       client_->PlanReads({ReadItem::Box("x", {0, 0}, x),
                                           ReadItem::Box("y", {0, 0}, y)}));
  ASSERT_OK_AND_ASSIGN(ReadPlanRun run, plan->Run());
  EXPECT_TRUE(run.pinned);
  EXPECT_EQ(run.version, 3);
  ASSERT_EQ(run.versions.size(), 2u);
  EXPECT_EQ(run.versions[0].second, 3);
  EXPECT_EQ(run.versions[1].second, 2);
  EXPECT_EQ(x.data<float>()[0], 3.0f);
  EXPECT_EQ(y.data<float>()[0], 7.0f);
}

TEST_F(ReadPlanTest, CreateManyMakesEveryTensorOrNone) {
  std::vector<TensorToCreate> group;
  for (int i = 0; i < 50; ++i) {
    CreateOptions options;
    options.init = TensorInit::kFull;
    options.fill_value = i;
    options.versions = i % 2 == 0 ? 2 : 0;
    options.copies = i % 5 == 0 ? 2 : 1;
    group.push_back({absl::StrCat("m.", i), {8, 4}, Rows(1), options});
  }
  ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> made,
                       client_->CreateMany(group));
  ASSERT_EQ(made.size(), group.size());
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(made[i].name(), group[i].name);
    EXPECT_EQ(made[i].versioned(), i % 2 == 0);
    ASSERT_OK_AND_ASSIGN(Tensor values, made[i].Read());
    EXPECT_EQ(values.data<float>()[31], static_cast<float>(i)) << i;
  }
  ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> all, client_->List());
  EXPECT_EQ(all.size(), 50u);
  // One taken name, a bad spec, a name twice, none: nothing created.
  std::vector<TensorToCreate> taken = {{"n.0", {8, 4}, Rows(1), {}},
                                       {"m.7", {8, 4}, Rows(1), {}}};
  EXPECT_THAT(client_->CreateMany(taken).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("m.7")));
  std::vector<TensorToCreate> bad = {
      {"n.0", {8, 4}, Rows(1), {}},
      {"n.1", {8, 4}, *ChunkShardingSpec::Create(0, {"rank:9/cpu"}), {}}};
  EXPECT_THAT(client_->CreateMany(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("n.1")));
  std::vector<TensorToCreate> twice = {{"n.0", {8, 4}, Rows(1), {}},
                                       {"n.0", {8, 4}, Rows(1), {}}};
  EXPECT_THAT(
      client_->CreateMany(twice).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("named twice")));
  EXPECT_THAT(client_->CreateMany({}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one")));
  ASSERT_OK_AND_ASSIGN(all, client_->List());
  EXPECT_EQ(all.size(), 50u);
  // The ids stay agreed: a create after the refusals works everywhere.
  ASSERT_OK(client_->CreateMany({{"n.0", {8, 4}, Rows(1), {}}}).status());
  ASSERT_OK_AND_ASSIGN(ShardedTensorView n0, client_->Open("n.0"));
  EXPECT_OK(n0.Read().status());
}

}  // namespace
}  // namespace tessera
