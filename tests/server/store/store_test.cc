// The Store contract, written once and run against every store (HashStore,
// FileStore, GrpcStore on a real in-process server, PrefixStore, EtcdStore
// on a real etcd), then what is particular to each: FileStore across
// processes, PrefixStore isolation, the gRPC service's parking,
// cancellation and shutdown, etcd's URLs, prefixes and a 3-member cluster
// losing and regaining members.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/store/etcd_store.h"
#include "server/store/file_store.h"
#include "server/store/grpc_store.h"
#include "server/store/hash_store.h"
#include "server/store/prefix_store.h"
#include "server/store/store.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_pki.h"
#include "wire/auth.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;

// A StatusOr that is OK and whose value matches `matcher`.
MATCHER_P(IsOkAndHolds, matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

// Generous: these bound hangs, they do not measure speed.
constexpr absl::Duration kPatience = absl::Seconds(5);
constexpr absl::Duration kShortTimeout = absl::Milliseconds(100);

// A fresh directory, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "tessera_store_XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  std::string File(absl::string_view name) const {
    return absl::StrCat(path_, "/", name);
  }

 private:
  std::string path_;
};

// Polls `done` until it holds or `limit` passes.
bool Eventually(const std::function<bool()>& done,
                absl::Duration limit = kPatience) {
  const absl::Time deadline = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// ---------------------------------------------------------------------------
// The contract, per store.

using KeepAlive = std::vector<std::shared_ptr<void>>;

struct Backend {
  std::string name;
  // A fresh, empty store; what it depends on (a server, a directory) goes
  // to `keep_alive`, which outlives it.
  std::function<absl::StatusOr<std::shared_ptr<Store>>(KeepAlive*)> make;
};

// Test names and ctest listings show the store, not the struct's bytes.
void PrintTo(const Backend& backend, std::ostream* os) { *os << backend.name; }

absl::StatusOr<std::shared_ptr<Store>> MakeHashStore(KeepAlive*) {
  return std::make_shared<HashStore>();
}

absl::StatusOr<std::shared_ptr<Store>> MakeFileStore(KeepAlive* keep_alive) {
  auto dir = std::make_shared<TempDir>();
  keep_alive->push_back(dir);
  ASSIGN_OR_RETURN(std::shared_ptr<FileStore> store,
                   FileStore::Open(dir->File("store")));
  return store;
}

absl::StatusOr<std::shared_ptr<Store>> MakeGrpcStore(KeepAlive* keep_alive) {
  ASSIGN_OR_RETURN(std::shared_ptr<StoreServer> server,
                   StoreServer::Start("127.0.0.1:0"));
  keep_alive->push_back(server);
  ASSIGN_OR_RETURN(std::shared_ptr<GrpcStore> store,
                   GrpcStore::Connect(server->address(), kPatience));
  return store;
}

// One etcd for the process (stopped, its directory removed, at exit);
// each store gets a prefix of its own, so it starts empty.
absl::StatusOr<std::shared_ptr<Store>> MakeEtcdStore(KeepAlive*) {
  static absl::StatusOr<std::unique_ptr<testing::EtcdCluster>> shared =
      testing::EtcdCluster::Start(1);
  const auto* etcd = &shared;
  if (!etcd->ok()) return etcd->status();
  static int stores = 0;
  EtcdStoreOptions options;
  options.endpoints = (**etcd)->endpoints();
  options.prefix = absl::StrCat("/store-test/", getpid(), "/", ++stores, "/");
  options.connect_timeout = kPatience;
  ASSIGN_OR_RETURN(std::shared_ptr<EtcdStore> store,
                   EtcdStore::Connect(options));
  return store;
}

absl::StatusOr<std::shared_ptr<Store>> MakePrefixStore(KeepAlive*) {
  return std::make_shared<PrefixStore>("pg0", std::make_shared<HashStore>());
}

class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, GetParam().make(&keep_alive_));
  }

  KeepAlive keep_alive_;
  std::shared_ptr<Store> store_;  // destroyed before what it depends on
};

TEST_P(StoreTest, GetReturnsWhatSetStored) {
  ASSERT_OK(store_->Set("addr", "10.0.0.1:29500"));
  EXPECT_THAT(store_->Get("addr", kPatience), IsOkAndHolds("10.0.0.1:29500"));
  ASSERT_OK(store_->Set("addr", "replaced"));
  EXPECT_THAT(store_->Get("addr", kPatience), IsOkAndHolds("replaced"));

  const std::string bytes("nccl\0id\n\xff", 9);
  ASSERT_OK(store_->Set("binary", bytes));
  EXPECT_THAT(store_->Get("binary", kPatience), IsOkAndHolds(bytes));
  ASSERT_OK(store_->Set("empty", ""));
  EXPECT_THAT(store_->Get("empty", kPatience), IsOkAndHolds(""));
}

