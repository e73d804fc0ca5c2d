// One raw call of the data plane (docs/data_plane.md) over a plaintext
// TCP connection, for tests of who the daemons let in: a fetch, a write
// go-ahead or a describe digest, with or without a token, and the daemon's
// reply as it sent it.
//
// Thread-compatible: each call opens and closes its own connection; every
// call ends within ten seconds.
#ifndef TESSERA_TESTS_TESTING_RAW_DATA_PLANE_H_
#define TESSERA_TESTS_TESTING_RAW_DATA_PLANE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "io/socket.h"
#include "tessera/v1/shard.pb.h"
#include "wire/chunk_codec.h"
#include "wire/data_connection.h"

namespace tessera::testing {

// The reply to one fetch of shard 0 of `tensor_id` over a raw data-plane
// connection to `address` that opened with `magic` (and `token` when it
// is kDataPlaneTokenMagic); its status when the daemon closed the
// connection instead.
inline absl::StatusOr<v1::BulkFetchReply> RawFetch(
    const std::string& address, const std::string& tensor_id,
    absl::string_view magic, const std::string& token = "") {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSIGN_OR_RETURN(UniqueFd socket, ConnectTcp(address, deadline));
  DataConnection connection = DataConnection::Plain(std::move(socket));
  RETURN_IF_ERROR(connection.WriteFull(magic.data(), magic.size(), deadline));
  if (magic == kDataPlaneTokenMagic) {
    RETURN_IF_ERROR(connection.WriteFrame(token, deadline));
  }
  v1::FetchShardRequest request;
  request.set_tensor_id(tensor_id);
  RETURN_IF_ERROR(connection.WriteFrame(request.SerializeAsString(), deadline));
  ASSIGN_OR_RETURN(std::string frame, connection.ReadFrame(deadline));
  v1::BulkFetchReply reply;
  if (!reply.ParseFromString(frame)) {
    return absl::DataLossError("unparsable reply");
  }
  return reply;
}

// A connection to `address` that opened with kDataPlaneRequestTokenMagic
// and presented `token`.
inline absl::StatusOr<DataConnection> RawTokenConnection(
    const std::string& address, const std::string& token, absl::Time deadline) {
  ASSIGN_OR_RETURN(UniqueFd socket, ConnectTcp(address, deadline));
  DataConnection connection = DataConnection::Plain(std::move(socket));
  RETURN_IF_ERROR(connection.WriteFull(kDataPlaneRequestTokenMagic.data(),
                                       kDataPlaneRequestTokenMagic.size(),
                                       deadline));
  RETURN_IF_ERROR(connection.WriteFrame(token, deadline));
  return connection;
}

// Sends `request` on `connection` and parses the reply frame as a `Reply`.
template <typename Reply>
absl::StatusOr<Reply> RawExchange(DataConnection& connection,
                                  const v1::DataPlaneRequest& request,
                                  absl::Time deadline) {
  RETURN_IF_ERROR(connection.WriteFrame(request.SerializeAsString(), deadline));
  ASSIGN_OR_RETURN(std::string frame, connection.ReadFrame(deadline));
  Reply reply;
  if (!reply.ParseFromString(frame)) {
    return absl::DataLossError("unparsable reply");
  }
  return reply;
}

// The go-ahead (or refusal) of a raw data-plane write of row 0 of shard 0
// of `tensor_id` (float32, `cols` wide) by a client presenting `token`; its
// status when the daemon closed the connection instead.
inline absl::StatusOr<v1::BulkWriteReply> RawWrite(const std::string& address,
                                                   const std::string& tensor_id,
                                                   int64_t cols,
                                                   const std::string& token) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSIGN_OR_RETURN(DataConnection connection,
                   RawTokenConnection(address, token, deadline));
  v1::DataPlaneRequest request;
  v1::BulkWriteRequest& write = *request.mutable_write();
  write.set_tensor_id(tensor_id);
  write.add_region_offsets(0);
  write.add_region_offsets(0);
  write.add_region_sizes(1);
  write.add_region_sizes(cols);
  write.set_dtype(v1::DTYPE_FLOAT32);
  write.set_total_bytes(cols * 4);
  return RawExchange<v1::BulkWriteReply>(connection, request, deadline);
}

// The reply to one DescribeDigestRequest for `name` by a client presenting
// `token`; its status when the daemon closed the connection instead.
inline absl::StatusOr<v1::DescribeDigestReply> RawDescribeDigest(
    const std::string& address, const std::string& name,
    const std::string& token) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSIGN_OR_RETURN(DataConnection connection,
                   RawTokenConnection(address, token, deadline));
  v1::DataPlaneRequest request;
  request.mutable_describe_digest()->set_name(name);
  return RawExchange<v1::DescribeDigestReply>(connection, request, deadline);
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_RAW_DATA_PLANE_H_
