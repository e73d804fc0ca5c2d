// Where replicas go (wire/replicas.h): other hosts first, spread evenly,
// the same on every daemon.
#include "wire/replicas.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "wire/version_id.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PlaceReplicasTest, OtherHostsFirstThenTheNextRanks) {
  // Ranks 0, 1 on host a; 2, 3 on host b.
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  ASSERT_OK_AND_ASSIGN(auto placed,
                       PlaceReplicas(std::vector<int>{0, 1, 2, 3}, 2, hosts));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(2), ElementsAre(2),
                                  ElementsAre(0), ElementsAre(0)));
  ASSERT_OK_AND_ASSIGN(placed, PlaceReplicas(std::vector<int>{1}, 4, hosts));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(2, 3, 0)));
}

TEST(PlaceReplicasTest, OneHostSpreadsByDistance) {
  const std::vector<std::string> hosts(3, "h");
  ASSERT_OK_AND_ASSIGN(auto placed,
                       PlaceReplicas(std::vector<int>{0, 1, 2, 2}, 3, hosts));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(1, 2), ElementsAre(2, 0),
                                  ElementsAre(0, 1), ElementsAre(0, 1)));
  ASSERT_OK_AND_ASSIGN(placed, PlaceReplicas(std::vector<int>{0, 1}, 1, hosts));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(), ElementsAre()));
}

TEST(PlaceReplicasTest, RefusesImpossibleCounts) {
  const std::vector<std::string> hosts(2, "h");
  EXPECT_THAT(PlaceReplicas(std::vector<int>{0}, 3, hosts).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("between 1 and the 2 daemons")));
  EXPECT_THAT(PlaceReplicas(std::vector<int>{0}, 0, hosts).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not 0")));
  EXPECT_THAT(
      PlaceReplicas(std::vector<int>{5}, 2, hosts).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("owner 5")));
}

TEST(HoldersOfTest, OwnerThenReplicas) {
  v1::TensorInfo info;
  info.add_shard_ranks(3);
  info.add_shard_ranks(0);
  EXPECT_THAT(HoldersOf(info, 1), ElementsAre(0));
  EXPECT_EQ(CopiesOf(info), 1);
  info.add_replicas()->add_ranks(1);
  info.add_replicas()->add_ranks(2);
  EXPECT_THAT(HoldersOf(info, 0), ElementsAre(3, 1));
  EXPECT_THAT(HoldersOf(info, 1), ElementsAre(0, 2));
  EXPECT_THAT(HoldersOf(info, 7), ElementsAre());
  EXPECT_EQ(CopiesOf(info), 2);
  EXPECT_EQ(ReplicaTensorId("0/7"), "0/7/replicas");
  // Version 3's copies are version 3 of the replicas.
  EXPECT_EQ(ReplicaTensorId(VersionId("0/7", 3)), "0/7/replicas@3");
  EXPECT_EQ(VersionNumber(ReplicaTensorId("0/7@3")), 3);
  EXPECT_EQ(VersionBase(ReplicaTensorId("0/7@3")), ReplicaTensorId("0/7"));
  // A read of at least version 3 of the copies.
  EXPECT_EQ(ReplicaTensorId(AtLeastId("0/7", 3)), "0/7/replicas@>=3");
  EXPECT_EQ(VersionNumber(AtLeastId("0/7", 3)), 0);
  ASSERT_TRUE(ParseAtLeast("0/7/replicas@>=3").has_value());
  EXPECT_EQ(ParseAtLeast("0/7/replicas@>=3")->latest_id, "0/7/replicas");
  EXPECT_EQ(ParseAtLeast("0/7/replicas@>=3")->number, 3);
  EXPECT_EQ(ParseAtLeast("0/7@>=12")->number, 12);
  for (const char* other : {"0/7", "0/7@3", "0/7@>=", "0/7@>=0", "0/7@>=-1",
                            "0/7@>=3/replicas", "0/7@>=99999999999999999999"}) {
    EXPECT_FALSE(ParseAtLeast(other).has_value()) << other;
  }
  // Where a version's shards are registered: version 1 (and an
  // unversioned tensor, 0) under the tensor's own id.
  EXPECT_EQ(RegistrationId("0/7", 0), "0/7");
  EXPECT_EQ(RegistrationId("0/7", 1), "0/7");
  EXPECT_EQ(RegistrationId("0/7", 4), "0/7@4");
  v1::TensorInfo versioned;
  EXPECT_FALSE(Versioned(versioned));
  versioned.set_versions_kept(1);
  EXPECT_FALSE(Versioned(versioned));
  versioned.set_versions_kept(2);
  EXPECT_TRUE(Versioned(versioned));
}

}  // namespace
}  // namespace tessera