TEST_P(StoreTest, GetWaitsForALaterSet) {
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_OK(store_->Set("late", "here"));
  });
  EXPECT_THAT(store_->Get("late", kPatience), IsOkAndHolds("here"));
  setter.join();
}

TEST_P(StoreTest, AddCountsFromZero) {
  EXPECT_THAT(store_->Add("counter", 5), IsOkAndHolds(5));
  EXPECT_THAT(store_->Add("counter", -7), IsOkAndHolds(-2));
  EXPECT_THAT(store_->Get("counter", kPatience), IsOkAndHolds("-2"));
}

TEST_P(StoreTest, ConcurrentAddsEachSeeADistinctValue) {
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 25;
  absl::Mutex mu;
  std::vector<int64_t> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        absl::StatusOr<int64_t> value = store_->Add("counter", 1);
        ASSERT_OK(value);
        absl::MutexLock lock(&mu);
        seen.push_back(*value);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<int64_t> expected(kThreads * kAddsPerThread);
  std::iota(expected.begin(), expected.end(), 1);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, expected);
  EXPECT_THAT(store_->Get("counter", kPatience),
              IsOkAndHolds(absl::StrCat(kThreads * kAddsPerThread)));
}

TEST_P(StoreTest, AddOnANonIntegerIsFailedPrecondition) {
  ASSERT_OK(store_->Set("name", "gloo"));
  EXPECT_THAT(store_->Add("name", 1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("'name' holds 'gloo'")));
  EXPECT_THAT(store_->Get("name", kPatience), IsOkAndHolds("gloo"));
}

TEST_P(StoreTest, CompareSetOnAnAbsentKeyWithEmptyExpectedSets) {
  EXPECT_THAT(store_->CompareSet("leader", "", "rank3"), IsOkAndHolds("rank3"));
  EXPECT_THAT(store_->Get("leader", kPatience), IsOkAndHolds("rank3"));
}

TEST_P(StoreTest, CompareSetOnAnAbsentKeyWithExpectedReturnsExpected) {
  EXPECT_THAT(store_->CompareSet("leader", "rank1", "rank3"),
              IsOkAndHolds("rank1"));
  EXPECT_THAT(store_->Check({"leader"}), IsOkAndHolds(false));
}

TEST_P(StoreTest, CompareSetOnAPresentKeySwapsOnlyOnAMatch) {
  ASSERT_OK(store_->Set("epoch", "1"));
  EXPECT_THAT(store_->CompareSet("epoch", "1", "2"), IsOkAndHolds("2"));
  EXPECT_THAT(store_->CompareSet("epoch", "1", "3"), IsOkAndHolds("2"));
  EXPECT_THAT(store_->Get("epoch", kPatience), IsOkAndHolds("2"));
}

TEST_P(StoreTest, DeleteRemovesTheKey) {
  EXPECT_THAT(store_->Delete("gone"), IsOkAndHolds(false));
  ASSERT_OK(store_->Set("gone", "v"));
  EXPECT_THAT(store_->Delete("gone"), IsOkAndHolds(true));
  EXPECT_THAT(store_->Check({"gone"}), IsOkAndHolds(false));
  EXPECT_THAT(store_->Get("gone", absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("gone")));
  ASSERT_OK(store_->Set("gone", "back"));
  EXPECT_THAT(store_->Get("gone", kPatience), IsOkAndHolds("back"));
}

TEST_P(StoreTest, WaitReturnsOnceEveryKeyIsSet) {
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_OK(store_->Set("rank0", "a"));
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_OK(store_->Set("rank1", "b"));
  });
  EXPECT_OK(store_->Wait({"rank0", "rank1"}, kPatience));
  EXPECT_THAT(store_->Check({"rank0", "rank1"}), IsOkAndHolds(true));
  setter.join();
  EXPECT_OK(store_->Wait({}, absl::ZeroDuration()));
}

