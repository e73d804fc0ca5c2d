// libFuzzer target: what a client sends to a daemon's data plane. A real
// DataPlaneServer that takes writes (as a daemon's does) listens on
// 127.0.0.1 and serves one registered 16 x 16 float32 CPU shard. Each input
// is one connection: its first byte picks the magic (TSRBULK1..4), the
// rest is sent as the connection's bytes after it (frames of fetches,
// writes and describe digests, tokens, chunk prefixes and payloads, or
// garbage), the write side
// is closed, and the server's replies are read until it closes the
// connection. The server must answer or close, never crash, hang, overrun
// the shard or leak; every 64 inputs a fetch through a real ShardClient
// checks that it still serves.
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/shard_client.h"
#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"
#include "io/socket.h"
#include "server/serve/data_plane_server.h"
#include "server/serve/shard_registry.h"
#include "wire/chunk_codec.h"

namespace {

using namespace tessera;  // NOLINT: a fuzz target's short names.

constexpr absl::Duration kWait = absl::Seconds(5);

struct Fixture {
  std::shared_ptr<ShardRegistry> registry = std::make_shared<ShardRegistry>();
  std::unique_ptr<DataPlaneServer> server;
  std::shared_ptr<ShardClient> client;
};

Fixture& Get() {
  static Fixture* const fixture = [] {
    auto* f = new Fixture;
    Tensor shard = *Tensor::Zeros({16, 16});
    auto registered = std::make_shared<RegisteredTensor>();
    auto metadata = std::make_shared<ShardedTensorMetadata>();
    metadata->tensor_properties.dtype = shard.dtype();
    metadata->size = {32, 16};
    for (int rank = 0; rank < 2; ++rank) {
      metadata->shards_metadata.push_back(
          *ShardMetadata::Create({rank * 16, 0}, {16, 16},
                                 RemoteDevice::ForRank(rank, Device::Cpu())));
    }
    registered->metadata = std::move(metadata);
    registered->local_shards.push_back(LocalShard{0, shard});
    if (!f->registry->Register("t", std::move(registered)).ok()) std::abort();
    DataPlaneServerOptions options;
    options.accept_writes = true;
    options.io_timeout = absl::Seconds(2);
    // As a daemon's table answers DescribeDigestRequests.
    options.describe =
        [](const std::string& name) -> absl::StatusOr<v1::TensorInfo> {
      if (name != "t") return absl::NotFoundError("unknown tensor");
      v1::TensorInfo info;
      info.set_name("t");
      info.set_tensor_id("0/0");
      return info;
    };
    f->server = *DataPlaneServer::Start("127.0.0.1", f->registry, options);
    f->client = ShardClient::Create("127.0.0.1:1", f->server->address());
    return f;
  }();
  return *fixture;
}

// A 16 x 16 fetch of shard 0 through a real client; retried a while, since
// connections of earlier inputs may still be closing.
void CheckStillServes(const Fixture& fixture) {
  Tensor destination = *Tensor::Zeros({16, 16});
  FetchOptions options;
  options.timeout = kWait;
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (fixture.client->FetchShardInto("t", 0, destination, options).ok()) {
      return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::abort();  // The server stopped serving.
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int inputs = 0;
  Fixture& fixture = Get();
  if (size == 0) return 0;
  const absl::string_view magics[] = {kDataPlaneMagic, kDataPlaneTokenMagic,
                                      kDataPlaneRequestMagic,
                                      kDataPlaneRequestTokenMagic};
  const absl::string_view magic = magics[data[0] % 4];
  absl::StatusOr<UniqueFd> socket =
      ConnectTcp(fixture.server->address(), absl::Now() + kWait);
  if (!socket.ok()) std::abort();
  const std::string bytes = absl::StrCat(
      magic,
      absl::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  // A server that closed early makes the rest of the send fail: fine.
  (void)WriteFull(socket->get(), bytes.data(), bytes.size(),
                  absl::Now() + kWait);
  shutdown(socket->get(), SHUT_WR);
  // Replies until the server closes; it must, within its io_timeout.
  char buffer[4096];
  const absl::Time end = absl::Now() + kWait;
  for (;;) {
    const absl::Status ready =
        AwaitReady(socket->get(), POLLIN, end, "the server's replies");
    if (absl::IsDeadlineExceeded(ready)) std::abort();  // A hang.
    if (!ready.ok()) break;
    const ssize_t got = recv(socket->get(), buffer, sizeof(buffer), 0);
    if (got <= 0 && !(got < 0 && errno == EINTR)) break;
  }
  if (++inputs % 64 == 0) CheckStillServes(fixture);
  return 0;
}
