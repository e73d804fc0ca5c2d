// ProcessGroup tests: ranks are threads of this process, each with its own
// group member, rendezvousing through one HashStore and moving bytes over
// real Gloo TCP pairs on loopback (or NCCL, when a GPU is visible). One
// suite, instantiated per (backend, world size).
#include "server/collective/process_group.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/container/fixed_array.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/hash_store.h"
#include "server/store/prefix_store.h"
#include "tests/testing/run_threads.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::RunThreads;
using ::tessera::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(5);
// What RunGroup gives an NCCL group instead of kTimeout: a communicator's
// start (ncclCommInitRankConfig) took over 5 s on an H200 machine running
// the whole suite at once (16 jobs, the CUDA daemon tests beside it),
// after the warm-up below.
constexpr absl::Duration kNcclTimeout = absl::Minutes(1);
// Room for thread start-up and a loaded machine on top of a timeout.
constexpr absl::Duration kSlack = absl::Seconds(3);

bool NcclBuilt() {
  std::vector<std::string> names = ProcessGroupBackends();
  return std::find(names.begin(), names.end(), "nccl") != names.end();
}

std::vector<int> Iota(int n, int first = 0) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

ProcessGroupOptions Options(std::shared_ptr<Store> store, int rank,
                            std::vector<int> global_ranks, std::string name,
                            absl::Duration timeout = kTimeout) {
  ProcessGroupOptions options;
  options.store = std::move(store);
  options.rank = rank;
  options.global_ranks = std::move(global_ranks);
  options.name = std::move(name);
  options.timeout = timeout;
  return options;
}

// `n` elements of test data derived from (seed, index), so that every rank
// and every pair of ranks sends something recognisably its own. Zeros occur,
// so bool tensors hold both values.
absl::StatusOr<Tensor> Pattern(int64_t n, int seed, DType dtype,
                               Device device = Device::Cpu()) {
  absl::StatusOr<Tensor> host = DispatchDType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    absl::FixedArray<T> values(n);
    for (int64_t i = 0; i < n; ++i) {
      values[i] = FromDouble<T>((seed * 37 + i * 11) % 13);
    }
    return Tensor::FromVector<T>(absl::MakeConstSpan(values), {n});
  });
  if (!host.ok() || device.is_cpu()) return host;
  return host->To(device);
}

void ExpectTensorEq(const Tensor& actual, const Tensor& expected) {
  absl::StatusOr<Tensor> a = actual.To(Device::Cpu());
  absl::StatusOr<Tensor> e = expected.To(Device::Cpu());
  ASSERT_OK(a.status());
  ASSERT_OK(e.status());
  EXPECT_TRUE(Equal(*a, *e)) << a->DebugString() << " vs " << e->DebugString();
}

using Param = std::tuple<std::string, int>;

// The first NCCL communicator of a process creates the CUDA context and
// loads NCCL's kernels: seconds on a quiet machine, tens of seconds under
// compute-sanitizer. It is paid once here, under its own deadline, so that
// the tests' 5 s deadlines time the collectives and not that start.
void WarmNcclOnce() {
  static const bool warmed = [] {
    ProcessGroupOptions options = Options(
        std::make_shared<PrefixStore>("warm", std::make_shared<HashStore>()), 0,
        {0}, "warm", absl::Minutes(2));
    absl::StatusOr<std::shared_ptr<ProcessGroup>> group =
        CreateProcessGroup("nccl", options);
    if (group.ok()) (*group)->Shutdown();
    return group.ok();
  }();
  (void)warmed;  // A failed warm-up shows again, with context, in the test.
}

