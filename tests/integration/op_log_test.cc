// The operation log survives holes and garbage in its keys
// (docs/control_log.md): real `tessera-server` processes on loopback
// (tests/testing/daemon_cluster.h), with the store embedded in rank 0 or in
// a real etcd, and a raw store client playing a holder of the cluster's
// store that adds to `control/seq`, sets it to garbage or forges skip
// markers. After each, a logged op completes within about one claim
// timeout (the lease, 2 s here; it was 5 s per skipped number), and every
// daemon lists the same tensors under the same ids. An op too large for
// the store fails at once, with nothing applied.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/version_writer.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/etcd_store.h"
#include "server/store/grpc_store.h"
#include "server/store/prefix_store.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::EtcdCluster;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kWorld = 3;
// The daemons' --lease, which bounds the claim timeout.
constexpr absl::Duration kLease = absl::Seconds(2);
// One claim timeout, a poll interval and the op itself, with room for a
// busy machine: holes that cost a claim timeout each would take 24 s for
// the 12 below.
constexpr absl::Duration kOneTimeout = absl::Seconds(2 + 3);

enum class StoreKind { kEmbedded, kEtcd };

ShardingSpec Rows() {
  std::vector<std::string> placements;
  for (int r = 0; r < kWorld; ++r) {
    placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  }
  return *ChunkShardingSpec::Create(0, placements);
}

class OpLogTest : public ::testing::TestWithParam<StoreKind> {
 protected:
  void SetUp() override {
    DaemonClusterOptions options;
    options.world_size = kWorld;
    options.server_path = TESSERA_SERVER_PATH;
    options.extra_args = {
        "--timeout",   "10",
        "--lease",     absl::StrCat(absl::ToInt64Seconds(kLease), "s"),
        "--log-level", "warn"};
    if (GetParam() == StoreKind::kEtcd) {
      absl::StatusOr<std::unique_ptr<EtcdCluster>> etcd = EtcdCluster::Start(1);
      if (absl::IsNotFound(etcd.status())) {
        GTEST_SKIP() << etcd.status();
      }
      ASSERT_OK(etcd.status());
      etcd_ = *std::move(etcd);
      options.extra_args.push_back("--store");
      options.extra_args.push_back(etcd_->Url("oplog"));
    }
    ASSERT_OK_AND_ASSIGN(cluster_, DaemonCluster::Start(options));
    if (GetParam() == StoreKind::kEtcd) {
      ASSERT_OK_AND_ASSIGN(EtcdStoreOptions etcd_options,
                           ParseEtcdUrl(etcd_->Url("oplog")));
      ASSERT_OK_AND_ASSIGN(raw_, EtcdStore::Connect(etcd_options));
    } else {
      ASSERT_OK_AND_ASSIGN(raw_, GrpcStore::Connect(cluster_->store_address(),
                                                    absl::Seconds(10)));
    }
    log_ = std::make_unique<PrefixStore>("control", raw_);
    ClientOptions client_options;
    client_options.timeout = absl::Seconds(60);
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_OK_AND_ASSIGN(
          std::shared_ptr<Client> client,
          Client::Connect(cluster_->address(r), client_options));
      clients_.push_back(std::move(client));
    }
  }

  // Creates `name` through daemon `r` and returns how long it took.
  absl::StatusOr<absl::Duration> TimeCreate(int r, const std::string& name) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(clients_[r]->Create(name, {6, 4}, Rows()).status());
    created_.push_back(name);
    return absl::Now() - start;
  }

  // Every daemon lists exactly the tensors created, under the same ids: all
  // of them ran the same ops.
  void ExpectSameTables() {
    std::vector<std::string> first;
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> views,
                           clients_[r]->List());
      std::vector<std::string> listed;
      std::vector<std::string> names;
      for (const ShardedTensorView& view : views) {
        listed.push_back(
            absl::StrCat(view.name(), "=", view.info().tensor_id()));
        names.push_back(view.name());
      }
      EXPECT_THAT(names, ::testing::UnorderedElementsAreArray(created_)) << r;
      if (r == 0) {
        first = listed;
      } else {
        EXPECT_EQ(listed, first) << "rank " << r;
      }
    }
  }

  // "seq" holds a log number again.
  void ExpectSeqRepaired() {
    ASSERT_OK_AND_ASSIGN(std::string seq, log_->Get("seq", absl::Seconds(5)));
    int64_t value = -1;
    EXPECT_TRUE(absl::SimpleAtoi(seq, &value)) << seq;
    EXPECT_GE(value, 0) << seq;
    EXPECT_LT(value, int64_t{1} << 62) << seq;
  }

  std::string Logs() {
    std::string logs;
    for (int r = 0; r < kWorld; ++r) {
      absl::StrAppend(&logs, "--- rank ", r, "\n", cluster_->Log(r));
    }
    return logs;
  }

  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<DaemonCluster> cluster_;
  std::shared_ptr<Store> raw_;
  std::unique_ptr<PrefixStore> log_;
  std::vector<std::shared_ptr<Client>> clients_;
  std::vector<std::string> created_;
};