TEST_P(StoreTest, CheckNeedsEveryKey) {
  EXPECT_THAT(store_->Check({"a"}), IsOkAndHolds(false));
  ASSERT_OK(store_->Set("a", "1"));
  EXPECT_THAT(store_->Check({"a"}), IsOkAndHolds(true));
  EXPECT_THAT(store_->Check({"a", "b"}), IsOkAndHolds(false));
  EXPECT_THAT(store_->Check({}), IsOkAndHolds(true));
}

TEST_P(StoreTest, GetTimesOutNamingTheKey) {
  const absl::Time start = absl::Now();
  EXPECT_THAT(store_->Get("missing", kShortTimeout),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("missing keys: [missing]")));
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_GE(elapsed, kShortTimeout - absl::Milliseconds(5));
  EXPECT_LT(elapsed, kPatience);
}

TEST_P(StoreTest, WaitTimesOutNamingOnlyTheMissingKeys) {
  ASSERT_OK(store_->Set("present", "1"));
  const absl::Time start = absl::Now();
  EXPECT_THAT(store_->Wait({"gone1", "present", "gone2"}, kShortTimeout),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("after 100ms; missing keys: [gone1, gone2]")));
  EXPECT_LT(absl::Now() - start, kPatience);
}

TEST_P(StoreTest, OverloadsWithoutATimeoutUseTheStoreTimeout) {
  store_->set_timeout(kShortTimeout);
  EXPECT_THAT(
      store_->Get("missing"),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("after 100ms")));
  EXPECT_THAT(
      store_->Wait({"missing"}),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("[missing]")));
}

TEST_P(StoreTest, EmptyKeysAreInvalidArgument) {
  const auto invalid = StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("key must not be empty"));
  EXPECT_THAT(store_->Set("", "v"), invalid);
  EXPECT_THAT(store_->Get("", kShortTimeout), invalid);
  EXPECT_THAT(store_->Add("", 1), invalid);
  EXPECT_THAT(store_->CompareSet("", "", "v"), invalid);
  EXPECT_THAT(store_->Delete(""), invalid);
  EXPECT_THAT(store_->Wait({"a", ""}, kShortTimeout), invalid);
  EXPECT_THAT(store_->Check({""}), invalid);
}