// Runs fn(group) on `world` threads, each with its member of one fresh
// group of `backend`.
void RunGroup(const std::string& backend, int world,
              const std::function<void(ProcessGroup&)>& fn,
              absl::Duration timeout = kTimeout) {
  if (backend == "nccl" && timeout == kTimeout) timeout = kNcclTimeout;
  auto store = std::make_shared<HashStore>();
  RunThreads(world, [&](int r) {
    ProcessGroupOptions options =
        Options(std::make_shared<PrefixStore>("pg", store), r, Iota(world), "0",
                timeout);
    absl::StatusOr<std::shared_ptr<ProcessGroup>> group =
        CreateProcessGroup(backend, options);
    ASSERT_OK(group.status());
    fn(**group);
    (*group)->Shutdown();
  });
}

class ProcessGroupTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (backend() == "nccl" && (!NcclBuilt() || !CudaAvailable())) {
      GTEST_SKIP() << "needs a CUDA device (and a build with NCCL)";
    }
    if (backend() == "nccl") WarmNcclOnce();
  }

  const std::string& backend() const { return std::get<0>(GetParam()); }
  int world() const { return std::get<1>(GetParam()); }

  // Runs fn(group) on every rank, each with its member of one fresh group.
  void RunRanks(const std::function<void(ProcessGroup&)>& fn,
                absl::Duration timeout = kTimeout) {
    RunGroup(backend(), world(), fn, timeout);
  }
};

TEST_P(ProcessGroupTest, Barrier) {
  RunRanks([&](ProcessGroup& group) {
    EXPECT_EQ(group.backend(), backend());
    EXPECT_EQ(group.size(), world());
    for (int i = 0; i < 3; ++i) EXPECT_OK(group.Barrier());
  });
}

TEST_P(ProcessGroupTest, BroadcastFromEachRoot) {
  RunRanks([&](ProcessGroup& group) {
    for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBool}) {
      for (int root = 0; root < group.size(); ++root) {
        ASSERT_OK_AND_ASSIGN(
            Tensor tensor, Pattern(12, group.rank() == root ? root : 100, dtype,
                                   group.device()));
        ASSERT_OK_AND_ASSIGN(tensor, tensor.View({3, 4}));
        ASSERT_OK(group.Broadcast(tensor, root));
        ASSERT_OK_AND_ASSIGN(Tensor expected, Pattern(12, root, dtype));
        ExpectTensorEq(tensor, *expected.View({3, 4}));
      }
    }
  });
}

// Rank r contributes size_of(r) elements; outputs are separate tensors.
// With `agreed`, through AllGatherAgreed (no exchange of plans first).
void CheckAllGather(ProcessGroup& group, DType dtype,
                    const std::function<int64_t(int)>& size_of,
                    bool agreed = false) {
  ASSERT_OK_AND_ASSIGN(
      Tensor input,
      Pattern(size_of(group.rank()), group.rank(), dtype, group.device()));
  std::vector<Tensor> outputs;
  for (int r = 0; r < group.size(); ++r) {
    ASSERT_OK_AND_ASSIGN(
        outputs.emplace_back(),
        Tensor::Full(
            {size_of(r)}, 1,
            TensorOptions().WithDType(dtype).WithDevice(group.device())));
  }
  ASSERT_OK(agreed ? group.AllGatherAgreed(input, outputs)
                   : group.AllGather(input, outputs));
  for (int r = 0; r < group.size(); ++r) {
    ASSERT_OK_AND_ASSIGN(Tensor expected, Pattern(size_of(r), r, dtype));
    ExpectTensorEq(outputs[r], expected);
  }
}

TEST_P(ProcessGroupTest, AllGatherUnevenSizes) {
  RunRanks([&](ProcessGroup& group) {
    for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBool}) {
      for (const bool agreed : {false, true}) {
        CheckAllGather(
            group, dtype, [](int r) { return r * 3 + 1; }, agreed);
      }
    }
  });
}

// Gloo sends shares of at most 4 KiB to every member at once and larger
// ones round the ring: both ways, and a mix of sizes on either side of it.
TEST_P(ProcessGroupTest, AllGatherOfSmallAndLargeShares) {
  RunRanks([&](ProcessGroup& group) {
    for (const bool agreed : {false, true}) {
      for (const int64_t first : {int64_t{512}, int64_t{513}, int64_t{4096}}) {
        CheckAllGather(
            group, DType::kInt64,
            [first](int r) { return r == 0 ? first : r * 3 + 1; }, agreed);
      }
    }
  });
}

