// Mutated requests against 4 real `tessera-server` processes: for every
// method of ControlService, ShardService, StoreService and grpc.health.v1,
// kRequestsPerMethod requests made from a valid one by bit flips,
// truncation, random bytes, inserted bytes, splices with another method's
// request and oversized varints or lengths. Every call must end within its
// deadline with a status (never gRPC's bare UNIMPLEMENTED for a method the
// daemons implement: a request that does not parse is INVALID_ARGUMENT), and
// afterwards every daemon still serves, a sentinel tensor keeps its values
// on every rank, and the control plane still creates and deletes.
//
// The seed is fixed (1), so that a suite that passed passes again, and
// printed; TESSERA_FUZZ_SEED=N runs seed N, TESSERA_FUZZ_SEED=random a
// fresh one (to explore), and TESSERA_FUZZ_REQUESTS changes the count (the
// default keeps the test within a minute or so on 2 cores).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/snapshot.h"
#include "client/version_watcher.h"
#include "client/version_writer.h"
#include "common/proto_convert.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.pb.h"
#include "tessera/v1/shard.pb.h"
#include "tessera/v1/store.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/iota.h"
#include "tests/testing/raw_call.h"
#include "tests/testing/status_matchers.h"
#include "wire/auth.h"

namespace tessera {
namespace {

namespace tt = ::tessera::testing;

constexpr int kWorld = 4;
constexpr int kDefaultRequestsPerMethod = 1000;

// One method and the valid requests its mutants start from (a stream
// method's requests are its messages, in order).
struct Method {
  std::string path;
  enum Kind { kUnary, kStream } kind;
  std::vector<std::string> messages;
  // Where it is served: a daemon's gRPC port or the store's.
  bool store = false;
  // Logged control ops wait for the log: a longer deadline.
  bool logged = false;
  // Calls that wait by design (a health watch) end sooner.
  bool waits = false;
};

std::string Bytes(const google::protobuf::Message& message) {
  return message.SerializeAsString();
}

v1::ShardingSpec Spec(int dim) {
  return ToProto(*ChunkShardingSpec::Create(
      dim, {"rank:0/cpu", "rank:1/cpu", "rank:2/cpu", "rank:3/cpu"}));
}

// Appends a varint.
void Varint(std::string* out, uint64_t value) {
  do {
    char byte = static_cast<char>(value & 0x7f);
    value >>= 7;
    if (value != 0) byte = static_cast<char>(byte | 0x80);
    out->push_back(byte);
  } while (value != 0);
}

std::string Mutate(const std::string& base, const std::string& other,
                   std::mt19937_64& rng) {
  std::string out = base;
  auto pick = [&rng](size_t n) { return n == 0 ? 0 : rng() % n; };
  switch (rng() % 7) {
    case 0:  // Bit flips.
      if (out.empty()) out.push_back(static_cast<char>(rng()));
      for (int i = 0, n = 1 + static_cast<int>(rng() % 8); i < n; ++i) {
        out[pick(out.size())] ^= static_cast<char>(1 << (rng() % 8));
      }
      break;
    case 1:  // Truncation.
      out.resize(pick(out.size() + 1));
      break;
    case 2: {  // Random bytes.
      out.resize(rng() % 64);
      for (char& c : out) c = static_cast<char>(rng());
      break;
    }
    case 3: {  // Interesting bytes over random ones.
      static constexpr unsigned char kInteresting[] = {0x00, 0x01, 0x7f, 0x80,
                                                       0xff, 0xfe, 0x0a, 0x12};
      if (out.empty()) out.push_back(0);
      for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i) {
        out[pick(out.size())] =
            static_cast<char>(kInteresting[rng() % sizeof(kInteresting)]);
      }
      break;
    }
    case 4: {  // Inserted bytes.
      std::string inserted(1 + rng() % 16, '\0');
      for (char& c : inserted) c = static_cast<char>(rng());
      out.insert(pick(out.size() + 1), inserted);
      break;
    }
    case 5:  // A splice with another method's request.
      out = out.substr(0, pick(out.size() + 1)) +
            other.substr(pick(other.size() + 1));
      break;
    case 6: {  // A field with a huge varint, or a length past the end.
      const uint64_t field = 1 + rng() % 8;
      if (rng() % 2 == 0) {
        Varint(&out, field << 3);
        Varint(&out, rng() % 2 == 0 ? ~uint64_t{0} : uint64_t{1} << 62);
      } else {
        Varint(&out, (field << 3) | 2);
        Varint(&out, uint64_t{1} << (20 + rng() % 40));
        out += "short";
      }
      break;
    }
  }
  return out;
}

class RequestFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tt::DaemonClusterOptions options;
    options.world_size = kWorld;
    options.server_path = TESSERA_SERVER_PATH;
    options.extra_args = {"--timeout",      "20",    "--log-level", "error",
                          "--memory-limit", "256MiB"};
    ASSERT_OK_AND_ASSIGN(cluster_, tt::DaemonCluster::Start(options));
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(cluster_->address(0)));
  }

  std::unique_ptr<tt::DaemonCluster> cluster_;
  std::shared_ptr<Client> client_;
};

