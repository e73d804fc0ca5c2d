// Reads a box of a tensor through one daemon's ControlService.ReadRegion
// (the daemon gathers it from the holders, as a gRPC-only client gets it):
// the box's row-major bytes, or the call's status.
//
// Thread-compatible.
#ifndef TESSERA_TESTS_TESTING_DAEMON_READ_H_
#define TESSERA_TESTS_TESTING_DAEMON_READ_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/control.grpc.pb.h"
#include "wire/auth.h"
#include "wire/grpc_status.h"

namespace tessera::testing {

inline absl::StatusOr<std::string> ReadRegionThroughDaemon(
    const std::string& address, const std::string& name,
    const std::string& tensor_id, const std::vector<int64_t>& offsets,
    const std::vector<int64_t>& sizes, absl::Duration timeout) {
  std::unique_ptr<v1::ControlService::Stub> stub =
      v1::ControlService::NewStub(CreateTesseraChannel(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::ReadRegionRequest request;
  request.set_name(name);
  request.set_tensor_id(tensor_id);
  request.mutable_offsets()->Add(offsets.begin(), offsets.end());
  request.mutable_sizes()->Add(sizes.begin(), sizes.end());
  auto reader = stub->ReadRegion(&context, request);
  v1::ShardChunk chunk;
  std::string bytes;
  while (reader->Read(&chunk)) bytes += chunk.data();
  const grpc::Status finished = reader->Finish();
  if (!finished.ok()) return FromGrpcStatus(finished);
  return bytes;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_DAEMON_READ_H_