TEST_P(ProcessGroupTest, AllGatherWithEmptyContributions) {
  RunRanks([&](ProcessGroup& group) {
    for (const bool agreed : {false, true}) {
      // Rank 0 (and every even rank) sends nothing.
      CheckAllGather(
          group, DType::kFloat32, [](int r) { return r % 2 == 0 ? 0 : r + 2; },
          agreed);
      // Nobody sends anything.
      CheckAllGather(
          group, DType::kInt64, [](int) { return 0; }, agreed);
    }
  });
}

// The usual layout: outputs are views of one tensor, and the input is the
// member's own view, so nothing is staged or copied locally.
TEST_P(ProcessGroupTest, AllGatherIntoViewsOfOneTensor) {
  RunRanks([&](ProcessGroup& group) {
    auto size_of = [](int r) { return r * 2 + 1; };
    int64_t total = 0;
    for (int r = 0; r < group.size(); ++r) total += size_of(r);
    ASSERT_OK_AND_ASSIGN(
        Tensor all, Tensor::Zeros({total}, TensorOptions()
                                               .WithDType(DType::kInt64)
                                               .WithDevice(group.device())));
    std::vector<Tensor> views;
    std::vector<Tensor> expected;
    int64_t offset = 0;
    for (int r = 0; r < group.size(); offset += size_of(r++)) {
      ASSERT_OK_AND_ASSIGN(views.emplace_back(),
                           all.Narrow(0, offset, size_of(r)));
      ASSERT_OK_AND_ASSIGN(expected.emplace_back(),
                           Pattern(size_of(r), r, DType::kInt64));
    }
    ASSERT_OK(CopyInto(expected[group.rank()], views[group.rank()]));
    ASSERT_OK(group.AllGather(views[group.rank()], views));
    for (int r = 0; r < group.size(); ++r)
      ExpectTensorEq(views[r], expected[r]);
  });
}

// Sizes for Gather/Scatter: member 1 has nothing, the others differ.
int64_t UnevenSize(int r) { return r == 1 ? 0 : 2 * r + 1; }

// Also through GatherAgreed (no exchange of plans first).
TEST_P(ProcessGroupTest, GatherUnevenToLastRank) {
  RunRanks([&](ProcessGroup& group) {
    for (const bool agreed : {false, true}) {
      const int root = group.size() - 1;
      const TensorOptions options =
          TensorOptions().WithDType(DType::kFloat32).WithDevice(group.device());
      ASSERT_OK_AND_ASSIGN(Tensor input,
                           Pattern(UnevenSize(group.rank()), group.rank(),
                                   DType::kFloat32, group.device()));
      std::vector<Tensor> outputs;
      if (group.rank() == root) {
        for (int r = 0; r < group.size(); ++r) {
          ASSERT_OK_AND_ASSIGN(outputs.emplace_back(),
                               Tensor::Zeros({UnevenSize(r)}, options));
        }
      }
      ASSERT_OK(agreed ? group.GatherAgreed(input, outputs, root)
                       : group.Gather(input, outputs, root));
      for (size_t r = 0; r < outputs.size(); ++r) {
        ASSERT_OK_AND_ASSIGN(Tensor expected,
                             Pattern(UnevenSize(r), r, DType::kFloat32));
        ExpectTensorEq(outputs[r], expected);
      }
    }
  });
}

