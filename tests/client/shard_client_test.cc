// ShardClient (client/shard_client.h) against peers that are not a
// DataPlaneServer: a port that never answers, a port nothing listens on, and
// hand-written peers that answer a fetch badly on purpose. What the client
// must make of each: DEADLINE_EXCEEDED, UNAVAILABLE or DATA_LOSS, never a
// hang or a wrong byte. ShardClient against the real servers is in
// tests/server/serve/ (data_plane_server_test.cc, shard_service_test.cc).
#include "client/shard_client.h"

#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/proto_convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/socket.h"
#include "tests/testing/filled.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/status_matchers.h"
#include "wire/auth.h"
#include "wire/chunk_codec.h"
#include "xxhash.h"

namespace tessera {
namespace {

using ::tessera::testing::Filled;
using ::tessera::testing::RowMajorBytes;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// Fetches over the data plane never use the gRPC channel, which connects
// lazily, so clients that only fetch get an address nothing answers on.
constexpr char kNoGrpc[] = "127.0.0.1:1";
// Bound on every wait of the test itself.
constexpr absl::Duration kWait = absl::Seconds(5);

// ---- helpers ----------------------------------------------------------------

FetchOptions Chunked(int64_t chunk_bytes,
                     absl::Duration timeout = absl::Seconds(10)) {
  FetchOptions options;
  options.chunk_bytes = chunk_bytes;
  options.timeout = timeout;
  return options;
}

// What the next read of a connection the other end has closed gives.
absl::Status ReadAfterClose(int fd) {
  char byte;
  return ReadFull(fd, &byte, 1, absl::Now() + kWait);
}

// ---- deadlines and unreachable peers ----------------------------------------
TEST(DataPlaneClientTest, PeerThatNeverAnswersIsDeadlineExceeded) {
  // Connections complete into the backlog; nothing ever accepts them.
  ASSERT_OK_AND_ASSIGN(auto listening, ListenTcp("127.0.0.1"));
  const auto client = ShardClient::Create(
      kNoGrpc, absl::StrCat("127.0.0.1:", listening.second));
  ASSERT_OK_AND_ASSIGN(Tensor destination, Tensor::Zeros({4}));
  const absl::Time start = absl::Now();
  EXPECT_THAT(client->FetchShardInto("t", 0, destination,
                                     Chunked(0, absl::Milliseconds(200))),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("shard 0 of tensor t")));
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_GE(elapsed, absl::Milliseconds(200));
  EXPECT_LT(elapsed, absl::Seconds(2));
}

TEST(DataPlaneClientTest, NothingListeningIsUnavailable) {
  int port = 0;
  {
    ASSERT_OK_AND_ASSIGN(auto listening, ListenTcp("127.0.0.1"));
    port = listening.second;
  }  // Closed: the port is free again.
  const auto client =
      ShardClient::Create(kNoGrpc, absl::StrCat("127.0.0.1:", port));
  EXPECT_THAT(client->FetchShard("t", 0, Chunked(0, absl::Seconds(2))),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("connecting to 127.0.0.1")));
}

// ---- a peer that answers badly ----------------------------------------------
// A hand-written data-plane server for one fetch: accepts one connection,
// reads the magic and the request, then runs `script` on the connection.
class ScriptedPeer {
 public:
  explicit ScriptedPeer(std::function<void(int fd)> script) {
    absl::StatusOr<std::pair<UniqueFd, int>> listening = ListenTcp("127.0.0.1");
    EXPECT_OK(listening.status());
    listener_ = std::move(listening->first);
    address_ = absl::StrCat("127.0.0.1:", listening->second);
    thread_ = std::thread([this, script = std::move(script)] { Run(script); });
  }
  ~ScriptedPeer() {
    InterruptSocket(listener_.get());  // In case nobody connected.
    thread_.join();
  }
  const std::string& address() const { return address_; }

 private:
  void Run(const std::function<void(int fd)>& script) {
    UniqueFd connection(
        accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) return;
    char magic[kDataPlaneMagic.size()];
    const absl::Time deadline = absl::Now() + kWait;
    if (ReadFull(connection.get(), magic, sizeof(magic), deadline).ok() &&
        ReadFrame(connection.get(), deadline).ok()) {
      script(connection.get());
    }
  }