TEST_P(StoreTest, NegativeTimeoutsAreInvalidArgument) {
  ASSERT_OK(store_->Set("a", "1"));
  EXPECT_THAT(
      store_->Get("a", absl::Seconds(-1)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(
      store_->Wait({"a"}, absl::Seconds(-1)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

// Leases (etcd): a live key lasts while renewed and goes by the store's
// own clock once its holder stops. The other stores have none and say so
// (the daemons then count liveness themselves).
TEST_P(StoreTest, LiveKeysLastWhileRenewed) {
  absl::StatusOr<int64_t> lease =
      store_->SetLive("live", "here", absl::Seconds(1));
  if (absl::IsUnimplemented(lease.status())) {
    EXPECT_THAT(store_->Renew(1),
                StatusIs(absl::StatusCode::kUnimplemented, ::testing::_));
    return;
  }
  ASSERT_OK(lease.status());
  EXPECT_THAT(store_->Get("live", kPatience), IsOkAndHolds("here"));
  // Renewed every 200 ms for well past the ttl: still there.
  for (int i = 0; i < 12; ++i) {
    ASSERT_OK(store_->Renew(*lease));
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_THAT(store_->Check({"live"}), IsOkAndHolds(true));
  // Left alone: gone, and the lease with it.
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<bool> here = store_->Check({"live"});
        return here.ok() && !*here;
      },
      absl::Seconds(10)));
  EXPECT_THAT(store_->Renew(*lease),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("ran out")));
  EXPECT_THAT(store_->SetLive("", "x", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(store_->SetLive("x", "x", absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest,
                         ::testing::Values(Backend{"HashStore", MakeHashStore},
                                           Backend{"FileStore", MakeFileStore},
                                           Backend{"GrpcStore", MakeGrpcStore},
                                           Backend{"PrefixStore",
                                                   MakePrefixStore},
                                           Backend{"EtcdStore", MakeEtcdStore}),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param.name;
                         });

// ---------------------------------------------------------------------------
// HashStore's watches, which the gRPC service parks calls on.

// A store refuses writes past its limits and changes nothing; deleting
// and overwriting give the room back.
TEST(HashStoreTest, LimitsRefuseWithoutChangingAnything) {
  HashStoreLimits limits;
  limits.max_value_bytes = 10;
  limits.max_total_bytes = 30;
  HashStore store(limits);
  EXPECT_THAT(store.Set("k", std::string(11, 'x')),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("exceeds the limit of 10")));
  EXPECT_THAT(store.Check({"k"}), ::tessera::testing::IsOkAndHolds(false));
  ASSERT_OK(store.Set("a", std::string(9, 'x')));  // 10 bytes
  ASSERT_OK(store.Set("b", std::string(9, 'x')));  // 20 bytes
  EXPECT_THAT(store.Set("c", std::string(10, 'x')),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("store is full")));
  EXPECT_THAT(store.CompareSet("c", "", std::string(10, 'x')),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  ASSERT_OK(store.Set("a", "1"));  // Overwriting frees the difference.
  ASSERT_OK(store.Set("c", std::string(9, 'x')));
  ASSERT_OK(store.Add("n", 5).status());
  ASSERT_OK_AND_ASSIGN(bool deleted, store.Delete("b"));
  EXPECT_TRUE(deleted);
  ASSERT_OK(store.Set("d", std::string(9, 'x')));
  EXPECT_THAT(store.Get("a"), ::tessera::testing::IsOkAndHolds("1"));
}

TEST(HashStoreTest, WatchFiresOnceWithTheValuesWhenAllKeysAreSet) {
  HashStore store;
  int fired = 0;
  std::vector<std::string> values;
  store.Watch({"a", "b"}, [&](std::vector<std::string> v) {
    ++fired;
    values = std::move(v);
  });
  ASSERT_OK(store.Set("b", "2"));
  EXPECT_EQ(fired, 0);
  ASSERT_OK(store.Set("a", "1"));
  EXPECT_EQ(fired, 1);
  EXPECT_THAT(values, ElementsAre("1", "2"));
  ASSERT_OK(store.Set("a", "again"));
  EXPECT_EQ(fired, 1);
}

TEST(HashStoreTest, UnwatchedCallbacksNeverRun) {
  HashStore store;
  bool fired = false;
  const HashStore::WatchId id =
      store.Watch({"k"}, [&](std::vector<std::string>) { fired = true; });
  EXPECT_TRUE(store.Unwatch(id));
  ASSERT_OK(store.Set("k", "v"));
  EXPECT_FALSE(fired);

  const HashStore::WatchId ready =
      store.Watch({"k"}, [&](std::vector<std::string>) { fired = true; });
  EXPECT_TRUE(fired);
  EXPECT_FALSE(store.Unwatch(ready));
}

// ---------------------------------------------------------------------------
// FileStore.

// A child process: waits for the parent's go, adds to the counter, reports.
int RunFileStoreChild(const std::string& path, int child, int adds) {
  absl::StatusOr<std::shared_ptr<FileStore>> store = FileStore::Open(path);
  if (!store.ok()) return 1;
  if (!(*store)->Get("go", kPatience).ok()) return 2;
  for (int i = 0; i < adds; ++i) {
    if (!(*store)->Add("counter", 1).ok()) return 3;
  }
  if (!(*store)->Set(absl::StrCat("child/", child), "done").ok()) return 4;
  return 0;
}

TEST(FileStoreTest, ProcessesShareOneFile) {
  constexpr int kChildren = 4;
  constexpr int kAdds = 25;
  TempDir dir;
  const std::string path = dir.File("store");
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<FileStore> store, FileStore::Open(path));

  std::vector<pid_t> children;
  std::vector<std::string> reports;
  for (int child = 0; child < kChildren; ++child) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << "fork failed";
    // The child touches only its own FileStore, then leaves without
    // running the parent's atexit handlers or gtest teardown.
    if (pid == 0) _exit(RunFileStoreChild(path, child, kAdds));
    children.push_back(pid);
    reports.push_back(absl::StrCat("child/", child));
  }
  ASSERT_OK(store->Set("go", "1"));
  EXPECT_OK(store->Wait(reports, kPatience));
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child status " << status;
  }
  EXPECT_THAT(store->Get("counter", kPatience),
              IsOkAndHolds(absl::StrCat(kChildren * kAdds)));
}

TEST(FileStoreTest, ANewHandleReplaysTheWholeLog) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto first, FileStore::Open(dir.File("store")));
  ASSERT_OK(first->Set("kept", "1"));
  ASSERT_OK(first->Set("deleted", "2"));
  ASSERT_OK(first->Delete("deleted"));
  ASSERT_OK(first->Add("n", 3));
  ASSERT_OK_AND_ASSIGN(auto second, FileStore::Open(dir.File("store")));
  EXPECT_THAT(second->Get("kept", kPatience), IsOkAndHolds("1"));
  EXPECT_THAT(second->Check({"deleted"}), IsOkAndHolds(false));
  EXPECT_THAT(second->Add("n", 1), IsOkAndHolds(4));
  EXPECT_THAT(first->Get("n", kPatience), IsOkAndHolds("4"));
}