TEST_P(ProcessGroupTest, ScatterUnevenFromLastRank) {
  RunRanks([&](ProcessGroup& group) {
    const int root = group.size() - 1;
    std::vector<Tensor> inputs;
    if (group.rank() == root) {
      for (int r = 0; r < group.size(); ++r) {
        ASSERT_OK_AND_ASSIGN(
            inputs.emplace_back(),
            Pattern(UnevenSize(r), 50 + r, DType::kInt64, group.device()));
      }
    }
    ASSERT_OK_AND_ASSIGN(Tensor output,
                         Tensor::Zeros({UnevenSize(group.rank())},
                                       TensorOptions()
                                           .WithDType(DType::kInt64)
                                           .WithDevice(group.device())));
    ASSERT_OK(group.Scatter(inputs, output, root));
    ASSERT_OK_AND_ASSIGN(
        Tensor expected,
        Pattern(UnevenSize(group.rank()), 50 + group.rank(), DType::kInt64));
    ExpectTensorEq(output, expected);
  });
}

TEST_P(ProcessGroupTest, AllToAllPerPairSizes) {
  // Member `from` sends PairSize(from, to) elements to member `to`; some
  // pairs send nothing.
  auto pair_size = [](int from, int to) { return (from + 2 * to) % 4; };
  auto pair_seed = [](int from, int to) { return 10 * from + to; };
  RunRanks([&](ProcessGroup& group) {
    const int me = group.rank();
    std::vector<Tensor> inputs;
    std::vector<Tensor> outputs;
    for (int peer = 0; peer < group.size(); ++peer) {
      ASSERT_OK_AND_ASSIGN(inputs.emplace_back(),
                           Pattern(pair_size(me, peer), pair_seed(me, peer),
                                   DType::kFloat32, group.device()));
      ASSERT_OK_AND_ASSIGN(
          outputs.emplace_back(),
          Tensor::Zeros({pair_size(peer, me)},
                        TensorOptions().WithDevice(group.device())));
    }
    ASSERT_OK(group.AllToAll(inputs, outputs));
    for (int peer = 0; peer < group.size(); ++peer) {
      ASSERT_OK_AND_ASSIGN(
          Tensor expected,
          Pattern(pair_size(peer, me), pair_seed(peer, me), DType::kFloat32));
      ExpectTensorEq(outputs[peer], expected);
    }
  });
}

TEST_P(ProcessGroupTest, AllGatherBytesOfDifferentLengths) {
  // Member 0's string is empty; odd members' strings hold a NUL byte.
  auto bytes_of = [](int r) {
    std::string s(3 * r, static_cast<char>('a' + r));
    if (r % 2 == 1) s[r] = '\0';
    return s;
  };
  RunRanks([&](ProcessGroup& group) {
    ASSERT_OK_AND_ASSIGN(std::vector<std::string> all,
                         AllGatherBytes(group, bytes_of(group.rank())));
    ASSERT_EQ(all.size(), static_cast<size_t>(group.size()));
    for (int r = 0; r < group.size(); ++r) EXPECT_EQ(all[r], bytes_of(r));
    ASSERT_OK_AND_ASSIGN(all, AllGatherBytes(group, ""));
    EXPECT_THAT(all, ::testing::Each(""));
    // Around the 1016 bytes that travel in the first exchange, and far past.
    auto long_of = [](int r) {
      const size_t lengths[] = {1016, 1017, 1015, 100000};
      std::string s(lengths[r % 4], '\0');
      for (size_t i = 0; i < s.size(); ++i) {
        s[i] = static_cast<char>((i * 31 + static_cast<size_t>(r)) % 251);
      }
      return s;
    };
    ASSERT_OK_AND_ASSIGN(all, AllGatherBytes(group, long_of(group.rank())));
    for (int r = 0; r < group.size(); ++r) EXPECT_EQ(all[r], long_of(r)) << r;
  });
}