TEST_F(RequestFuzzTest, MutatedRequestsToEveryMethodLeaveTheClusterWhole) {
  const char* seed_env = std::getenv("TESSERA_FUZZ_SEED");
  const uint64_t seed = seed_env == nullptr ? uint64_t{1}
                        : std::string(seed_env) == "random"
                            ? uint64_t{std::random_device()()}
                            : std::strtoull(seed_env, nullptr, 10);
  const char* count_env = std::getenv("TESSERA_FUZZ_REQUESTS");
  const int per_method =
      count_env != nullptr ? std::atoi(count_env) : kDefaultRequestsPerMethod;
  std::cout << "request fuzz: seed " << seed << " (TESSERA_FUZZ_SEED), "
            << per_method << " requests per method\n";

  // The sentinel, and the tensors the valid requests name.
  ShardingSpec rows = *ChunkShardingSpec::Create(
      0, {"rank:0/cpu", "rank:1/cpu", "rank:2/cpu", "rank:3/cpu"});
  ASSERT_OK_AND_ASSIGN(ShardedTensorView sentinel,
                       client_->Create("sentinel", {16, 8}, rows));
  ASSERT_OK(sentinel.Write({0, 0}, tt::Iota(16, 8)));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView target,
                       client_->Create("fuzz-w", {8, 4}, rows));
  ASSERT_OK(client_->Create("fuzz-r", {8, 4}, rows).status());
  ASSERT_OK(client_->Save("fuzz-ckpt", {"fuzz-w"}, true).status());

  // Valid requests of every method.
  std::vector<Method> methods;
  const std::string control = "/tessera.v1.ControlService/";
  {
    v1::CreateTensorRequest create;
    create.set_name("fuzz-c");
    create.add_sizes(8);
    create.add_sizes(4);
    create.set_dtype(v1::DTYPE_FLOAT32);
    create.set_init(v1::INIT_KIND_ZEROS);
    *create.mutable_spec() = Spec(0);
    v1::CreateTensorsRequest create_many;
    for (const char* name : {"fuzz-m0", "fuzz-m1"}) {
      v1::CreateTensorRequest* one = create_many.add_tensors();
      *one = create;
      one->set_name(name);
    }
    v1::DescribeNamedTensorRequest describe;
    describe.set_name("fuzz-w");
    v1::DeleteTensorRequest remove;
    remove.set_name("fuzz-c");
    v1::WriteRegionChunk header;
    header.mutable_header()->set_name("fuzz-w");
    for (int64_t x : {0, 0}) header.mutable_header()->add_offsets(x);
    for (int64_t x : {2, 4}) header.mutable_header()->add_sizes(x);
    header.mutable_header()->set_dtype(v1::DTYPE_FLOAT32);
    header.mutable_header()->set_total_bytes(32);
    v1::WriteRegionChunk data;
    data.set_data(std::string(32, '\1'));
    v1::ReadRegionRequest read;
    read.set_name("fuzz-w");
    for (int64_t x : {1, 1}) read.add_offsets(x);
    for (int64_t x : {4, 2}) read.add_sizes(x);
    v1::GatherRequest gather;
    gather.set_name("fuzz-w");
    v1::ReshardRequest reshard;
    reshard.set_name("fuzz-r");
    *reshard.mutable_spec() = Spec(1);
    v1::SaveCheckpointRequest save;
    save.set_path("fuzz-ckpt2");
    save.add_names("fuzz-w");
    save.set_overwrite(true);
    v1::LoadCheckpointRequest load;
    load.set_path("fuzz-ckpt");
    load.add_names("fuzz-w");
    load.add_as_names("fuzz-l");
    load.set_replace(true);
    methods = {
        {control + "GetCluster", Method::kUnary, {""}},
        {control + "CreateTensor",
         Method::kUnary,
         {Bytes(create)},
         false,
         true},
        {control + "CreateTensors",
         Method::kUnary,
         {Bytes(create_many)},
         false,
         true},
        {control + "ListTensors", Method::kUnary, {""}},
        {control + "DescribeTensor", Method::kUnary, {Bytes(describe)}},
        {control + "DeleteTensor",
         Method::kUnary,
         {Bytes(remove)},
         false,
         true},
        {control + "WriteRegion",
         Method::kStream,
         {Bytes(header), Bytes(data)}},
        {control + "ReadRegion", Method::kStream, {Bytes(read)}},
        {control + "Gather", Method::kStream, {Bytes(gather)}, false, true},
        {control + "Reshard", Method::kUnary, {Bytes(reshard)}, false, true},
        {control + "SaveCheckpoint",
         Method::kUnary,
         {Bytes(save)},
         false,
         true},
        {control + "LoadCheckpoint",
         Method::kUnary,
         {Bytes(load)},
         false,
         true},
    };
  }
  {
    v1::FetchShardRequest fetch;
    fetch.set_tensor_id(target.tensor_id());
    fetch.set_shard_index(1);
    v1::DescribeTensorRequest describe;
    describe.set_tensor_id(target.tensor_id());
    methods.push_back({"/tessera.v1.ShardService/FetchShard",
                       Method::kStream,
                       {Bytes(fetch)}});
    methods.push_back({"/tessera.v1.ShardService/DescribeTensor",
                       Method::kUnary,
                       {Bytes(describe)}});
  }
  {
    const std::string store = "/tessera.v1.StoreService/";
    v1::StoreSetRequest set;
    set.set_key("fuzz/k");
    set.set_value("value");
    v1::StoreGetRequest get;
    get.set_key("fuzz/k");
    get.set_timeout_ms(50);
    v1::StoreAddRequest add;
    add.set_key("fuzz/n");
    add.set_delta(1);
    v1::StoreCompareSetRequest compare;
    compare.set_key("fuzz/c");
    compare.set_expected("");
    compare.set_desired("x");
    v1::StoreDeleteRequest remove;
    remove.set_key("fuzz/d");
    v1::StoreWaitRequest wait;
    wait.add_keys("fuzz/k");
    wait.set_timeout_ms(50);
    v1::StoreCheckRequest check;
    check.add_keys("fuzz/k");
    for (auto [name, bytes] : std::vector<std::pair<std::string, std::string>>{
             {"Set", Bytes(set)},
             {"Get", Bytes(get)},
             {"Add", Bytes(add)},
             {"CompareSet", Bytes(compare)},
             {"Delete", Bytes(remove)},
             {"Wait", Bytes(wait)},
             {"Check", Bytes(check)}}) {
      methods.push_back({store + name, Method::kUnary, {bytes}, true});
    }
  }
  methods.push_back({"/grpc.health.v1.Health/Check", Method::kUnary, {""}});
  methods.push_back({"/grpc.health.v1.Health/Watch",
                     Method::kStream,
                     {""},
                     false,
                     false,
                     true});

  // Every method's mutants, spread over the daemons, a few threads at once.
  absl::Mutex mu;
  std::map<std::string, std::map<int, int>> codes;  // method -> code -> n
  std::map<std::pair<std::string, int>, std::string> samples;  // a message
  std::atomic<int> calls{0};
  std::vector<std::thread> threads;
  constexpr int kThreads = 4;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      std::vector<std::unique_ptr<grpc::GenericStub>> daemons;
      for (int r = 0; r < kWorld; ++r) {
        daemons.push_back(std::make_unique<grpc::GenericStub>(
            CreateTesseraChannel(cluster_->address(r))));
      }
      grpc::GenericStub store(CreateTesseraChannel(cluster_->store_address()));
      for (size_t m = t; m < methods.size(); m += kThreads) {
        const Method& method = methods[m];
        std::map<int, int> seen;
        std::map<int, std::string> sample;
        for (int i = 0; i < per_method; ++i) {
          std::vector<std::string> messages = method.messages;
          const size_t which = rng() % messages.size();
          const Method& other = methods[rng() % methods.size()];
          messages[which] =
              Mutate(messages[which], other.messages.front(), rng);
          grpc::GenericStub& stub =
              method.store ? store : *daemons[rng() % kWorld];
          const absl::Duration timeout = method.logged ? absl::Seconds(10)
                                         : method.waits
                                             ? absl::Milliseconds(20)
                                             : absl::Milliseconds(500);
          const absl::Time start = absl::Now();
          const grpc::Status status =
              tt::RawCall::Run(stub, method.path, messages, timeout);
          // Every call ends by its deadline (plus scheduling slack).
          EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(5))
              << method.path;
          ++seen[status.error_code()];
          // gRPC's answer for a request it could not hand to a handler;
          // the request guard must have replaced it.
          if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
              status.error_message().empty()) {
            ADD_FAILURE() << method.path
                          << " answered UNIMPLEMENTED without a message";
          }
          sample.emplace(status.error_code(), status.error_message());
          calls.fetch_add(1);
        }
        absl::MutexLock lock(&mu);
        codes[method.path] = std::move(seen);
        for (auto& [code, message] : sample) {
          samples[{method.path, code}] = std::move(message);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  std::cout << "request fuzz: " << calls.load() << " calls\n";
  for (const auto& [path, seen] : codes) {
    std::string line = absl::StrCat("  ", path, ":");
    for (const auto& [code, n] : seen)
      absl::StrAppend(&line, " ", code, "x", n);
    std::cout << line << "\n";
    for (const auto& [code, n] : seen) {
      if (code == 0) continue;
      std::cout << "    e.g. " << code << ": "
                << samples[{path, code}].substr(0, 160) << "\n";
    }
    EXPECT_EQ(seen.count(grpc::StatusCode::UNKNOWN), 0u) << path;
  }
  EXPECT_EQ(calls.load(), per_method * static_cast<int>(methods.size()));

  // Every daemon serves; the sentinel is whole on every daemon; the
  // control plane still works.
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_FALSE(cluster_->daemon(r).WaitFor(absl::ZeroDuration()))
        << "daemon " << r << " died:\n"
        << cluster_->Log(r);
    ASSERT_OK_AND_ASSIGN(auto other, Client::Connect(cluster_->address(r)));
    ASSERT_OK_AND_ASSIGN(ShardedTensorView view, other->Open("sentinel"));
    EXPECT_EQ(view.tensor_id(), sentinel.tensor_id());
    ASSERT_OK_AND_ASSIGN(Tensor values, view.Read());
    tt::ExpectIotaBox(values, 0, 0, 8);
  }
  for (const absl::Status& health : client_->Health()) EXPECT_OK(health);
  ASSERT_OK(client_->Create("after", {4, 4}, rows).status());
  ASSERT_OK(client_->Delete("after"));
}

