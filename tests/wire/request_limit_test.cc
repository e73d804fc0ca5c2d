// The client's check of a request against what a daemon takes
// (wire/request_limit.h): a request up to kMaxRequestBytes passes; one
// beyond is RESOURCE_EXHAUSTED, saying its size and the limit.
#include "wire/request_limit.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.pb.h"

namespace tessera {
namespace {

TEST(RequestLimitTest, ARequestBeyondWhatADaemonTakesIsRefusedBeforeSending) {
  v1::DeleteTensorRequest request;
  EXPECT_TRUE(CheckRequestSize(request).ok());
  // Just within: one name filling the limit less its field's few bytes.
  request.add_names(std::string(kMaxRequestBytes - 8, 'n'));
  EXPECT_TRUE(CheckRequestSize(request).ok()) << request.ByteSizeLong();
  request.add_names(std::string(16, 'n'));
  const absl::Status refused = CheckRequestSize(request);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              ::testing::HasSubstr(absl::StrCat(
                  "the request is ", request.ByteSizeLong(),
                  " bytes, more than the 67108864 a daemon takes")));
}

}  // namespace
}  // namespace tessera
