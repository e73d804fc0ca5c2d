// The local path's server side: shareable host memory (Storage), the
// LocalPathServer spoken to raw and badly on purpose (and lending to a
// ShardClient in the same process), and a Rank publishing its local
// address. ShardClient's local path against an owner in another process,
// with its fallbacks and errors, is tests/client/local_path_test.cc.
#include "server/serve/local_path_server.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/local_path.h"
#include "client/shard_client.h"
#include "common/proto_convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file.h"
#include "io/subprocess.h"
#include "io/unix_socket.h"
#include "server/rank/rank.h"
#include "server/serve/data_plane_server.h"
#include "server/serve/shard_registry.h"
#include "server/store/hash_store.h"
#include "tessera/v1/local.pb.h"
#include "tests/testing/iota.h"
#include "tests/testing/status_matchers.h"
#include "wire/chunk_codec.h"

namespace tessera {
namespace {

using ::tessera::testing::IotaInt64;
using ::tessera::testing::IsOk;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;

// Bound on every wait of the test itself.
constexpr absl::Duration kWait = absl::Seconds(10);
// What LocalPathAsNobody.Asks asks: "<socket>\n<0 or 1: write>\n<refusal>".
constexpr char kAskEnv[] = "TESSERA_TEST_ASK_AS_NOBODY";
constexpr char kCannotRunReason[] =
    "nobody cannot run this test binary (a directory above it is private)";
// The local path's fetches never use the gRPC channel (connecting is
// lazy), and a fallback to it fails fast: nothing listens there.
constexpr char kNoGrpc[] = "127.0.0.1:1";

// Turns host memory sharing on for one test and off again after it (the
// switch is process-wide).
class ScopedSharing {
 public:
  explicit ScopedSharing(int64_t min_bytes) { SetHostMemorySharing(min_bytes); }
  ~ScopedSharing() { DisableHostMemorySharing(); }
};

// `tensor` as shard 0 of a one-shard tensor on rank 0.
std::shared_ptr<RegisteredTensor> OneShard(const Tensor& tensor) {
  auto registered = std::make_shared<RegisteredTensor>();
  auto metadata_ptr = std::make_shared<ShardedTensorMetadata>();
  ShardedTensorMetadata& metadata = *metadata_ptr;
  metadata.tensor_properties.dtype = tensor.dtype();
  metadata.size = tensor.sizes();
  absl::StatusOr<ShardMetadata> shard = ShardMetadata::Create(
      std::vector<int64_t>(tensor.dim(), 0), tensor.sizes(),
      RemoteDevice::ForRank(0, tensor.device()));
  EXPECT_OK(shard.status());
  metadata.shards_metadata.push_back(*shard);
  registered->metadata = std::move(metadata_ptr);
  registered->local_shards.push_back(LocalShard{0, tensor});
  return registered;
}

// Waits until `done()` or kWait passed; returns done().
template <typename F>
bool Eventually(F done) {
  const absl::Time end = absl::Now() + kWait;
  while (!done() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
  return done();
}

// ---- Shareable host memory --------------------------------------------------

TEST(HostMemorySharingTest, OffByDefault) {
  EXPECT_EQ(HostMemorySharingMinBytes(), std::nullopt);
  ASSERT_OK_AND_ASSIGN(Tensor big, Tensor::Empty({1 << 20}));
  EXPECT_EQ(big.storage()->shared_memory_fd(), -1);
}

TEST(HostMemorySharingTest, LargeCpuAllocationsAreSealedMemoryFiles) {
  ScopedSharing sharing(64 << 10);
  EXPECT_EQ(HostMemorySharingMinBytes(), 64 << 10);
  ASSERT_OK_AND_ASSIGN(
      Tensor shared,
      Tensor::Empty({100000}, TensorOptions().WithDType(DType::kFloat32)));
  const Storage& storage = *shared.storage();
  const int fd = storage.shared_memory_fd();
  ASSERT_GE(fd, 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(storage.data()) % 64, 0u);
  EXPECT_EQ(storage.nbytes(), 400000u);
  EXPECT_FALSE(storage.pinned());
  struct stat info;
  ASSERT_EQ(fstat(fd, &info), 0);
  EXPECT_GE(info.st_size, 400000);
  const int seals = fcntl(fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  // The file holds the tensor's bytes: another mapping sees its writes.
  shared.data<float>()[99999] = 2.5f;
  void* again = mmap(nullptr, info.st_size, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(again, MAP_FAILED);
  EXPECT_EQ(static_cast<const float*>(again)[99999], 2.5f);
  munmap(again, info.st_size);
}

TEST(HostMemorySharingTest, SmallPinnedEmptyAndDeviceAllocationsAreNot) {
  ScopedSharing sharing(64 << 10);
  ASSERT_OK_AND_ASSIGN(Tensor below,
                       Tensor::Empty({(64 << 10) - 1},
                                     TensorOptions().WithDType(DType::kUInt8)));
  EXPECT_EQ(below.storage()->shared_memory_fd(), -1);
  ASSERT_OK_AND_ASSIGN(
      Tensor at,
      Tensor::Empty({64 << 10}, TensorOptions().WithDType(DType::kUInt8)));
  EXPECT_GE(at.storage()->shared_memory_fd(), 0);
  ASSERT_OK_AND_ASSIGN(Tensor empty, Tensor::Empty({0, 100}));
  EXPECT_EQ(empty.storage()->shared_memory_fd(), -1);
  EXPECT_EQ(empty.data_ptr(), nullptr);
  ASSERT_OK_AND_ASSIGN(
      Tensor meta,
      Tensor::Empty({1 << 20}, TensorOptions().WithDevice(Device::Meta())));
  EXPECT_EQ(meta.storage()->shared_memory_fd(), -1);
  absl::StatusOr<Tensor> pinned = Tensor::Empty(
      {16 << 10}, TensorOptions().WithDType(DType::kUInt8).WithPinMemory(true));
  if (pinned.ok()) {
    EXPECT_EQ(pinned->storage()->shared_memory_fd(), -1);
  } else {
    // No page-locked memory to be had here (RLIMIT_MEMLOCK): the point
    // stands for the allocations that succeed.
    EXPECT_THAT(pinned.status(),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("")));
  }
}

TEST(HostMemorySharingTest, DisablingKeepsExistingStoragesValid) {
  std::optional<ScopedSharing> sharing(std::in_place, 4096);
  Tensor before = IotaInt64({4096});
  ASSERT_GE(before.storage()->shared_memory_fd(), 0);
  sharing.reset();
  EXPECT_EQ(HostMemorySharingMinBytes(), std::nullopt);
  Tensor after = IotaInt64({4096});
  EXPECT_EQ(after.storage()->shared_memory_fd(), -1);
  EXPECT_EQ(before.data<int64_t>()[4095], 4095);
}

TEST(HostMemorySharingTest, ConcurrentAllocationsWhileToggling) {
  std::atomic<bool> stop{false};
  std::thread toggler([&] {
    while (!stop.load()) {
      SetHostMemorySharing(1024);
      DisableHostMemorySharing();
    }
  });
  std::vector<std::thread> allocators;
  for (int t = 0; t < 4; ++t) {
    allocators.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        Tensor tensor = IotaInt64({512}, t * 1000 + i);
        ASSERT_EQ(tensor.data<int64_t>()[511], t * 1000 + i + 511);
      }
    });
  }
  for (std::thread& t : allocators) t.join();
  stop = true;
  toggler.join();
  DisableHostMemorySharing();
}

TEST(StorageWrapTest, ReleasesOnceAndViewsAreBoundsChecked) {
  std::vector<int64_t> memory(100);
  for (int i = 0; i < 100; ++i) memory[i] = i;
  int releases = 0;
  {
    std::shared_ptr<Storage> storage =
        Storage::Wrap(memory.data(), memory.size() * 8, Device::Cpu(),
                      [&releases] { ++releases; });
    EXPECT_EQ(storage->shared_memory_fd(), -1);
    ASSERT_OK_AND_ASSIGN(
        Tensor view,
        Tensor::FromStorage(storage, DType::kInt64, 5, {3, 4}, {20, 2}));
    EXPECT_EQ(view.data<int64_t>()[0], 5);
    EXPECT_FALSE(view.is_contiguous());
    ASSERT_OK_AND_ASSIGN(Tensor copy, view.Contiguous());
    EXPECT_EQ(copy.data<int64_t>()[11], 5 + 2 * 20 + 3 * 2);
    // The last element 5 + 2*20 + 3*2 = 51 fits; one more row does not.
    EXPECT_THAT(Tensor::FromStorage(storage, DType::kInt64, 5, {5, 4}, {25, 2})
                    .status(),
                StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
    EXPECT_THAT(
        Tensor::FromStorage(storage, DType::kInt64, 0, {2}, {-1}).status(),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("negative stride")));
    EXPECT_THAT(
        Tensor::FromStorage(storage, DType::kInt64, 0, {2, 2}, {1}).status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("strides")));
    EXPECT_THAT(Tensor::FromStorage(storage, DType::kInt64, 0,
                                    {int64_t{1} << 62}, {int64_t{1} << 40})
                    .status(),
                StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
    // An empty view may sit anywhere.
    EXPECT_OK(Tensor::FromStorage(storage, DType::kInt64, 1000, {0, 4}, {4, 1})
                  .status());
    EXPECT_EQ(releases, 0);
  }
  EXPECT_EQ(releases, 1);
}

// ---- LocalPathServer, spoken to raw ---------------------------------------

class LocalPathServerTest : public ::testing::Test {
 public:
  // Public for LocalPathAsNobody, the same asks from another process.
  static constexpr char kId[] = "t";