  UniqueFd listener_;
  std::string address_;
  std::thread thread_;
};

// The peer sends an OK reply for a 2-element int64 shard, then chunks
// written by the test.
class MisbehavingPeerTest : public ::testing::Test {
 protected:
  // The scripted peer speaks the tokenless protocol: no token, not even
  // this user's own (which the client would offer a peer on loopback).
  void SetUp() override { SetProcessToken(""); }

  absl::Status Fetch(std::function<void(int fd)> chunks,
                     absl::Duration timeout = absl::Seconds(5)) {
    ScriptedPeer peer([&](int fd) {
      EXPECT_OK(
          WriteFrame(fd, Reply().SerializeAsString(), absl::Now() + kWait));
      chunks(fd);
    });
    const auto client = ShardClient::Create(kNoGrpc, peer.address());
    return client->FetchShardInto("t", 0, destination_, Chunked(0, timeout));
  }

  v1::BulkFetchReply Reply() const {
    v1::BulkFetchReply reply;
    v1::ShardHeader* header = reply.mutable_header();
    *header->mutable_metadata() = ToProto(
        testing::AsLocalShard(source_, 0, 1)->metadata->shards_metadata[0]);
    header->set_dtype(ToProto(DType::kInt64));
    header->add_sizes(2);
    header->set_total_bytes(16);
    reply.set_chunk_bytes(8);
    return reply;
  }

  // Sends bytes [offset, offset + length) of the source with `checksum`
  // (its own when unset), claiming `claimed_length` bytes when set.
  void SendChunk(int fd, int64_t offset, int64_t length,
                 std::optional<uint64_t> checksum = std::nullopt,
                 std::optional<int64_t> claimed_length = std::nullopt) {
    const char* data = static_cast<const char*>(source_.data_ptr()) + offset;
    char prefix[kDataPlaneChunkPrefixBytes];
    const size_t size = static_cast<size_t>(length);
    EncodeChunkPrefix(ChunkPrefix{offset, claimed_length.value_or(length),
                                  checksum.value_or(XXH3_64bits(data, size))},
                      prefix);
    const absl::Time deadline = absl::Now() + kWait;
    EXPECT_OK(WriteFull(fd, prefix, sizeof(prefix), deadline));
    EXPECT_OK(WriteFull(fd, data, size, deadline));
  }

  const Tensor source_ = Filled({2}, DType::kInt64);
  Tensor destination_ =
      *Tensor::Zeros({2}, TensorOptions().WithDType(DType::kInt64));
};

TEST_F(MisbehavingPeerTest, WellBehavedPeerIsOk) {
  EXPECT_OK(Fetch([&](int fd) {
    SendChunk(fd, 0, 8);
    SendChunk(fd, 8, 8);
  }));
  EXPECT_EQ(RowMajorBytes(destination_), RowMajorBytes(source_));
}

TEST_F(MisbehavingPeerTest, BadChecksumIsDataLoss) {
  EXPECT_THAT(
      Fetch([&](int fd) { SendChunk(fd, 0, 8, 12345); }),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum mismatch")));
}

TEST_F(MisbehavingPeerTest, ChunkPastTheShardIsDataLoss) {
  EXPECT_THAT(
      Fetch([&](int fd) { SendChunk(fd, 0, 8, std::nullopt, 1ll << 40); }),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("overrun")));
}

TEST_F(MisbehavingPeerTest, ChunkOutOfOrderIsDataLoss) {
  EXPECT_THAT(
      Fetch([&](int fd) { SendChunk(fd, 8, 8); }),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("expected offset 0")));
}

TEST_F(MisbehavingPeerTest, StreamCutShortIsUnavailable) {
  EXPECT_THAT(Fetch([&](int fd) { SendChunk(fd, 0, 8); }),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("shard 0 of tensor t")));
}

TEST_F(MisbehavingPeerTest, StalledStreamIsDeadlineExceeded) {
  const absl::Time start = absl::Now();
  EXPECT_THAT(Fetch(
                  [&](int fd) {
                    SendChunk(fd, 0, 8);
                    // Holds the connection open until the client leaves.
                    (void)ReadAfterClose(fd);
                  },
                  absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("shard 0 of tensor t")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

}  // namespace
}  // namespace tessera