TEST(FileStoreTest, AWriterCutsOffATornRecord) {
  TempDir dir;
  const std::string path = dir.File("store");
  ASSERT_OK_AND_ASSIGN(auto store, FileStore::Open(path));
  ASSERT_OK(store->Set("before", "1"));
  {
    // What a process killed in the middle of an append leaves behind.
    std::ofstream torn(path, std::ios::binary | std::ios::app);
    torn.write("S\x05\x00", 3);
  }
  EXPECT_THAT(store->Check({"before"}), IsOkAndHolds(true));
  ASSERT_OK(store->Set("after", "2"));
  ASSERT_OK_AND_ASSIGN(auto reader, FileStore::Open(path));
  EXPECT_THAT(reader->Get("before", kPatience), IsOkAndHolds("1"));
  EXPECT_THAT(reader->Get("after", kPatience), IsOkAndHolds("2"));
}

TEST(FileStoreTest, AForeignFileIsInternal) {
  TempDir dir;
  const std::string path = dir.File("store");
  std::ofstream(path) << "this is not a store log, it is a text file\n";
  ASSERT_OK_AND_ASSIGN(auto store, FileStore::Open(path));
  EXPECT_THAT(store->Set("k", "v"),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("corrupt record at offset 0")));
}

TEST(FileStoreTest, OpenFailureNamesThePathAndTheError) {
  EXPECT_THAT(FileStore::Open("/nonexistent-tessera-dir/store"),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("/nonexistent-tessera-dir/store"),
                             HasSubstr("No such file or directory"))));
}

// ---------------------------------------------------------------------------
// PrefixStore.

TEST(PrefixStoreTest, PrefixesOverOneBaseDoNotSeeEachOther) {
  auto base = std::make_shared<HashStore>();
  PrefixStore group_a("a", base);
  PrefixStore group_b("b", base);
  ASSERT_OK(group_a.Set("k", "from a"));
  EXPECT_THAT(group_b.Check({"k"}), IsOkAndHolds(false));
  EXPECT_THAT(base->Get("a/k", kPatience), IsOkAndHolds("from a"));
  EXPECT_THAT(group_b.Add("k", 2), IsOkAndHolds(2));
  EXPECT_THAT(group_a.Get("k", kPatience), IsOkAndHolds("from a"));
  EXPECT_THAT(group_b.Wait({"k", "other"}, kShortTimeout),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("missing keys: [other]"),
                             Not(HasSubstr("b/")))));
}

TEST(PrefixStoreTest, NestedPrefixesCompose) {
  auto base = std::make_shared<HashStore>();
  auto outer = std::make_shared<PrefixStore>("job", base);
  PrefixStore inner("pg1", outer);
  ASSERT_OK(inner.Set("k", "v"));
  EXPECT_THAT(base->Get("job/pg1/k", kPatience), IsOkAndHolds("v"));
  EXPECT_THAT(inner.Get("absent", kShortTimeout),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("missing keys: [absent]")));
}

// ---------------------------------------------------------------------------
// The gRPC service and its client.

class GrpcStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(server_, StoreServer::Start("127.0.0.1:0"));
    ASSERT_OK_AND_ASSIGN(client_,
                         GrpcStore::Connect(server_->address(), kPatience));
    stub_ = v1::StoreService::NewStub(CreateTesseraChannel(server_->address()));
  }

  bool ParkedCallsReach(size_t n) {
    return Eventually([&] { return server_->service().parked_calls() == n; });
  }

  std::unique_ptr<StoreServer> server_;
  std::shared_ptr<GrpcStore> client_;
  std::unique_ptr<v1::StoreService::Stub> stub_;
};

TEST_F(GrpcStoreTest, TheHostSharesTheServedKeys) {
  ASSERT_OK(server_->service().store()->Set("direct", "1"));
  EXPECT_THAT(client_->Get("direct", kPatience), IsOkAndHolds("1"));
  ASSERT_OK(client_->Set("remote", "2"));
  EXPECT_THAT(server_->service().store()->Get("remote", kPatience),
              IsOkAndHolds("2"));
}