  void SetUp() override {
    StartServer(LocalPathServerOptions());
    SetHostMemorySharing(4096);
    shard_ = IotaInt64({128, 64}, 1000);
    ASSERT_GE(shard_.storage()->shared_memory_fd(), 0);
    DisableHostMemorySharing();
    ASSERT_OK(registry_->Register(kId, OneShard(shard_)));
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  void StartServer(LocalPathServerOptions options) {
    if (server_ != nullptr) server_->Shutdown();
    ASSERT_OK_AND_ASSIGN(server_, LocalPathServer::Start(registry_, options));
    ASSERT_OK_AND_ASSIGN(auto parsed, ParseLocalAddress(server_->address()));
    EXPECT_EQ(parsed.first, HostId());
    socket_name_ = parsed.second;
  }

  // A connection that has sent `greeting`.
  UniqueFd Dial(absl::string_view greeting = kLocalMagic) {
    absl::StatusOr<UniqueFd> socket =
        ConnectLocal(socket_name_, absl::Now() + kWait);
    EXPECT_OK(socket.status());
    if (!socket.ok()) return UniqueFd();
    EXPECT_OK(SendLocalMessage(socket->get(), greeting, absl::Now() + kWait));
    return *std::move(socket);
  }

  static std::string Request(const std::string& id,
                             std::vector<int64_t> region_offsets = {},
                             std::vector<int64_t> region_sizes = {}) {
    v1::LocalFetchRequest request;
    request.mutable_request()->set_tensor_id(id);
    request.mutable_request()->set_shard_index(0);
    for (int64_t o : region_offsets) {
      request.mutable_request()->add_region_offsets(o);
    }
    for (int64_t s : region_sizes)
      request.mutable_request()->add_region_sizes(s);
    return request.SerializeAsString();
  }

  // Sends `request` and reads the reply (and its descriptor).
  static absl::StatusOr<v1::LocalFetchReply> Ask(int fd,
                                                 const std::string& request,
                                                 UniqueFd* attached) {
    absl::Status sent = SendLocalMessage(fd, request, absl::Now() + kWait);
    if (!sent.ok()) return sent;
    absl::StatusOr<std::string> message =
        ReceiveLocalMessage(fd, absl::Now() + kWait, attached);
    if (!message.ok()) return message.status();
    v1::LocalFetchReply reply;
    if (!reply.ParseFromString(*message)) {
      return absl::DataLossError("unparsable LocalFetchReply");
    }
    return reply;
  }

  // A connection holding a lease on the whole shard kId, lent as a memory
  // file; an invalid socket (and a failure) when it is not.
  UniqueFd Lease() {
    UniqueFd socket = Dial();
    UniqueFd fd;
    absl::StatusOr<v1::LocalFetchReply> reply =
        Ask(socket.get(), Request(kId), &fd);
    EXPECT_OK(reply.status());
    if (!reply.ok() || reply->transport() != v1::LOCAL_TRANSPORT_SHM) {
      ADD_FAILURE() << "no lease: "
                    << (reply.ok() ? reply->ShortDebugString() : "");
      return UniqueFd();
    }
    return socket;
  }

  static absl::Status SendDone(int fd) {
    const char done = kLocalDone;
    return SendLocalMessage(fd, absl::string_view(&done, 1),
                            absl::Now() + kWait);
  }

  // What the next read of a connection gives (UNAVAILABLE once closed).
  static absl::Status ReadNext(int fd) {
    return ReceiveLocalMessage(fd, absl::Now() + kWait).status();
  }

  // This test binary run again as uid nobody (LocalPathAsNobody.Asks,
  // through setpriv) asks for shard kId (to write it, with `write`). A
  // fresh process, not a fork of this multithreaded one: a forked child
  // that allocates can wait forever on a lock another thread held at the
  // fork (ASan's allocator does not lock around fork). 0: refused
  // FAILED_PRECONDITION with `refusal` in the message and no memory file;
  // 1: lent a memory file; kCannotRun: nobody cannot run this binary;
  // anything else: failed.
  static constexpr int kCannotRun = 127;
  static int AskAsNobody(const std::string& socket_name, bool write,
                         absl::string_view refusal) {
    char exe[4096];
    const ssize_t length = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (length <= 0) return -1;
    exe[length] = '\0';
    SpawnOptions spawn;
    spawn.program = "setpriv";
    spawn.search_path = true;
    spawn.args = {"--reuid=65534", "--regid=65534", "--clear-groups", exe,
                  "--gtest_filter=LocalPathAsNobody.Asks"};
    spawn.env = {{kAskEnv, absl::StrCat(socket_name, "\n", write ? 1 : 0, "\n",
                                        refusal)}};
    spawn.stdin_null = true;
    absl::StatusOr<Subprocess> child = Subprocess::Spawn(spawn);
    if (!child.ok()) {
      ADD_FAILURE() << child.status();
      return -1;
    }
    const std::optional<int> status = child->WaitFor(absl::Seconds(60));
    if (!status.has_value()) {
      ADD_FAILURE() << "the child asking as nobody did not finish";
      child->Kill();
      return -1;
    }
    return WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  }

  std::shared_ptr<ShardRegistry> registry_ = std::make_shared<ShardRegistry>();
  std::unique_ptr<LocalPathServer> server_;
  std::string socket_name_;
  Tensor shard_;
};

TEST_F(LocalPathServerTest, LendsTheMemoryFileReadOnly) {
  UniqueFd socket = Dial();
  UniqueFd fd;
  ASSERT_OK_AND_ASSIGN(v1::LocalFetchReply reply,
                       Ask(socket.get(), Request(kId, {2, 8}, {3, 5}), &fd));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  ASSERT_EQ(reply.transport(), v1::LOCAL_TRANSPORT_SHM);
  ASSERT_TRUE(fd.valid());
  EXPECT_EQ(reply.header().total_bytes(), 3 * 5 * 8);
  EXPECT_THAT(reply.header().sizes(), ::testing::ElementsAre(3, 5));
  // The region's element 0 is (2, 8) of a [128, 64] shard.
  EXPECT_EQ(reply.layout().offset_bytes(), (2 * 64 + 8) * 8);
  EXPECT_THAT(reply.layout().strides(), ::testing::ElementsAre(64, 1));
  EXPECT_EQ(reply.layout().storage_bytes(), 128 * 64 * 8);
  EXPECT_NE(fcntl(fd.get(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_EQ(fcntl(fd.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
  const size_t bytes = 128 * 64 * 8;
  void* readable = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(readable, MAP_FAILED);
  EXPECT_EQ(static_cast<const int64_t*>(readable)[2 * 64 + 8], 1000 + 136);
  munmap(readable, bytes);
  EXPECT_EQ(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0),
      MAP_FAILED);
  EXPECT_EQ(server_->active_leases(), 1);
  ASSERT_OK(SendDone(socket.get()));
  EXPECT_TRUE(Eventually([&] { return server_->active_leases() == 0; }));
  // The connection carries the next request.
  ASSERT_OK_AND_ASSIGN(reply, Ask(socket.get(), Request(kId), &fd));
  EXPECT_EQ(reply.code(), 0);
  EXPECT_EQ(reply.layout().offset_bytes(), 0);
  EXPECT_OK(SendDone(socket.get()));
}

// Readers are lent the storage's one read-only description
// (Storage::ReadOnlyMemoryFd: no path walk per lease). What a hostile
// reader can do to it reaches no later reader's bytes.
TEST_F(LocalPathServerTest, ReadersShareOneDescriptionThatNoneCanAlter) {
  UniqueFd first_socket = Dial();
  UniqueFd first;
  ASSERT_OK_AND_ASSIGN(v1::LocalFetchReply reply,
                       Ask(first_socket.get(), Request(kId), &first));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  ASSERT_TRUE(first.valid());
  const size_t bytes = 128 * 64 * 8;
  EXPECT_EQ(lseek(first.get(), 4096, SEEK_SET), 4096);
  EXPECT_EQ(fcntl(first.get(), F_SETFL, O_NONBLOCK | O_APPEND), 0);
  EXPECT_EQ(flock(first.get(), LOCK_EX | LOCK_NB), 0);
  EXPECT_NE(ftruncate(first.get(), 0), 0);
  EXPECT_NE(fallocate(first.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      0, static_cast<off_t>(bytes)),
            0);
  const int64_t garbage = -1;
  EXPECT_LT(pwrite(first.get(), &garbage, sizeof(garbage), 0), 0);
  ASSERT_OK(SendDone(first_socket.get()));

  UniqueFd second_socket = Dial();
  UniqueFd second;
  ASSERT_OK_AND_ASSIGN(reply, Ask(second_socket.get(), Request(kId), &second));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  ASSERT_TRUE(second.valid());
  // The same description (its offset moved by the first reader) ...
  EXPECT_EQ(lseek(second.get(), 0, SEEK_CUR), 4096);
  EXPECT_EQ(fcntl(second.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
  // ... whose mapping and positioned reads see the shard as it is.
  void* readable = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, second.get(), 0);
  ASSERT_NE(readable, MAP_FAILED);
  for (int64_t i = 0; i < 128 * 64; ++i) {
    ASSERT_EQ(static_cast<const int64_t*>(readable)[i], 1000 + i) << i;
  }
  munmap(readable, bytes);
  int64_t value = 0;
  ASSERT_EQ(pread(second.get(), &value, sizeof(value), 8 * 77),
            static_cast<ssize_t>(sizeof(value)));
  EXPECT_EQ(value, 1000 + 77);
  EXPECT_OK(SendDone(second_socket.get()));
}

TEST_F(LocalPathServerTest, LeaseKeepsTheShardUntilDone) {
  std::weak_ptr<Storage> storage = shard_.storage();
  shard_ = Tensor();
  UniqueFd socket = Lease();
  ASSERT_TRUE(socket.valid());
  // Unregistered while the client copies: the lease holds the storage.
  ASSERT_TRUE(registry_->Unregister(kId));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(storage.expired());
  EXPECT_EQ(server_->active_leases(), 1);
  // A new request no longer finds it.
  UniqueFd other = Dial();
  UniqueFd none;
  ASSERT_OK_AND_ASSIGN(v1::LocalFetchReply unknown,
                       Ask(other.get(), Request(kId), &none));
  EXPECT_EQ(unknown.code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(unknown.message(), HasSubstr("unknown tensor t"));
  EXPECT_FALSE(none.valid());
  ASSERT_OK(SendDone(socket.get()));
  EXPECT_TRUE(Eventually([&] { return storage.expired(); }));
  EXPECT_EQ(server_->active_leases(), 0);
}

TEST_F(LocalPathServerTest, LeaseEndsWhenTheClientCloses) {
  std::weak_ptr<Storage> storage = shard_.storage();
  shard_ = Tensor();
  {
    UniqueFd socket = Lease();
    ASSERT_TRUE(socket.valid());
    ASSERT_TRUE(registry_->Unregister(kId));
    EXPECT_FALSE(storage.expired());
  }
  EXPECT_TRUE(Eventually([&] { return storage.expired(); }));
  EXPECT_EQ(server_->active_leases(), 0);
}

TEST_F(LocalPathServerTest, LeaseTimesOut) {
  LocalPathServerOptions options;
  options.lease_timeout = absl::Milliseconds(200);
  StartServer(options);
  std::weak_ptr<Storage> storage = shard_.storage();
  shard_ = Tensor();
  UniqueFd socket = Lease();
  ASSERT_TRUE(socket.valid());
  ASSERT_TRUE(registry_->Unregister(kId));
  EXPECT_TRUE(Eventually([&] { return storage.expired(); }));
  // The connection went with the lease.
  EXPECT_THAT(ReadNext(socket.get()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("closed")));
}

TEST_F(LocalPathServerTest, AnswersLikeAStreamAndRefusesUnshareableMemory) {
  UniqueFd socket = Dial();
  UniqueFd fd;
  ASSERT_OK_AND_ASSIGN(v1::LocalFetchReply reply,
                       Ask(socket.get(), Request("nope"), &fd));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(reply.message(), HasSubstr("unknown tensor nope"));
  ASSERT_OK_AND_ASSIGN(reply,
                       Ask(socket.get(), Request(kId, {120, 0}, {9, 1}), &fd));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kOutOfRange));
  ASSERT_OK_AND_ASSIGN(reply, Ask(socket.get(), Request(kId, {1}, {1}), &fd));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  // Heap memory cannot be lent.
  ASSERT_OK(registry_->Register("heap", OneShard(IotaInt64({16, 16}))));
  ASSERT_OK_AND_ASSIGN(reply, Ask(socket.get(), Request("heap"), &fd));
  EXPECT_EQ(reply.code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(reply.transport(), v1::LOCAL_TRANSPORT_NONE);
  EXPECT_THAT(reply.message(), HasSubstr("cannot be shared"));
  EXPECT_FALSE(fd.valid());
  // Nor can a meta shard's.
  ASSERT_OK_AND_ASSIGN(
      Tensor meta,
      Tensor::Empty({4, 4}, TensorOptions().WithDevice(Device::Meta())));
  ASSERT_OK(registry_->Register("meta", OneShard(meta)));
  ASSERT_OK_AND_ASSIGN(reply, Ask(socket.get(), Request("meta"), &fd));
  EXPECT_EQ(reply.code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  // An empty region needs no memory: OK, transport NONE.
  ASSERT_OK_AND_ASSIGN(reply,
                       Ask(socket.get(), Request(kId, {3, 0}, {0, 5}), &fd));
  EXPECT_EQ(reply.code(), 0);
  EXPECT_EQ(reply.transport(), v1::LOCAL_TRANSPORT_NONE);
  EXPECT_EQ(reply.header().total_bytes(), 0);
  EXPECT_EQ(server_->active_leases(), 0);
}

TEST_F(LocalPathServerTest, MalformedInputClosesOnlyThatConnection) {
  // A wrong magic.
  UniqueFd stranger = Dial("GET / HTTP/1.1");
  EXPECT_THAT(ReadNext(stranger.get()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("closed")));
  // An unparsable request is answered, and the connection stays usable.
  UniqueFd garbled = Dial();
  UniqueFd fd;
  ASSERT_OK_AND_ASSIGN(v1::LocalFetchReply reply,
                       Ask(garbled.get(), std::string("\xff\xff\xff", 3), &fd));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reply.message(), HasSubstr("malformed request"));
  ASSERT_OK_AND_ASSIGN(reply, Ask(garbled.get(), Request(kId), &fd));
  EXPECT_EQ(reply.code(), 0);
  // Something else than "done" during a lease closes the connection and
  // ends the lease.
  ASSERT_OK(SendLocalMessage(garbled.get(), "not done", absl::Now() + kWait));
  EXPECT_THAT(ReadNext(garbled.get()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("closed")));
  EXPECT_TRUE(Eventually([&] { return server_->active_leases() == 0; }));
  // An oversized message.
  ASSERT_OK_AND_ASSIGN(UniqueFd raw,
                       ConnectLocal(socket_name_, absl::Now() + kWait));
  ASSERT_OK(SendLocalMessage(raw.get(), kLocalMagic, absl::Now() + kWait));
  const std::string huge(kMaxLocalMessageBytes + 100, 'x');
  ASSERT_EQ(send(raw.get(), huge.data(), huge.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(huge.size()));
  EXPECT_THAT(ReadNext(raw.get()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("closed")));
  // A request with descriptors attached: they are closed, it is answered.
  UniqueFd attaching = Dial();
  ASSERT_OK(SendLocalMessage(attaching.get(), Request(kId), absl::Now() + kWait,
                             STDERR_FILENO));
  ASSERT_OK_AND_ASSIGN(
      std::string answer,
      ReceiveLocalMessage(attaching.get(), absl::Now() + kWait, &fd));
  ASSERT_TRUE(reply.ParseFromString(answer));
  EXPECT_EQ(reply.code(), 0);
  ASSERT_OK(SendDone(attaching.get()));
  // A client that connects and says nothing, or vanishes mid-request.
  UniqueFd silent = *ConnectLocal(socket_name_, absl::Now() + kWait);
  { UniqueFd gone = Dial(); }
  // The server is unharmed.
  UniqueFd healthy = Dial();
  ASSERT_OK_AND_ASSIGN(reply, Ask(healthy.get(), Request(kId), &fd));
  EXPECT_EQ(reply.code(), 0);
  EXPECT_EQ(reply.transport(), v1::LOCAL_TRANSPORT_SHM);
  EXPECT_OK(SendDone(healthy.get()));
}

TEST_F(LocalPathServerTest, ShutdownWaitsForLeasesWithinGrace) {
  // Accepted before the lease's connection (the backlog is FIFO), so
  // certainly open when Shutdown starts.
  UniqueFd idle = Dial();
  UniqueFd socket = Lease();
  ASSERT_TRUE(socket.valid());
  // A client that finishes within the grace.
  std::thread client([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_OK(SendDone(socket.get()));
  });
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Seconds(5));
  client.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_EQ(server_->active_leases(), 0);
  EXPECT_THAT(ReadNext(idle.get()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("closed")));
  // Nothing listens any more.
  EXPECT_THAT(ConnectLocal(socket_name_, absl::Now() + kWait).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("")));
}

TEST_F(LocalPathServerTest, ShutdownCutsLeasesPastTheGrace) {
  UniqueFd socket = Lease();
  ASSERT_TRUE(socket.valid());
  ASSERT_EQ(server_->active_leases(), 1);
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(server_->active_leases(), 0);
}

// Only the daemon's own user, root and the allowed users are lent
// anything: a process of another user (a child that dropped to `nobody`)
// is told FAILED_PRECONDITION before its request is looked at, so its
// client falls back to a stream, where tokens and TLS apply.
TEST_F(LocalPathServerTest, OnlyAllowedUsersAreServed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as nobody";
  const int refused = AskAsNobody(socket_name_, false, "allowed users");
  if (refused == kCannotRun) GTEST_SKIP() << kCannotRunReason;
  EXPECT_EQ(refused, 0);
  EXPECT_EQ(server_->active_leases(), 0);
  // This user still is.
  UniqueFd socket = Lease();
  ASSERT_TRUE(socket.valid());
  ASSERT_OK(SendDone(socket.get()));

  LocalPathServerOptions allowing;
  allowing.allowed_users = {65534};
  StartServer(allowing);
  EXPECT_EQ(AskAsNobody(socket_name_, false, ""), 1);
}

// An allowed user of another uid may read but is never lent memory
// writable, even by a server that takes writes: it writes over a stream,
// where its token is checked.
TEST_F(LocalPathServerTest, OtherAllowedUsersMayReadButNotWrite) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as nobody";
  LocalPathServerOptions options;
  options.allowed_users = {65534};
  options.accept_writes = true;
  StartServer(options);
  const int read = AskAsNobody(socket_name_, false, "");
  if (read == kCannotRun) GTEST_SKIP() << kCannotRunReason;
  EXPECT_EQ(read, 1);
  EXPECT_EQ(AskAsNobody(socket_name_, true, "own user only"), 0);
  EXPECT_TRUE(Eventually([&] { return server_->active_leases() == 0; }));
}

TEST_F(LocalPathServerTest, ShardClientInTheSameProcess) {
  // The owner may be this very process (ranks as threads): the memory file
  // is mapped a second time.
  const auto client = ShardClient::Create(kNoGrpc, "", server_->address());
  FetchOptions options;
  options.local_path = LocalPath::kRequired;
  options.timeout = kWait;
  ASSERT_OK_AND_ASSIGN(Shard fetched, client->FetchShard(kId, 0, options));
  EXPECT_TRUE(Equal(fetched.tensor, shard_));
  EXPECT_EQ(fetched.metadata.shard_sizes(), shard_.sizes());
}

TEST_F(LocalPathServerTest, LendsTheMemoryFileWritableForAWrite) {
  LocalPathServerOptions options;
  options.accept_writes = true;
  StartServer(options);
  UniqueFd socket = Dial();
  UniqueFd fd;
  v1::LocalFetchRequest request;
  ASSERT_TRUE(request.ParseFromString(Request(kId, {2, 0}, {3, 64})));
  request.set_write(true);
  ASSERT_OK_AND_ASSIGN(v1::LocalFetchReply reply,
                       Ask(socket.get(), request.SerializeAsString(), &fd));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  ASSERT_EQ(reply.transport(), v1::LOCAL_TRANSPORT_SHM);
  ASSERT_TRUE(fd.valid());
  EXPECT_EQ(fcntl(fd.get(), F_GETFL) & O_ACCMODE, O_RDWR);
  EXPECT_EQ(reply.layout().offset_bytes(), 2 * 64 * 8);
  EXPECT_EQ(reply.header().total_bytes(), 3 * 64 * 8);
  const std::vector<int64_t> values(3 * 64, -5);
  ASSERT_OK(PwriteAll(fd.get(), values.data(), values.size() * 8,
                      reply.layout().offset_bytes(), "the lent file"));
  ASSERT_OK(SendDone(socket.get()));
  for (int64_t i = 0; i < 128 * 64; ++i) {
    ASSERT_EQ(shard_.data<int64_t>()[i], i >= 128 && i < 320 ? -5 : 1000 + i)
        << i;
  }
  // A plain fetch on the same connection is still lent read-only.
  ASSERT_OK_AND_ASSIGN(reply, Ask(socket.get(), Request(kId), &fd));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  EXPECT_EQ(fcntl(fd.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
  EXPECT_OK(SendDone(socket.get()));
}

TEST_F(LocalPathServerTest, WritesNeedAServerThatTakesThemAndADenseBox) {
  const auto ask_write = [&](std::vector<int64_t> offsets,
                             std::vector<int64_t> sizes) {
    UniqueFd socket = Dial();
    UniqueFd fd;
    v1::LocalFetchRequest request;
    EXPECT_TRUE(request.ParseFromString(Request(kId, offsets, sizes)));
    request.set_write(true);
    absl::StatusOr<v1::LocalFetchReply> reply =
        Ask(socket.get(), request.SerializeAsString(), &fd);
    EXPECT_OK(reply.status());
    EXPECT_FALSE(fd.valid());
    return reply.ok() ? *reply : v1::LocalFetchReply();
  };
  v1::LocalFetchReply reply = ask_write({0, 0}, {1, 64});
  EXPECT_EQ(reply.code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(reply.message(), HasSubstr("takes no writes"));
  LocalPathServerOptions options;
  options.accept_writes = true;
  StartServer(options);
  reply = ask_write({0, 8}, {3, 5});  // Columns: not one dense run.
  EXPECT_EQ(reply.code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(reply.message(), HasSubstr("dense run"));
  // The request is validated as a fetch of the box first.
  reply = ask_write({127, 0}, {2, 64});
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kOutOfRange));
  for (int64_t i = 0; i < 128 * 64; ++i) {
    ASSERT_EQ(shard_.data<int64_t>()[i], 1000 + i) << i;
  }
}

TEST_F(LocalPathServerTest, ShardClientWritesOverTheLocalPath) {
  LocalPathServerOptions options;
  options.accept_writes = true;
  StartServer(options);
  SetHostMemorySharing(4096);
  Tensor big = IotaInt64({1024, 64}, 0);  // 512 KiB: above kLocalPathMinBytes.
  DisableHostMemorySharing();
  ASSERT_OK(registry_->Register("big", OneShard(big)));
  // No data plane: only the local path can take it.
  const auto client = ShardClient::Create(kNoGrpc, "", server_->address());
  const Tensor rows = IotaInt64({512, 64}, -100000);
  RegionWriteOptions write;
  write.deadline = absl::Now() + kWait;
  int64_t reported = 0;
  write.on_chunk = [&](int64_t bytes) { reported += bytes; };
  ASSERT_OK_AND_ASSIGN(const bool written,
                       client->WriteRegion("big", 0, {256, 0}, rows, write));
  EXPECT_TRUE(written);
  EXPECT_EQ(reported, 512 * 64 * 8);
  for (int64_t i = 0; i < 1024 * 64; ++i) {
    const int64_t expected =
        i >= 256 * 64 && i < 768 * 64 ? -100000 + (i - 256 * 64) : i;
    ASSERT_EQ(big.data<int64_t>()[i], expected) << i;
  }
  // What the local path cannot take, with no data plane: not written.
  EXPECT_THAT(
      client->WriteRegion("big", 0, {0, 0}, IotaInt64({2, 64}, 0), write),
      IsOkAndHolds(false));  // Too small for the local path.
  EXPECT_THAT(
      client->WriteRegion("big", 0, {0, 0}, IotaInt64({1024, 32}, 0), write),
      IsOkAndHolds(false));  // Columns.
  // An id the owner has not registered (a restarted daemon refilling it)
  // is left to a stream, which routes the write into the refill.
  EXPECT_THAT(client->WriteRegion("missing", 0, {256, 0}, rows, write),
              IsOkAndHolds(false));
  // The owner's verdict on a bad box is final.
  EXPECT_THAT(client->WriteRegion("big", 0, {600, 0}, rows, write),
              StatusIs(absl::StatusCode::kOutOfRange, _));
}

// ---- Rank: the local address in the worker record ---------------------------

FetchOptions Local(LocalPath path) {
  FetchOptions options;
  options.local_path = path;
  options.local_min_bytes = 0;  // The test shards are small.
  options.timeout = kWait;
  return options;
}

TEST(RankLocalPathTest, RanksPublishAndUseTheirLocalAddress) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(absl::Seconds(30));
  std::shared_ptr<Rank> ranks[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RankOptions options;
      options.rank = r;
      options.world_size = 2;
      options.store = store;
      options.timeout = absl::Seconds(30);
      ASSERT_OK_AND_ASSIGN(ranks[r], Rank::Init(options));
      ASSERT_OK(ranks[r]->InitRpc());
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_NE(ranks[0], nullptr);
  ASSERT_NE(ranks[1], nullptr);
  EXPECT_TRUE(HostMemorySharingMinBytes().has_value());
  // Allocated after InitRpc turned sharing on: lendable.
  const Tensor values = IotaInt64({256, 64}, 5);
  ASSERT_GE(values.storage()->shared_memory_fd(), 0);
  ASSERT_OK(ranks[1]->registry().Register("r1", OneShard(values)));
  ASSERT_OK_AND_ASSIGN(WorkerInfo worker, ranks[0]->Worker(1));
  EXPECT_THAT(worker.local_address, ::testing::StartsWith(HostId() + "/"));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ShardClient> client,
                       ranks[0]->ClientFor(1));
  ASSERT_OK_AND_ASSIGN(
      Shard shard, client->FetchShard("r1", 0, Local(LocalPath::kRequired)));
  EXPECT_TRUE(Equal(shard.tensor, values));
  threads.clear();
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] { EXPECT_OK(ranks[r]->Shutdown()); });
  }
  for (std::thread& t : threads) t.join();
  DisableHostMemorySharing();
}

TEST(RankLocalPathTest, WithoutTheLocalPathTheRecordHasNoLocalAddress) {
  auto store = std::make_shared<HashStore>();
  RankOptions options;
  options.store = store;
  options.timeout = absl::Seconds(30);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Rank> rank, Rank::Init(options));
  RpcOptions rpc;
  rpc.serve_local_path = false;
  ASSERT_OK(rank->InitRpc(rpc));
  ASSERT_OK_AND_ASSIGN(WorkerInfo worker, rank->Worker(0));
  EXPECT_EQ(worker.local_address, "");
  EXPECT_OK(rank->Shutdown());
}

// Run only by AskAsNobody, as nobody: asks once and exits with its answer.
TEST(LocalPathAsNobody, Asks) {
  const char* spec = std::getenv(kAskEnv);
  if (spec == nullptr) GTEST_SKIP() << "run by LocalPathServerTest as nobody";
  const std::vector<std::string> parts =
      absl::StrSplit(spec, absl::MaxSplits('\n', 2));
  ASSERT_EQ(parts.size(), 3u) << spec;
  const int code = [&] {
    if (geteuid() == 0) return 3;
    absl::StatusOr<UniqueFd> socket =
        ConnectLocal(parts[0], absl::Now() + kWait);
    if (!socket.ok() ||
        !SendLocalMessage(socket->get(), kLocalMagic, absl::Now() + kWait)
             .ok()) {
      return 4;
    }
    v1::LocalFetchRequest request;
    request.mutable_request()->set_tensor_id(LocalPathServerTest::kId);
    request.set_write(parts[1] == "1");
    UniqueFd fd;
    absl::StatusOr<v1::LocalFetchReply> reply = LocalPathServerTest::Ask(
        socket->get(), request.SerializeAsString(), &fd);
    if (!reply.ok()) return 5;
    if (reply->code() ==
            static_cast<int>(absl::StatusCode::kFailedPrecondition) &&
        absl::StrContains(reply->message(), parts[2]) && !fd.valid()) {
      return 0;
    }
    return reply->code() == 0 && fd.valid() ? 1 : 2;
  }();
  std::fflush(nullptr);
  _exit(code);
}

}  // namespace
}  // namespace tessera