TEST_P(ProcessGroupTest, AllGatherStatusAgreesOnTheFirstFailure) {
  RunRanks([&](ProcessGroup& group) {
    EXPECT_OK(AllGatherStatus(group, absl::OkStatus()));
    // Member `first` and the last one fail, with different codes; every
    // member gets the first's error, annotated with its global rank.
    const int first = std::min(1, group.size() - 1);
    const int last = group.size() - 1;
    absl::Status mine = absl::OkStatus();
    if (group.rank() == first) {
      mine = absl::NotFoundError("no such thing");
    } else if (group.rank() == last) {
      mine = absl::InternalError("broken");
    }
    EXPECT_THAT(AllGatherStatus(group, mine),
                StatusIs(absl::StatusCode::kNotFound,
                         absl::StrCat("on rank ", group.global_ranks()[first],
                                      ": no such thing")));
    ASSERT_OK_AND_ASSIGN(std::vector<absl::Status> all,
                         AllGatherStatuses(group, mine));
    ASSERT_EQ(all.size(), static_cast<size_t>(group.size()));
    for (int r = 0; r < group.size(); ++r) {
      if (r == first) {
        EXPECT_THAT(all[r], StatusIs(absl::StatusCode::kNotFound,
                                     HasSubstr("no such thing")));
      } else if (r == last) {
        EXPECT_THAT(all[r],
                    StatusIs(absl::StatusCode::kInternal, HasSubstr("broken")));
      } else {
        EXPECT_OK(all[r]);
      }
    }
  });
}

TEST_P(ProcessGroupTest, AllGatherOutcomesFailsEveryMemberTogether) {
  RunRanks([&](ProcessGroup& group) {
    // Payloads of any bytes (empty, binary) come back in group-rank order.
    const std::string mine =
        group.rank() == 0
            ? std::string()
            : std::string("O\0E", 3) + "x" + std::to_string(group.rank());
    ASSERT_OK_AND_ASSIGN(std::vector<std::string> all,
                         AllGatherOutcomes(group, mine));
    ASSERT_EQ(all.size(), static_cast<size_t>(group.size()));
    EXPECT_EQ(all[0], "");
    for (int r = 1; r < group.size(); ++r) {
      EXPECT_EQ(all[r], std::string("O\0E", 3) + "x" + std::to_string(r));
    }
    // The last member fails: it gets its own error, everyone else its
    // annotated one.
    const int last = group.size() - 1;
    absl::StatusOr<std::string> outcome = std::string("fine");
    if (group.rank() == last) outcome = absl::OutOfRangeError("too far");
    const std::string expected =
        group.rank() == last
            ? "too far"
            : absl::StrCat("on rank ", group.global_ranks()[last], ": too far");
    EXPECT_THAT(AllGatherOutcomes(group, outcome),
                StatusIs(absl::StatusCode::kOutOfRange, expected));
  });
}

TEST_P(ProcessGroupTest, ArgumentErrorsFailOnCallingRankOnly) {
  RunRanks([&](ProcessGroup& group) {
    const TensorOptions f32 = TensorOptions().WithDevice(group.device());
    ASSERT_OK_AND_ASSIGN(Tensor input, Tensor::Ones({4}, f32));
    std::vector<Tensor> outputs(group.size() + 1, input);
    EXPECT_THAT(group.AllGather(input, outputs),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("expected ", group.size(),
                                                " outputs"))));
    outputs.pop_back();
    ASSERT_OK_AND_ASSIGN(
        outputs.back(),
        Tensor::Ones({4}, TensorOptions(f32).WithDType(DType::kInt64)));
    EXPECT_THAT(group.AllGather(input, outputs),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("has dtype int64, expected float32")));
    EXPECT_THAT(group.Broadcast(input, group.size()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("invalid root rank")));
    EXPECT_THAT(group.Scatter({}, input, -1),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("invalid root rank")));
    ASSERT_OK_AND_ASSIGN(Tensor matrix, Tensor::Ones({2, 3}, f32));
    ASSERT_OK_AND_ASSIGN(Tensor transposed, matrix.Transpose(0, 1));
    EXPECT_THAT(group.Broadcast(transposed, 0),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("must be contiguous")));
    EXPECT_THAT(
        group.Broadcast(Tensor(), 0),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("undefined")));
    ASSERT_OK_AND_ASSIGN(
        Tensor meta,
        Tensor::Ones({4}, TensorOptions().WithDevice(Device::Meta())));
    EXPECT_THAT(
        group.Broadcast(meta, 0),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is on meta")));
    if (group.rank() != 0) {
      EXPECT_THAT(group.Gather(input, {input}, 0),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("only the root passes outputs")));
    }
    // Nothing was sent, so the group still works.
    EXPECT_OK(group.Broadcast(input, 0));
  });
}

