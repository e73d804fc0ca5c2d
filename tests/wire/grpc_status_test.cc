// absl::Status <-> grpc::Status (wire/grpc_status.h): codes and messages
// cross unchanged, except a message too long for gRPC's trailer, which
// keeps its head and tail and says how much was cut.
#include "wire/grpc_status.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(GrpcStatusTest, CodesAndMessagesCrossBothWays) {
  const absl::Status status = absl::NotFoundError("no tensor named \"w\"");
  const grpc::Status sent = ToGrpcStatus(status);
  EXPECT_EQ(sent.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(sent.error_message(), "no tensor named \"w\"");
  EXPECT_EQ(FromGrpcStatus(sent), status);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, ALongMessageKeepsItsHeadAndTail) {
  // An error quoting a hostile name of 100,000 characters.
  const std::string name(100000, 'x');
  const absl::Status status = absl::NotFoundError(
      "SaveCheckpoint: no tensor named \"" + name + "\" (known: w, v)");
  const grpc::Status sent = ToGrpcStatus(status);
  EXPECT_EQ(sent.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LE(sent.error_message().size(), kMaxGrpcMessageBytes);
  EXPECT_THAT(sent.error_message(),
              StartsWith("SaveCheckpoint: no tensor named \"xxx"));
  EXPECT_THAT(sent.error_message(), EndsWith("xxx\" (known: w, v)"));
  EXPECT_THAT(sent.error_message(),
              HasSubstr(" [... " +
                        std::to_string(status.message().size() - 1280 - 640) +
                        " bytes cut ...] "));
  // At the limit, nothing is cut.
  const std::string exact(kMaxGrpcMessageBytes, 'y');
  EXPECT_EQ(ToGrpcStatus(absl::InternalError(exact)).error_message(), exact);
}

}  // namespace
}  // namespace tessera
