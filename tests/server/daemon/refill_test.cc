// Refill (server/daemon/refill.h): a write that arrives while a shard is
// being refetched survives the fetch; after Complete, writes go elsewhere.
#include "server/daemon/refill.h"

#include <memory>
#include <utility>
#include <vector>

#include "client/region_transfer.h"
#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// One 4x4 float shard (index 0 of a 4x4 tensor) to refill, and a copy of
// shard 1.
struct Fixture {
  std::shared_ptr<Refill> refill;
  Tensor own;
  Tensor copy;
};

Fixture Make() {
  Fixture f;
  f.own = *Tensor::Zeros({4, 4});
  f.copy = *Tensor::Zeros({4, 4});
  std::vector<LocalShard> own = {LocalShard{0, f.own}};
  auto copies = std::make_shared<RegisteredTensor>();
  copies->local_shards.push_back(LocalShard{1, f.copy});
  f.refill = std::make_shared<Refill>(std::move(own), copies);
  return f;
}

// The box rows [1, 3) of a 4x4 shard at the origin.
const ShardMetadata kBox = *ShardMetadata::Create({1, 0}, {2, 4});

// A write of `data` into rows [1, 3) of shard `shard`.
RegionPiece Rows(size_t shard, const Tensor& data) {
  RegionPiece piece;
  piece.shard = shard;
  piece.box = &kBox;
  piece.offsets_in_shard = {1, 0};
  piece.view = data;
  return piece;
}

TEST(RefillTest, AWriteDuringTheFetchSurvivesIt) {
  Fixture f = Make();
  const Tensor fives = *Tensor::Full({2, 4}, 5.0);
  ASSERT_OK_AND_ASSIGN(bool taken, f.refill->Write(false, Rows(0, fives)));
  EXPECT_TRUE(taken);
  EXPECT_EQ(f.own.data<float>()[4], 5.0f);  // applied at once
  // The fetch lands afterwards, with bytes from before the write.
  ASSERT_OK(CopyInto(*Tensor::Full({4, 4}, 1.0), f.own));
  bool finished = false;
  ASSERT_OK(f.refill->Complete([&] {
    finished = true;
    return absl::OkStatus();
  }));
  EXPECT_TRUE(finished);
  EXPECT_TRUE(f.refill->complete());
  const float* data = f.own.data<float>();
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(data[i], i >= 4 && i < 12 ? 5.0f : 1.0f) << i;
  }
}

TEST(RefillTest, CopiesTooAndNothingAfterComplete) {
  Fixture f = Make();
  const Tensor sevens = *Tensor::Full({2, 4}, 7.0);
  ASSERT_OK_AND_ASSIGN(bool taken, f.refill->Write(true, Rows(1, sevens)));
  EXPECT_TRUE(taken);
  EXPECT_THAT(f.refill->Write(true, Rows(0, sevens)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("refills no replica 0")));
  ASSERT_OK(CopyInto(*Tensor::Zeros({4, 4}), f.copy));
  ASSERT_OK(f.refill->Complete([] { return absl::OkStatus(); }));
  EXPECT_EQ(f.copy.data<float>()[4], 7.0f);
  ASSERT_OK_AND_ASSIGN(taken, f.refill->Write(false, Rows(0, sevens)));
  EXPECT_FALSE(taken);  // the caller writes to the registered shard
  EXPECT_EQ(f.own.data<float>()[4], 0.0f);
}

}  // namespace
}  // namespace tessera