TEST_F(GrpcStoreTest, BadRequestsAreInvalidArgument) {
  v1::StoreGetRequest get;
  get.set_key("");
  get.set_timeout_ms(100);
  v1::StoreGetResponse get_response;
  grpc::ClientContext get_context;
  EXPECT_EQ(stub_->Get(&get_context, get, &get_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  v1::StoreWaitRequest wait;
  wait.add_keys("k");
  wait.set_timeout_ms(-1);
  v1::StoreWaitResponse wait_response;
  grpc::ClientContext wait_context;
  EXPECT_EQ(stub_->Wait(&wait_context, wait, &wait_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->service().parked_calls(), 0u);
}

TEST_F(GrpcStoreTest, ACancelledWaitIsUnparked) {
  grpc::ClientContext context;
  v1::StoreGetRequest request;
  request.set_key("never");
  request.set_timeout_ms(60'000);
  grpc::Status status;
  std::thread caller([&] {
    v1::StoreGetResponse response;
    status = stub_->Get(&context, request, &response);
  });
  ASSERT_TRUE(ParkedCallsReach(1));
  context.TryCancel();
  caller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(ParkedCallsReach(0));
}

TEST_F(GrpcStoreTest, TheCallDeadlineBoundsAParkedWait) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kShortTimeout));
  v1::StoreWaitRequest request;
  request.add_keys("never");
  request.set_timeout_ms(60'000);
  v1::StoreWaitResponse response;
  const absl::Time start = absl::Now();
  EXPECT_EQ(stub_->Wait(&context, request, &response).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, kPatience);
  EXPECT_TRUE(ParkedCallsReach(0));
}

TEST_F(GrpcStoreTest, ServerShutdownEndsAWaitWithAnError) {
  absl::Status status;
  absl::Duration elapsed;
  std::thread waiter([&] {
    const absl::Time start = absl::Now();
    status = client_->Get("never", absl::Seconds(60)).status();
    elapsed = absl::Now() - start;
  });
  ASSERT_TRUE(ParkedCallsReach(1));
  server_->Shutdown();
  waiter.join();
  EXPECT_THAT(status.code(), AnyOf(Eq(absl::StatusCode::kUnavailable),
                                   Eq(absl::StatusCode::kCancelled)))
      << status;
  EXPECT_LT(elapsed, kPatience);
}

TEST_F(GrpcStoreTest, ShutdownWithParkedWaitersIsPrompt) {
  constexpr int kWaiters = 3;
  std::atomic<int> failed{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      if (!client_->Wait({absl::StrCat("never", i)}, absl::Seconds(60)).ok()) {
        ++failed;
      }
    });
  }
  ASSERT_TRUE(ParkedCallsReach(kWaiters));
  const absl::Time start = absl::Now();
  server_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (std::thread& waiter : waiters) waiter.join();
  EXPECT_EQ(failed, kWaiters);
  server_->Shutdown();  // idempotent
}

// A port where nothing listens (any more).
int FreePort() {
  absl::StatusOr<std::unique_ptr<StoreServer>> server =
      StoreServer::Start("127.0.0.1:0");
  return server.ok() ? (*server)->port() : 0;
}

TEST(GrpcStoreConnectTest, NothingListeningIsUnavailableWithinTheTimeout) {
  const int port = FreePort();
  ASSERT_NE(port, 0);
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      GrpcStore::Connect(absl::StrCat("127.0.0.1:", port),
                         absl::Milliseconds(300)),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("unreachable")));
  EXPECT_LT(absl::Now() - start, kPatience);
}

TEST(GrpcStoreConnectTest, ARankMayStartBeforeTheServer) {
  const int port = FreePort();
  ASSERT_NE(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::unique_ptr<StoreServer> server;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    absl::StatusOr<std::unique_ptr<StoreServer>> started =
        StoreServer::Start(address);
    ASSERT_OK(started);
    server = *std::move(started);
  });
  absl::StatusOr<std::shared_ptr<GrpcStore>> client =
      GrpcStore::Connect(address, kPatience);
  starter.join();
  ASSERT_OK(client);
  ASSERT_OK((*client)->Set("k", "v"));
  EXPECT_THAT((*client)->Get("k", kPatience), IsOkAndHolds("v"));
}