TEST_P(ProcessGroupTest, DisagreementBetweenMembersFailsEverywhere) {
  if (world() < 2) GTEST_SKIP() << "needs two members";
  RunRanks([&](ProcessGroup& group) {
    const int me = group.rank();
    const TensorOptions f32 = TensorOptions().WithDevice(group.device());
    // Member 0 expects 5 elements from member 1, which sends 4.
    ASSERT_OK_AND_ASSIGN(Tensor input, Tensor::Ones({4}, f32));
    std::vector<Tensor> outputs;
    for (int r = 0; r < group.size(); ++r) {
      ASSERT_OK_AND_ASSIGN(outputs.emplace_back(),
                           Tensor::Zeros({me == 0 && r == 1 ? 5 : 4}, f32));
    }
    EXPECT_THAT(group.AllGather(input, outputs),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("member 1 sends 16 bytes to member 0, "
                                   "which expects 20 bytes")));
    // Members disagree on the root.
    EXPECT_THAT(group.Broadcast(input, me % 2),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("agree on sizes and root")));
    // Members disagree on the dtype.
    ASSERT_OK_AND_ASSIGN(
        Tensor typed,
        Tensor::Ones({1}, TensorOptions(f32).WithDType(
                              me == 1 ? DType::kInt32 : DType::kFloat32)));
    EXPECT_THAT(group.Broadcast(typed, 0),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("member 1 passes int32 tensors")));
    // Every member saw the same error, so the group is still in step.
    CheckAllGather(group, DType::kFloat32, [](int r) { return r + 1; });
  });
}

TEST_P(ProcessGroupTest, PeerShutdownFailsCollectiveWithinTimeout) {
  if (world() < 2) GTEST_SKIP() << "needs two members";
  const absl::Duration timeout = absl::Seconds(2);
  RunRanks(
      [&](ProcessGroup& group) {
        ASSERT_OK(group.Barrier());
        ASSERT_OK_AND_ASSIGN(
            Tensor tensor,
            Tensor::Zeros({8}, TensorOptions().WithDevice(group.device())));
        if (group.rank() != 0) {
          // Gone while member 0 waits for it.
          absl::SleepFor(absl::Milliseconds(200));
          group.Shutdown();
          EXPECT_THAT(group.Barrier(),
                      StatusIs(absl::StatusCode::kFailedPrecondition,
                               HasSubstr("shut down")));
          return;
        }
        const absl::Time start = absl::Now();
        const absl::Status status = group.Broadcast(tensor, 1);
        EXPECT_THAT(status.code(), AnyOf(absl::StatusCode::kUnavailable,
                                         absl::StatusCode::kDeadlineExceeded))
            << status;
        EXPECT_THAT(status.message(), HasSubstr("Broadcast"));
        EXPECT_LT(absl::Now() - start, timeout + kSlack);
        EXPECT_THAT(group.Barrier(),
                    StatusIs(absl::StatusCode::kFailedPrecondition,
                             HasSubstr("broken")));
      },
      timeout);
}