// A name of a megabyte (or ten thousand of them), or a checkpoint path of
// one, is refused or not found in a message of its first bytes, and each
// daemon's one line per op names only the first few, cut short: no request
// writes megabytes into a daemon's log or an error (common/tensor_name.h).
TEST(HugeNamesTest, CostTheErrorsAndTheDaemonsLogsLittle) {
  tt::DaemonClusterOptions options;
  options.world_size = 2;
  options.server_path = TESSERA_SERVER_PATH;
  options.extra_args = {"--timeout", "20", "--log-level", "info"};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<tt::DaemonCluster> cluster,
                       tt::DaemonCluster::Start(options));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                       Client::Connect(cluster->address(0)));
  constexpr size_t kLogCap = size_t{64} << 20;
  std::vector<size_t> before;
  for (int r = 0; r < 2; ++r) before.push_back(cluster->Log(r, kLogCap).size());

  const std::string huge(1 << 20, 'n');
  std::vector<std::string> many;
  for (int i = 0; i < 10000; ++i) {
    many.push_back(absl::StrCat(std::string(120, 'm'), i));
  }
  ShardingSpec rows = *ChunkShardingSpec::Create(
      0, std::vector<std::string>{"rank:0/cpu", "rank:1/cpu"});
  v1::LoadCheckpointRequest load;
  load.set_path("ckpt/" + huge);
  const std::vector<absl::Status> errors = {
      client->Create(huge, {4}, rows).status(),
      client->Open(huge).status(),
      client->Delete(huge),
      client->DeleteMany(many),
      client->DeleteMany({huge, "b"}),
      client->Pin({huge}).status(),
      client->Pin(many).status(),
      client->Begin({huge}).status(),
      client->Join(huge + "@2").status(),
      client->Watch(huge).status(),
      client->Save("ckpt/" + huge, {"absent"}).status(),
      client->Load(load).status(),
  };
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_FALSE(errors[i].ok()) << i;
    EXPECT_LT(errors[i].message().size(), 4096u)
        << i << ": " << errors[i].message().substr(0, 300);
  }
  // Names of more bytes than a daemon takes in one request: refused by
  // the client before sending (wire/request_limit.h), not by the daemon's
  // gRPC (or, beyond 2 GiB, by gRPC's serializer aborting this process).
  const std::vector<std::string> heavy(70, huge);
  EXPECT_THAT(client->Pin(heavy).status(),
              tt::StatusIs(absl::StatusCode::kResourceExhausted,
                           ::testing::HasSubstr("a daemon takes")));
  EXPECT_THAT(client->Begin(heavy).status(),
              tt::StatusIs(absl::StatusCode::kResourceExhausted,
                           ::testing::HasSubstr("a daemon takes")));
  EXPECT_THAT(errors[0],
              tt::StatusIs(absl::StatusCode::kInvalidArgument,
                           ::testing::HasSubstr("...(1048576 bytes)")));
  for (int r = 0; r < 2; ++r) {
    const size_t grown = cluster->Log(r, kLogCap).size() - before[r];
    EXPECT_GT(grown, 0u) << "rank " << r << " logged no op line";
    EXPECT_LT(grown, size_t{64} << 10)
        << "rank " << r << " logged " << grown << " bytes";
  }
}

}  // namespace
}  // namespace tessera