// A store server that died is reported within GrpcStore::kReconnectWait,
// naming it, not at the call's deadline; one that comes back on the same
// port within that time is ridden out.
TEST(GrpcStoreConnectTest, ALostServerIsUnavailableWithinTheReconnectWait) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreServer> server,
                       StoreServer::Start("127.0.0.1:0"));
  const std::string address = absl::StrCat("127.0.0.1:", server->port());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GrpcStore> client,
                       GrpcStore::Connect(address, kPatience));
  client->set_timeout(absl::Seconds(60));
  ASSERT_OK(client->Set("k", "v"));
  server.reset();
  absl::Time start = absl::Now();
  EXPECT_THAT(client->Add("n", 1),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("store server at ", address,
                                              " is unreachable"))));
  EXPECT_LT(absl::Now() - start, GrpcStore::kReconnectWait + kPatience);
  EXPECT_THAT(client->Get("k", absl::Seconds(60)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));

  // Back on the same port while a call waits: the call goes through.
  std::thread restarter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    absl::StatusOr<std::unique_ptr<StoreServer>> restarted =
        StoreServer::Start(address);
    ASSERT_OK(restarted);
    server = *std::move(restarted);
  });
  absl::StatusOr<int64_t> added = client->Add("n", 1);
  restarter.join();
  EXPECT_THAT(added, IsOkAndHolds(1));
}

TEST(StoreServerTest, AnUnusableAddressIsUnavailable) {
  EXPECT_THAT(StoreServer::Start("256.1.1.1:0"),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("cannot listen on 256.1.1.1:0")));
}

// ---------------------------------------------------------------------------
// EtcdStore: URLs, prefixes, and a real 3-member cluster losing members.

TEST(EtcdStoreTest, ParsesUrls) {
  ASSERT_OK_AND_ASSIGN(EtcdStoreOptions options,
                       ParseEtcdUrl("etcd://10.0.0.1:2379,etcd-b:2379/jobs/7"));
  EXPECT_THAT(options.endpoints, ElementsAre("10.0.0.1:2379", "etcd-b:2379"));
  EXPECT_EQ(options.prefix, "/jobs/7/");
  ASSERT_OK_AND_ASSIGN(options, ParseEtcdUrl("etcd://[::1]:2379"));
  EXPECT_THAT(options.endpoints, ElementsAre("[::1]:2379"));
  EXPECT_EQ(options.prefix, "/tessera/");
  ASSERT_OK_AND_ASSIGN(options, ParseEtcdUrl("etcd://h:1/x/"));
  EXPECT_EQ(options.prefix, "/x/");

  for (const char* bad :
       {"http://h:2379", "etcd://", "etcd://h", "etcd://h:0", "etcd://h:70000",
        "etcd://h:2379,,g:2379", "etcd://:2379", "etcd://h:port/p"}) {
    EXPECT_THAT(ParseEtcdUrl(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_))
        << bad;
  }
}

TEST(EtcdStoreTest, NobodyAnsweringIsUnavailableNamingTheEndpoints) {
  ASSERT_OK_AND_ASSIGN(const int port, testing::PickFreePort());
  EtcdStoreOptions options;
  options.endpoints = {absl::StrCat("127.0.0.1:", port)};
  options.connect_timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  EXPECT_THAT(EtcdStore::Connect(options),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("etcd at 127.0.0.1:", port))));
  EXPECT_LT(absl::Now() - start, kPatience);
}

TEST(EtcdStoreTest, PrefixesKeepClustersApart) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<testing::EtcdCluster> etcd,
                       testing::EtcdCluster::Start(1));
  ASSERT_OK_AND_ASSIGN(EtcdStoreOptions a, ParseEtcdUrl(etcd->Url("job/a")));
  ASSERT_OK_AND_ASSIGN(EtcdStoreOptions b, ParseEtcdUrl(etcd->Url("job/ab")));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<EtcdStore> store_a,
                       EtcdStore::Connect(a));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<EtcdStore> store_b,
                       EtcdStore::Connect(b));
  ASSERT_OK(store_a->Set("seq", "1"));
  EXPECT_THAT(store_b->Check({"seq"}), IsOkAndHolds(false));
  EXPECT_THAT(store_b->Add("seq", 5), IsOkAndHolds(5));
  EXPECT_THAT(store_a->Get("seq", kPatience), IsOkAndHolds("1"));
  EXPECT_THAT(store_a->description(), HasSubstr("(prefix /job/a/)"));
  // Past etcd's request limit (1.5 MiB by default): refused as a resource,
  // naming the limit, and nothing written.
  EXPECT_THAT(store_a->Set("big", std::string(2 << 20, 'x')),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max-request-bytes")));
  EXPECT_THAT(store_a->Check({"big"}), IsOkAndHolds(false));
}