TEST_P(ProcessGroupTest, StalledPeerIsDeadlineExceeded) {
  if (world() < 2) GTEST_SKIP() << "needs two members";
  const absl::Duration timeout = absl::Seconds(1);
  absl::Notification done;
  RunRanks(
      [&](ProcessGroup& group) {
        if (group.rank() != 0) {
          // Alive but never joins the collective.
          done.WaitForNotification();
          return;
        }
        const absl::Time start = absl::Now();
        EXPECT_THAT(group.Barrier(),
                    StatusIs(absl::StatusCode::kDeadlineExceeded,
                             HasSubstr("Barrier")));
        const absl::Duration elapsed = absl::Now() - start;
        EXPECT_GE(elapsed, timeout * 0.9);
        EXPECT_LT(elapsed, timeout + kSlack);
        done.Notify();
      },
      timeout);
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return absl::StrCat(std::get<0>(info.param), "_world",
                      std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Gloo, ProcessGroupTest,
                         ::testing::Combine(::testing::Values("gloo"),
                                            ::testing::Values(1, 2, 3, 4)),
                         ParamName);
INSTANTIATE_TEST_SUITE_P(Nccl, ProcessGroupTest,
                         ::testing::Combine(::testing::Values("nccl"),
                                            ::testing::Values(1)),
                         ParamName);

// Past 16 members Gloo's own barrier and ring all-gather run, whatever
// the sizes.
TEST(GlooLargeGroupTest, SeventeenMembersMeetAndGather) {
  RunGroup("gloo", 17, [](ProcessGroup& group) {
    for (int i = 0; i < 2; ++i) EXPECT_OK(group.Barrier());
    for (const bool agreed : {false, true}) {
      CheckAllGather(
          group, DType::kInt64, [](int r) { return r % 3 == 0 ? 0 : r + 1; },
          agreed);
    }
    ASSERT_OK_AND_ASSIGN(std::vector<std::string> all,
                         AllGatherBytes(group, absl::StrCat(group.rank())));
    ASSERT_EQ(all.size(), 17u);
    for (int r = 0; r < 17; ++r) EXPECT_EQ(all[r], absl::StrCat(r));
  });
}

TEST(ProcessGroupRegistryTest, UnknownBackendIsNotSupported) {
  auto store = std::make_shared<HashStore>();
  EXPECT_THAT(CreateProcessGroup("foo", Options(store, 0, {0}, "0")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::Eq("Backend foo not supported!")));
}

TEST(ProcessGroupRegistryTest, BuiltinBackendsAreRegistered) {
  EXPECT_THAT(ProcessGroupBackends(), Contains("gloo"));
#ifdef TESSERA_WITH_NCCL
  EXPECT_TRUE(NcclBuilt());
#else
  EXPECT_FALSE(NcclBuilt());
#endif
  EXPECT_FALSE(RegisterProcessGroupBackend("gloo", nullptr));
}

TEST(ProcessGroupRegistryTest, InvalidOptionsAreRejected) {
  auto store = std::make_shared<HashStore>();
  auto expect_invalid = [](const ProcessGroupOptions& options,
                           absl::string_view message) {
    EXPECT_THAT(CreateProcessGroup("gloo", options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(std::string(message))));
  };
  expect_invalid(Options(store, 2, {0, 1}, "0"), "rank 2 is out of range");
  expect_invalid(Options(store, -1, {0, 1}, "0"), "rank -1 is out of range");
  expect_invalid(Options(store, 0, {}, "0"), "global_ranks is empty");
  expect_invalid(Options(store, 0, {3, 3}, "0"), "global rank 3 appears twice");
  expect_invalid(Options(store, 0, {-2}, "0"), "global rank -2 is negative");
  expect_invalid(Options(nullptr, 0, {0}, "0"), "store is null");
  expect_invalid(Options(store, 0, {0}, ""), "name is empty");
  expect_invalid(Options(store, 0, {0}, "0", absl::ZeroDuration()),
                 "timeout must be positive");
}

TEST(GlooRendezvousTest, PeerThatNeverJoinsIsDeadlineExceeded) {
  auto store = std::make_shared<HashStore>();
  const absl::Duration timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      CreateProcessGroup("gloo", Options(store, 0, {0, 1}, "lonely", timeout)),
      StatusIs(absl::StatusCode::kDeadlineExceeded,
               HasSubstr("joining gloo group lonely as rank 0 of 2")));
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_GE(elapsed, timeout * 0.9);
  EXPECT_LT(elapsed, timeout + kSlack);
}

