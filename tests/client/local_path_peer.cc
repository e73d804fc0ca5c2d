// A shard owner in a process of its own, for local_path_test: it
// registers a few single-shard tensors (see local_path_peer.h), serves
// them over a LocalPathServer and a DataPlaneServer on 127.0.0.1, writes
//   <local address>\n<data plane address>\n
// to --address-file (atomically, once both listen), then serves until
// SIGTERM, its parent's death or --lifetime seconds.
//
// Every tensor is int64, shard 0 of a one-shard tensor on rank 0; element
// at row-major index i of tensor k holds PeerValue(k, i) (shared with the
// test through local_path_peer.h).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "server/serve/data_plane_server.h"
#include "server/serve/local_path_server.h"
#include "server/serve/shard_registry.h"
#include "tests/client/local_path_peer.h"

namespace tessera::testing {
namespace {

volatile sig_atomic_t g_stop = 0;

void OnSignal(int) { g_stop = 1; }

// A tensor of `sizes` holding PeerValue(key, i) at row-major index i.
absl::StatusOr<Tensor> Values(int key, const std::vector<int64_t>& sizes) {
  ASSIGN_OR_RETURN(
      Tensor tensor,
      Tensor::Empty(sizes, TensorOptions().WithDType(DType::kInt64)));
  int64_t* data = tensor.data<int64_t>();
  for (int64_t i = 0; i < tensor.numel(); ++i) data[i] = PeerValue(key, i);
  return tensor;
}

absl::Status Register(ShardRegistry& registry, const std::string& id,
                      const Tensor& shard) {
  auto registered = std::make_shared<RegisteredTensor>();
  auto metadata_ptr = std::make_shared<ShardedTensorMetadata>();
  ShardedTensorMetadata& metadata = *metadata_ptr;
  metadata.tensor_properties.dtype = shard.dtype();
  metadata.size = shard.sizes();
  ASSIGN_OR_RETURN(
      ShardMetadata placement,
      ShardMetadata::Create(std::vector<int64_t>(shard.dim(), 0), shard.sizes(),
                            RemoteDevice::ForRank(0, shard.device())));
  metadata.shards_metadata.push_back(placement);
  registered->metadata = std::move(metadata_ptr);
  registered->local_shards.push_back(LocalShard{0, shard});
  return registry.Register(id, std::move(registered));
}

absl::Status Run(const std::string& address_file, bool cuda,
                 int64_t lifetime_seconds) {
  auto registry = std::make_shared<ShardRegistry>();
  // Allocated before sharing is on: large, but heap memory.
  ASSIGN_OR_RETURN(Tensor heap, Values(kHeapKey, kHeapSizes));
  SetHostMemorySharing(kPeerSharingMinBytes);
  ASSIGN_OR_RETURN(Tensor shared, Values(kSharedKey, kSharedSizes));
  if (shared.storage()->shared_memory_fd() < 0) {
    return absl::InternalError("the shared tensor is not in shared memory");
  }
  // A transposed view: the shard (i, j) is storage element (j, i).
  ASSIGN_OR_RETURN(Tensor backing,
                   Values(kStridedKey, {kStridedSizes[1], kStridedSizes[0]}));
  ASSIGN_OR_RETURN(Tensor strided, backing.T());
  ASSIGN_OR_RETURN(Tensor tiny, Values(kTinyKey, kTinySizes));
  ASSIGN_OR_RETURN(Tensor large, Values(kLargeKey, kLargeSizes));
  RETURN_IF_ERROR(Register(*registry, kHeapId, heap));
  RETURN_IF_ERROR(Register(*registry, kSharedId, shared));
  RETURN_IF_ERROR(Register(*registry, kStridedId, strided));
  RETURN_IF_ERROR(Register(*registry, kTinyId, tiny));
  RETURN_IF_ERROR(Register(*registry, kLargeId, large));
  if (cuda) {
    ASSIGN_OR_RETURN(Tensor on_device, shared.To(Device::Cuda(0)));
    RETURN_IF_ERROR(Register(*registry, kCudaId, on_device));
  }

  LocalPathServerOptions local_options;
  local_options.accept_writes = true;
  ASSIGN_OR_RETURN(std::unique_ptr<LocalPathServer> local,
                   LocalPathServer::Start(registry, local_options));
  ASSIGN_OR_RETURN(std::unique_ptr<DataPlaneServer> data_plane,
                   DataPlaneServer::Start("127.0.0.1", registry));
  const std::string temporary = absl::StrCat(address_file, ".tmp");
  {
    std::ofstream out(temporary);
    out << local->address() << "\n" << data_plane->address() << "\n";
    if (!out) return absl::InternalError("cannot write " + temporary);
  }
  if (std::rename(temporary.c_str(), address_file.c_str()) != 0) {
    return absl::InternalError("cannot rename " + temporary);
  }
  const pid_t parent = getppid();
  const absl::Time end = absl::Now() + absl::Seconds(lifetime_seconds);
  while (!g_stop && getppid() == parent && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  local->Shutdown(absl::Seconds(1));
  data_plane->Shutdown(absl::Seconds(1));
  return absl::OkStatus();
}

}  // namespace
}  // namespace tessera::testing

int main(int argc, char** argv) {
  std::string address_file;
  bool cuda = false;
  int64_t lifetime = 120;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cuda") {
      cuda = true;
    } else if (arg == "--address-file" && i + 1 < argc) {
      address_file = argv[++i];
    } else if (arg == "--lifetime" && i + 1 < argc &&
               absl::SimpleAtoi(argv[i + 1], &lifetime)) {
      ++i;
    } else {
      std::cerr << "usage: local_path_peer --address-file PATH [--cuda] "
                   "[--lifetime SECONDS]\n";
      return 2;
    }
  }
  if (address_file.empty()) {
    std::cerr << "local_path_peer: --address-file is required\n";
    return 2;
  }
  signal(SIGTERM, tessera::testing::OnSignal);
  signal(SIGINT, tessera::testing::OnSignal);
  const absl::Status status =
      tessera::testing::Run(address_file, cuda, lifetime);
  if (!status.ok()) {
    std::cerr << "local_path_peer: " << status << std::endl;
    return 1;
  }
  return 0;
}