// An etcd requiring client certificates: a store presenting one signed by
// its CA works; one without a certificate, or trusting another CA, is
// refused, naming etcd, within the connect timeout.
TEST(EtcdStoreTest, MutualTlsAdmitsOnlyCertifiedClients) {
  if (!testing::Shell("openssl version")) {
    GTEST_SKIP() << "the openssl command is missing";
  }
  TempDir dir;
  testing::TestPki pki(dir.File(""));
  ASSERT_TRUE(pki.MakeCa("ca"));
  ASSERT_TRUE(pki.MakeCa("other"));
  ASSERT_TRUE(pki.MakeCert("etcd", "ca"));
  ASSERT_TRUE(pki.MakeCert("daemon", "ca"));
  ASSERT_TRUE(pki.MakeCert("stranger", "other"));
  testing::EtcdClusterOptions etcd_options;
  etcd_options.cert_file = pki.Path("etcd", "pem");
  etcd_options.key_file = pki.Path("etcd", "key");
  etcd_options.ca_file = pki.Path("ca", "pem");
  etcd_options.client_tls = pki.Client("ca", "daemon");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<testing::EtcdCluster> etcd,
                       testing::EtcdCluster::Start(etcd_options));
  ASSERT_OK_AND_ASSIGN(EtcdStoreOptions options,
                       ParseEtcdUrl(etcd->Url("tls")));
  options.tls = pki.Client("ca", "daemon");
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<EtcdStore> store,
                       EtcdStore::Connect(options));
  ASSERT_OK(store->Set("k", "v"));
  EXPECT_THAT(store->Get("k", kPatience), IsOkAndHolds("v"));

  options.connect_timeout = absl::Milliseconds(500);
  for (const TlsConfig& refused :
       {pki.Client("ca", ""), pki.Client("ca", "stranger"), TlsConfig()}) {
    options.tls = refused;
    EXPECT_THAT(EtcdStore::Connect(options),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("etcd at")));
  }
  // A client certificate without a CA to check etcd's with is refused
  // before dialling.
  options.tls = pki.Client("ca", "daemon");
  options.tls.ca_file.clear();
  EXPECT_THAT(EtcdStore::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

// A 3-member cluster: calls go on while any one member is down (killed
// under a waiting Get too), fail promptly without quorum, and work again
// once a quorum is back, with nothing written lost.
TEST(EtcdStoreTest, AThreeMemberClusterOutlivesAnyOneMember) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<testing::EtcdCluster> etcd,
                       testing::EtcdCluster::Start(3));
  ASSERT_OK_AND_ASSIGN(EtcdStoreOptions options,
                       ParseEtcdUrl(etcd->Url("quorum")));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<EtcdStore> store,
                       EtcdStore::Connect(options));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<EtcdStore> writer,
                       EtcdStore::Connect(options));
  for (int member = 0; member < 3; ++member) {
    SCOPED_TRACE(absl::StrCat("member ", member, " down"));
    // A Get waiting on whichever member the store uses; the member dies
    // under it, the value is set through another.
    std::thread waiter([&] {
      EXPECT_THAT(store->Get(absl::StrCat("late", member), kPatience * 2),
                  IsOkAndHolds("here"));
    });
    absl::SleepFor(absl::Milliseconds(100));
    etcd->Kill(member);
    const absl::Time start = absl::Now();
    EXPECT_THAT(store->Add("count", 1), IsOkAndHolds(member + 1));
    EXPECT_OK(writer->Set(absl::StrCat("late", member), "here"));
    waiter.join();
    EXPECT_THAT(store->CompareSet("owner", "", absl::StrCat(member)),
                IsOkAndHolds("0"));
    EXPECT_LT(absl::Now() - start, kPatience);
    ASSERT_OK(etcd->Restart(member));
  }

  // Two of three down: no quorum, refused within seconds, naming etcd.
  etcd->Kill(1);
  etcd->Kill(2);
  const absl::Time start = absl::Now();
  EXPECT_THAT(store->Set("k", "v"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("etcd at ")));
  EXPECT_LT(absl::Now() - start,
            EtcdStore::kAttemptTimeout + EtcdStore::kReconnectWait + kPatience);
  ASSERT_OK(etcd->Restart(2));
  EXPECT_OK(store->Set("k", "v"));
  EXPECT_THAT(store->Get("count", kPatience), IsOkAndHolds("3"));
  EXPECT_THAT(store->Get("k", kPatience), IsOkAndHolds("v"));
}

}  // namespace
}  // namespace tessera