TEST(GlooRendezvousTest, UnusableHostnameIsInvalidArgument) {
  ProcessGroupOptions options =
      Options(std::make_shared<HashStore>(), 0, {0}, "0");
  options.hostname = "192.0.2.1";  // TEST-NET-1: never a local address.
  EXPECT_THAT(
      CreateProcessGroup("gloo", options),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("gloo cannot listen on hostname '192.0.2.1'")));
}

// The rendezvous keys are gone once a group is up, so a later group may
// reuse the name on the same store.
TEST(GlooRendezvousTest, NameCanBeReusedAfterShutdown) {
  auto store = std::make_shared<HashStore>();
  for (int round = 0; round < 2; ++round) {
    RunThreads(2, [&](int r) {
      absl::StatusOr<std::shared_ptr<ProcessGroup>> group =
          CreateProcessGroup("gloo", Options(store, r, {0, 1}, "again"));
      ASSERT_OK(group.status());
      EXPECT_OK((*group)->Barrier());
      (*group)->Shutdown();
      (*group)->Shutdown();  // Idempotent.
    });
  }
}

// Four global ranks; groups {1, 2, 3} ("a") and {0, 2} ("b"), each created
// by its members only. Global rank 2 is in both.
TEST(GlooSubGroupTest, GroupRanksAndCollectivesInsideSubGroups) {
  auto store = std::make_shared<HashStore>();
  const std::vector<int> a_ranks = {1, 2, 3};
  const std::vector<int> b_ranks = {0, 2};
  auto join = [&](const std::vector<int>& members, const std::string& name,
                  int global_rank) {
    const int rank = static_cast<int>(
        std::find(members.begin(), members.end(), global_rank) -
        members.begin());
    return CreateProcessGroup(
        "gloo", Options(std::make_shared<PrefixStore>(name, store), rank,
                        members, name));
  };
  RunThreads(4, [&](int global_rank) {
    if (global_rank != 0) {
      ASSERT_OK_AND_ASSIGN(std::shared_ptr<ProcessGroup> a,
                           join(a_ranks, "a", global_rank));
      EXPECT_EQ(a->global_ranks()[a->rank()], global_rank);
      EXPECT_EQ(a->rank(), global_rank - 1);
      EXPECT_EQ(a->GroupRank(3), 2);
      EXPECT_EQ(a->GroupRank(0), std::nullopt);
      ASSERT_OK_AND_ASSIGN(
          Tensor mine, Tensor::Full({1}, global_rank,
                                    TensorOptions().WithDType(DType::kInt64)));
      std::vector<Tensor> all;
      for (int i = 0; i < a->size(); ++i) {
        ASSERT_OK_AND_ASSIGN(
            all.emplace_back(),
            Tensor::Zeros({1}, TensorOptions().WithDType(DType::kInt64)));
      }
      ASSERT_OK(a->AllGather(mine, all));
      std::vector<int64_t> gathered;
      for (const Tensor& t : all) gathered.push_back(*t.data<int64_t>());
      EXPECT_THAT(gathered, ElementsAre(1, 2, 3));
    }
    if (global_rank == 0 || global_rank == 2) {
      ASSERT_OK_AND_ASSIGN(std::shared_ptr<ProcessGroup> b,
                           join(b_ranks, "b", global_rank));
      EXPECT_EQ(b->GroupRank(2), 1);
      EXPECT_EQ(b->GroupRank(1), std::nullopt);
      ASSERT_OK_AND_ASSIGN(Tensor value,
                           Tensor::Full({2}, global_rank == 2 ? 42 : 0));
      // Group rank 1 is global rank 2.
      ASSERT_OK(b->Broadcast(value, *b->GroupRank(2)));
      EXPECT_EQ(value.data<float>()[1], 42.0f);
    }
  });
}

}  // namespace
}  // namespace tessera