// Numbers taken and never written, a dozen or a trillion, cost one claim
// timeout in all.
TEST_P(OpLogTest, HolesCostOneClaimTimeoutInAll) {
  ASSERT_OK(TimeCreate(1, "first").status());

  ASSERT_OK(log_->Add("seq", 12).status());
  ASSERT_OK_AND_ASSIGN(absl::Duration twelve, TimeCreate(2, "after_twelve"));
  EXPECT_LT(twelve, kOneTimeout) << Logs();

  ASSERT_OK(log_->Add("seq", int64_t{1000000000000}).status());
  ASSERT_OK_AND_ASSIGN(absl::Duration trillion,
                       TimeCreate(0, "after_trillion"));
  EXPECT_LT(trillion, kOneTimeout) << Logs();

  // A hole among written entries: the ops after it run in order.
  ASSERT_OK(log_->Add("seq", 1).status());
  ASSERT_OK(TimeCreate(1, "after_one").status());
  ASSERT_OK(TimeCreate(2, "next").status());
  ExpectSameTables();
  ASSERT_OK(clients_[0]->Delete("next"));
  created_.pop_back();
  ExpectSameTables();
}

// A sequence number that is not a log number is repaired by the next
// submitter (or rank 0), never wedges the log.
TEST_P(OpLogTest, AGarbledSequenceNumberIsRepaired) {
  ASSERT_OK(TimeCreate(0, "first").status());
  int i = 0;
  for (const std::string garbage :
       {"garbage", "", "-7", "9223372036854775807", "1"}) {
    SCOPED_TRACE(garbage);
    ASSERT_OK(log_->Set("seq", garbage));
    ASSERT_OK_AND_ASSIGN(absl::Duration took,
                         TimeCreate(i % kWorld, absl::StrCat("t", i)));
    EXPECT_LT(took, kOneTimeout) << Logs();
    ExpectSeqRepaired();
    ++i;
  }
  ExpectSameTables();
  for (const std::string& name : created_) {
    ASSERT_OK(clients_[1]->Delete(name));
  }
  created_.clear();
  ExpectSameTables();
}

// Skip markers written by someone else: every daemon honours the same one,
// a malformed one skips its number alone.
TEST_P(OpLogTest, ForgedSkipMarkersAreHonouredAlike) {
  ASSERT_OK(TimeCreate(0, "first").status());
  ASSERT_OK_AND_ASSIGN(int64_t n, log_->Add("seq", 1));
  ASSERT_OK(log_->Set(absl::StrCat("op/", n),
                      absl::StrCat("skip-to ", n + int64_t{1000000000000})));
  ASSERT_OK_AND_ASSIGN(absl::Duration jumped, TimeCreate(1, "after_jump"));
  EXPECT_LT(jumped, kOneTimeout) << Logs();
  ExpectSeqRepaired();

  for (const std::string marker :
       {"skip-to -5", "skip-to 99999999999999999999", "skip-to x", "skip-to"}) {
    SCOPED_TRACE(marker);
    ASSERT_OK_AND_ASSIGN(int64_t m, log_->Add("seq", 1));
    ASSERT_OK(log_->Set(absl::StrCat("op/", m), marker));
  }
  ASSERT_OK_AND_ASSIGN(absl::Duration malformed,
                       TimeCreate(2, "after_malformed"));
  EXPECT_LT(malformed, kOneTimeout) << Logs();
  ExpectSameTables();
}

// An op of tens of thousands of names is logged deflated: 38,000 names
// of 117 characters (a 4.6 MB request, over gRPC's default limit of 4
// MiB) fit etcd's request limit (1.5 MiB). One that still does not fit
// deflated (20,000 random names of 120, about 1.8 MB deflated) is refused
// at once as RESOURCE_EXHAUSTED, "not applied" (not UNAVAILABLE, which the
// client would retry), and its number is skipped without a claim timeout.
TEST_P(OpLogTest, LargeOpsAreDeflatedAndOnesTooLargeAreRefusedAtOnce) {
  ASSERT_OK(TimeCreate(0, "first").status());
  std::vector<std::string> names;
  for (int i = 0; i < 38000; ++i) {
    names.push_back(absl::StrFormat(
        "model.language_model.layers.%06d.mlp.experts.000.down_proj."
        "weight_scale_inv.quantized.fp8_e4m3.block_128x128.absent",
        i));
  }
  // Logged and run: every daemon finds no such tensor.
  EXPECT_THAT(clients_[1]->Begin(names).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("no tensor named "
                                       "\"model.language_model.layers.000000"),
                             HasSubstr(" and 37997 more"))));

  std::mt19937 random(7);
  constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
  std::uniform_int_distribution<int> pick(0, sizeof(kAlphabet) - 2);
  names.clear();
  for (int i = 0; i < 20000; ++i) {
    std::string name(120, 'x');
    for (char& c : name) c = kAlphabet[pick(random)];
    names.push_back(std::move(name));
  }
  const absl::Status refused = clients_[2]->Begin(names).status();
  if (GetParam() == StoreKind::kEtcd) {
    EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                  AllOf(HasSubstr("not applied"),
                                        HasSubstr("max-request-bytes"))));
  } else {
    // The embedded store takes values up to 64 MiB.
    EXPECT_THAT(refused, StatusIs(absl::StatusCode::kNotFound,
                                  HasSubstr("no tensor named")));
  }
  ASSERT_OK_AND_ASSIGN(absl::Duration after, TimeCreate(1, "after"));
  EXPECT_LT(after, kOneTimeout) << Logs();
  ExpectSameTables();
}

INSTANTIATE_TEST_SUITE_P(Stores, OpLogTest,
                         ::testing::Values(StoreKind::kEmbedded,
                                           StoreKind::kEtcd),
                         [](const ::testing::TestParamInfo<StoreKind>& info) {
                           return info.param == StoreKind::kEtcd ? "Etcd"
                                                                 : "Embedded";
                         });

}  // namespace
}  // namespace tessera
