#include "common/sharding_spec_text.h"

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

constexpr char kChunk4[] =
    "chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu";
constexpr char kEnum4[] =
    "enum:0,0:5,5@rank:0/cpu;0,5:5,5@rank:1/cpu;5,0:5,5@rank:2/cpu;"
    "5,5:5,5@rank:3/cpu";

RemoteDevice Rank(int rank) { return RemoteDevice::ForRank(rank, Device()); }

ShardMetadata Shard(std::vector<int64_t> offsets, std::vector<int64_t> sizes,
                    std::optional<RemoteDevice> placement) {
  return ShardMetadata::Create(std::move(offsets), std::move(sizes),
                               std::move(placement))
      .value();
}

// ------------------------------------------------------------ ParseSizes.

TEST(ParseSizesTest, ParsesCommaSeparatedSizes) {
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> sizes, ParseSizes("10,20"));
  EXPECT_THAT(sizes, ElementsAre(10, 20));
  ASSERT_OK_AND_ASSIGN(sizes, ParseSizes("7"));
  EXPECT_THAT(sizes, ElementsAre(7));
  ASSERT_OK_AND_ASSIGN(sizes, ParseSizes("0,3"));
  EXPECT_THAT(sizes, ElementsAre(0, 3));
}

TEST(ParseSizesTest, AllowsWhitespaceAroundEntries) {
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> sizes, ParseSizes(" 10 , 20 "));
  EXPECT_THAT(sizes, ElementsAre(10, 20));
}

TEST(ParseSizesTest, AcceptsTheLargestInt64) {
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> sizes,
                       ParseSizes("9223372036854775807"));
  EXPECT_THAT(sizes, ElementsAre(INT64_MAX));
}

TEST(ParseSizesTest, RejectsNegativeSizesNamingTheText) {
  EXPECT_THAT(ParseSizes("10,-2"),
              StatusIs(kInvalid,
                       HasSubstr("Invalid size '10,-2': sizes must be "
                                 "non-negative integers separated by commas")));
}

TEST(ParseSizesTest, RejectsMalformedText) {
  for (const char* text : {"", " ", "10x20", "10,", ",10", "10,,20", "a", "1.5",
                           "+3", "1 0", "99999999999999999999", "10;20"}) {
    SCOPED_TRACE(text);
    EXPECT_THAT(
        ParseSizes(text),
        StatusIs(kInvalid,
                 AllOf(HasSubstr(absl::StrCat("Invalid size '", text, "'")),
                       HasSubstr("non-negative integers separated by commas"),
                       Not(HasSubstr("\n")))));
  }
}

TEST(ParseSizesTest, NamesTheBadEntry) {
  EXPECT_THAT(ParseSizes("10,abc,3"), StatusIs(kInvalid, HasSubstr("'abc'")));
  EXPECT_THAT(ParseSizes("10,,3"),
              StatusIs(kInvalid, HasSubstr("entry 2 is empty")));
  EXPECT_THAT(ParseSizes("99999999999999999999"),
              StatusIs(kInvalid, HasSubstr("too large")));
}

// ------------------------------------------------- ParseShardingSpec: chunk.

TEST(ParseShardingSpecTest, ParsesChunkSpec) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, ParseShardingSpec(kChunk4));
  ASSERT_TRUE(std::holds_alternative<ChunkShardingSpec>(spec));
  const auto& chunk = std::get<ChunkShardingSpec>(spec);
  EXPECT_EQ(chunk.dim(), 0);
  EXPECT_THAT(chunk.placements(),
              ElementsAre(Rank(0), Rank(1), Rank(2), Rank(3)));
}

TEST(ParseShardingSpecTest, ParsesNegativeDimAndCudaPlacements) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec,
                       ParseShardingSpec("chunk:dim=-1:rank:0/cuda:0,"
                                         "rank:1/cuda:1"));
  const auto& chunk = std::get<ChunkShardingSpec>(spec);
  EXPECT_EQ(chunk.dim(), -1);
  EXPECT_THAT(chunk.placements(),
              ElementsAre(RemoteDevice::ForRank(0, Device::Cuda(0)),
                          RemoteDevice::ForRank(1, Device::Cuda(1))));
}

TEST(ParseShardingSpecTest, ParsesWorkerPlacements) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec,
                       ParseShardingSpec("chunk:dim=1:worker0/cpu,worker1"));
  EXPECT_THAT(std::get<ChunkShardingSpec>(spec).placements(),
              ElementsAre(RemoteDevice::ForWorker("worker0", Device()),
                          RemoteDevice::ForWorker("worker1", Device())));
}

TEST(ParseShardingSpecTest, AllowsWhitespaceAroundPieces) {
  ASSERT_OK_AND_ASSIGN(
      ShardingSpec spec,
      ParseShardingSpec("  chunk : dim = 0 : rank:0/cpu , rank:1/cpu  "));
  const auto& chunk = std::get<ChunkShardingSpec>(spec);
  EXPECT_EQ(chunk.dim(), 0);
  EXPECT_THAT(chunk.placements(), ElementsAre(Rank(0), Rank(1)));
}

TEST(ParseShardingSpecTest, NamedDimIsUnimplemented) {
  EXPECT_THAT(ParseShardingSpec("chunk:dim=H:rank:0/cpu,rank:1/cpu"),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("does not support named dimension")));
}

TEST(ParseShardingSpecTest, RejectsMalformedChunkSpecs) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"chunk", "Invalid sharding spec 'chunk'"},
           {"chunk:dim=0", "missing ':' before the placements"},
           {"chunk:dim=0:", "no placements"},
           {"chunk:dim=0:  ", "no placements"},
           {"chunk:0:rank:0/cpu", "expected 'dim=<int>' after 'chunk:'"},
           {"chunk:dimension=0:rank:0/cpu", "expected '=' after 'dim'"},
           {"chunk:dim=:rank:0/cpu", "dim '' is not an integer or a name"},
           {"chunk:dim=1.5:rank:0/cpu", "dim '1.5' is not an integer"},
           {"chunk:dim=99999999999999999999:rank:0/cpu", "out of range"},
           {"chunk:dim=0:rank:0/cpu,", "placement 2 is empty"},
           {"chunk:dim=0:,rank:0/cpu", "placement 1 is empty"},
       }) {
    SCOPED_TRACE(c.text);
    EXPECT_THAT(ParseShardingSpec(c.text),
                StatusIs(kInvalid, AllOf(HasSubstr(c.message),
                                         HasSubstr("chunk:dim=<int>:"),
                                         Not(HasSubstr("\n")))));
  }
}

TEST(ParseShardingSpecTest, PropagatesPlacementErrors) {
  EXPECT_THAT(ParseShardingSpec("chunk:dim=0:rank:0/cpu,rank:x/tpu"),
              StatusIs(kInvalid, HasSubstr("rank:x/tpu")));
}

TEST(ParseShardingSpecTest, RejectsUnknownKinds) {
  for (const char* text : {"", "rank:0/cpu", "split:dim=0:rank:0/cpu",
                           "Chunk:dim=0:rank:0/cpu", "enum"}) {
    SCOPED_TRACE(text);
    EXPECT_THAT(ParseShardingSpec(text),
                StatusIs(kInvalid, AllOf(HasSubstr("Invalid sharding spec"),
                                         HasSubstr("chunk:dim=<int>:"),
                                         HasSubstr("enum:<offsets>"))));
  }
}

// -------------------------------------------- ParseShardingSpec: enumerable.

TEST(ParseShardingSpecTest, ParsesEnumerableSpec) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, ParseShardingSpec(kEnum4));
  ASSERT_TRUE(std::holds_alternative<EnumerableShardingSpec>(spec));
  EXPECT_THAT(std::get<EnumerableShardingSpec>(spec).shards(),
              ElementsAre(Shard({0, 0}, {5, 5}, Rank(0)),
                          Shard({0, 5}, {5, 5}, Rank(1)),
                          Shard({5, 0}, {5, 5}, Rank(2)),
                          Shard({5, 5}, {5, 5}, Rank(3))));
}

TEST(ParseShardingSpecTest, AcceptsTheEnumerablePrefixAndWhitespace) {
  ASSERT_OK_AND_ASSIGN(
      ShardingSpec spec,
      ParseShardingSpec("enumerable: 0 , 0 : 5 , 10 @ rank:0/cpu ; "
                        "5,0:5,10@rank:1/cuda:1"));
  EXPECT_THAT(std::get<EnumerableShardingSpec>(spec).shards(),
              ElementsAre(Shard({0, 0}, {5, 10}, Rank(0)),
                          Shard({5, 0}, {5, 10},
                                RemoteDevice::ForRank(1, Device::Cuda(1)))));
}

TEST(ParseShardingSpecTest, ShardWithoutPlacementHasNone) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, ParseShardingSpec("enum:0:4;4:4"));
  EXPECT_THAT(std::get<EnumerableShardingSpec>(spec).shards(),
              ElementsAre(Shard({0}, {4}, std::nullopt),
                          Shard({4}, {4}, std::nullopt)));
}

TEST(ParseShardingSpecTest, ZeroDimShardHasEmptyLists) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec,
                       ParseShardingSpec("enum::@rank:0/cpu"));
  EXPECT_THAT(std::get<EnumerableShardingSpec>(spec).shards(),
              ElementsAre(Shard({}, {}, Rank(0))));
}

TEST(ParseShardingSpecTest, RejectsMalformedShards) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"enum:", "shard 1 is empty"},
           {"enum:0:5@rank:0/cpu;", "shard 2 is empty"},
           {"enum:0,0@rank:0/cpu", "expected <offsets>:<sizes>@<placement>"},
           {"enum:0:5:5@rank:0/cpu", "expected <offsets>:<sizes>@<placement>"},
           {"enum:0,a:5,5@rank:0/cpu", "Invalid offsets '0,a'"},
           {"enum:0,0:5,-5@rank:0/cpu", "Invalid sizes '5,-5'"},
           {"enum:0,0:5@rank:0/cpu",
            "shard_offsets and shard_sizes should have the same number"},
           {"enum:0:5@bad/place/ment", "Could not parse remote_device"},
           {"enum:0:5@", "Could not parse remote_device"},
       }) {
    SCOPED_TRACE(c.text);
    EXPECT_THAT(
        ParseShardingSpec(c.text),
        StatusIs(kInvalid, AllOf(HasSubstr(c.message), Not(HasSubstr("\n")))));
  }
  EXPECT_THAT(ParseShardingSpec("enum:0,a:5,5@rank:0/cpu"),
              StatusIs(kInvalid, HasSubstr("Invalid shard '0,a:5,5@rank:0/"
                                           "cpu' in enumerable spec")));
}

TEST(ParseShardingSpecTest, PropagatesEnumerableSpecErrors) {
  EXPECT_THAT(ParseShardingSpec("enum:0,0:5,5@rank:0/cpu;4,4:5,5@rank:1/cpu"),
              StatusIs(kInvalid, HasSubstr("overlap")));
  EXPECT_THAT(ParseShardingSpec("enum:0,0:5,5@rank:0/cpu;5:5@rank:1/cpu"),
              StatusIs(kInvalid, HasSubstr("inconsistent ranks")));
}

TEST(ParseShardingSpecTest, FitToTheTensorIsCheckedByBuildMetadata) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec,
                       ParseShardingSpec("enum:0,0:5,5@rank:0/cpu"));
  EXPECT_THAT(BuildMetadata(spec, {10, 10}),
              StatusIs(kInvalid, HasSubstr("does not match tensor volume")));
  ASSERT_OK_AND_ASSIGN(spec, ParseShardingSpec("chunk:dim=2:rank:0/cpu"));
  EXPECT_THAT(BuildMetadata(spec, {10, 10}),
              StatusIs(kInvalid, HasSubstr("Invalid sharding dim: 2")));
}

// --------------------------------------------------------------- JSON in.

TEST(ShardingSpecFromJsonTest, ParsesChunkSpec) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec,
                       ShardingSpecFromJson(R"({"type": "chunk", "dim": -2,
                               "placements": ["rank:0/cpu", "rank:1/cpu"]})"));
  const auto& chunk = std::get<ChunkShardingSpec>(spec);
  EXPECT_EQ(chunk.dim(), -2);
  EXPECT_THAT(chunk.placements(), ElementsAre(Rank(0), Rank(1)));
}

TEST(ShardingSpecFromJsonTest, ParsesEnumerableSpec) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, ShardingSpecFromJson(
                                              R"({"shards": [
                {"offsets": [0, 0], "sizes": [5, 10], "placement": "rank:0/cpu"},
                {"sizes": [5, 10], "offsets": [5, 0], "placement": null},
                {"offsets": [10, 0], "sizes": [0, 10]}],
              "type": "enumerable"})"));
  EXPECT_THAT(std::get<EnumerableShardingSpec>(spec).shards(),
              ElementsAre(Shard({0, 0}, {5, 10}, Rank(0)),
                          Shard({5, 0}, {5, 10}, std::nullopt),
                          Shard({10, 0}, {0, 10}, std::nullopt)));
}

TEST(ShardingSpecFromJsonTest, AcceptsEnumAsTypeAndABareShardArray) {
  ASSERT_OK_AND_ASSIGN(
      ShardingSpec from_object,
      ShardingSpecFromJson(
          R"({"type": "enum", "shards": [{"offsets": [0], "sizes": [4],
                                          "placement": "rank:0/cpu"}]})"));
  ASSERT_OK_AND_ASSIGN(
      ShardingSpec from_array,
      ShardingSpecFromJson(
          R"([{"offsets": [0], "sizes": [4], "placement": "rank:0/cpu"}])"));
  EXPECT_EQ(from_object, from_array);
}

TEST(ShardingSpecFromJsonTest, NamedDimIsUnimplemented) {
  EXPECT_THAT(
      ShardingSpecFromJson(
          R"({"type": "chunk", "dim": "H", "placements": ["rank:0/cpu"]})"),
      StatusIs(absl::StatusCode::kUnimplemented,
               HasSubstr("does not support named dimension")));
}

TEST(ShardingSpecFromJsonTest, RejectsMalformedJson) {
  for (const char* json : {"", "{", "{\"type\": chunk}", "[1, 2",
                           "{\"type\": \"chunk\"} trailing"}) {
    SCOPED_TRACE(json);
    EXPECT_THAT(
        ShardingSpecFromJson(json),
        StatusIs(kInvalid, AllOf(HasSubstr("Invalid JSON sharding spec: "),
                                 HasSubstr("parse error"),
                                 Not(HasSubstr("[json.exception")))));
  }
}

TEST(ShardingSpecFromJsonTest, RejectsBadFieldsNamingThem) {
  struct Case {
    const char* json;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"42", "expected an object with a \"type\" field"},
           {"{}", "field \"type\" is missing"},
           {R"({"type": 1})", "field \"type\" must be a string, got number"},
           {R"({"type": "split"})",
            "field \"type\" must be \"chunk\" or \"enumerable\""},
           {R"({"type": "chunk", "placements": ["rank:0/cpu"]})",
            "field \"dim\" is missing"},
           {R"({"type": "chunk", "dim": 0})",
            "field \"placements\" is missing"},
           {R"({"type": "chunk", "dim": 0.5, "placements": ["rank:0/cpu"]})",
            "field \"dim\" must be an integer or a string, got number"},
           {R"({"type": "chunk", "dim": null, "placements": ["rank:0/cpu"]})",
            "field \"dim\" must be an integer or a string, got null"},
           {R"({"type": "chunk", "dim": 18446744073709551615,
                "placements": ["rank:0/cpu"]})",
            "field \"dim\" is too large"},
           {R"({"type": "chunk", "dim": 0, "placements": "rank:0/cpu"})",
            "field \"placements\" must be an array of strings, got string"},
           {R"({"type": "chunk", "dim": 0, "placements": ["rank:0/cpu", 1]})",
            "field \"placements[1]\" must be a string, got number"},
           {R"({"type": "chunk", "dim": 0, "placement": ["rank:0/cpu"]})",
            "unknown field \"placement\" in chunk spec"},
           {R"({"type": "enumerable"})", "field \"shards\" is missing"},
           {R"({"type": "enumerable", "shards": {}})",
            "field \"shards\" must be an array of shards, got object"},
           {R"({"type": "enumerable", "shards": [[0]]})",
            "field \"shards[0]\" must be an object, got array"},
           {R"({"type": "enumerable", "shards": [{"sizes": [1]}]})",
            "field \"shards[0].offsets\" is missing"},
           {R"({"type": "enumerable", "shards": [{"offsets": [1]}]})",
            "field \"shards[0].sizes\" is missing"},
           {R"({"type": "enumerable",
                "shards": [{"offsets": [0], "sizes": [1, "2"]}]})",
            "field \"shards[0].sizes[1]\" must be an integer, got string"},
           {R"({"type": "enumerable",
                "shards": [{"offsets": [-1], "sizes": [1]}]})",
            "field \"shards[0].offsets[0]\" must be non-negative"},
           {R"({"type": "enumerable",
                "shards": [{"offsets": 0, "sizes": [1]}]})",
            "field \"shards[0].offsets\" must be an array of integers"},
           {R"({"type": "enumerable",
                "shards": [{"offsets": [0], "sizes": [1], "placement": 3}]})",
            "field \"shards[0].placement\" must be a string or null"},
           {R"({"type": "enumerable",
                "shards": [{"offsets": [0], "sizes": [1], "rank": 3}]})",
            "unknown field \"rank\" in shards[0]"},
           {R"({"type": "enumerable", "shards": [], "dim": 0})",
            "unknown field \"dim\" in enumerable spec"},
           {R"({"type": "enumerable",
                "shards": [{"offsets": [0], "sizes": [1], "placement": "x/y"}]})",
            "shards[0]: Could not parse remote_device: x/y"},
           {R"({"type": "enumerable",
                "shards": [{"offsets": [0, 0], "sizes": [1]}]})",
            "shards[0]: shard_offsets and shard_sizes should have the same"},
       }) {
    SCOPED_TRACE(c.json);
    EXPECT_THAT(
        ShardingSpecFromJson(c.json),
        StatusIs(kInvalid, AllOf(HasSubstr("Invalid JSON sharding spec"),
                                 HasSubstr(c.message))));
  }
}

TEST(ShardingSpecFromJsonTest, PropagatesModelErrors) {
  EXPECT_THAT(ShardingSpecFromJson(R"({"type": "enumerable", "shards": []})"),
              StatusIs(kInvalid, HasSubstr("Empty shard list provided")));
  EXPECT_THAT(ShardingSpecFromJson(R"({"type": "enumerable", "shards": [
          {"offsets": [0], "sizes": [5], "placement": "rank:0/cpu"},
          {"offsets": [3], "sizes": [5], "placement": "rank:1/cpu"}]})"),
              StatusIs(kInvalid, HasSubstr("overlap")));
  EXPECT_THAT(
      ShardingSpecFromJson(R"({"type": "chunk", "dim": 0, "placements": []})"),
      StatusIs(kInvalid, HasSubstr("at least one placement")));
  EXPECT_THAT(ShardingSpecFromJson(
                  R"({"type": "chunk", "dim": 0, "placements": ["nope/x"]})"),
              StatusIs(kInvalid, HasSubstr("Could not parse remote_device")));
}

TEST(ShardingSpecFromJsonTest, InvalidUtf8DoesNotThrow) {
  EXPECT_THAT(ShardingSpecFromJson("{\"type\": \"\xff\"}"),
              StatusIs(kInvalid, HasSubstr("Invalid JSON sharding spec")));
}

// ------------------------------------------------------------- Printing.

TEST(ShardingSpecToTextTest, PrintsTheTextForms) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec chunk, ParseShardingSpec(kChunk4));
  EXPECT_EQ(ShardingSpecToText(chunk), kChunk4);
  ASSERT_OK_AND_ASSIGN(ShardingSpec enumerable, ParseShardingSpec(kEnum4));
  EXPECT_EQ(ShardingSpecToText(enumerable), kEnum4);
  ASSERT_OK_AND_ASSIGN(ShardingSpec unplaced,
                       ParseShardingSpec("enumerable:0:4;4:4@worker1"));
  EXPECT_EQ(ShardingSpecToText(unplaced), "enum:0:4;4:4@worker1/cpu");
}

TEST(ShardingSpecToTextTest, RoundTrips) {
  for (const char* text :
       {kChunk4, kEnum4, "chunk:dim=-1:rank:0/cuda:0,worker1/cuda:1,cpu",
        "enum:0:4;4:4", "enum::@rank:0/cpu",
        "enum:0,0,0:2,3,4@rank:0/meta;2,0,0:0,3,4@rank:1/cpu"}) {
    SCOPED_TRACE(text);
    ASSERT_OK_AND_ASSIGN(ShardingSpec spec, ParseShardingSpec(text));
    ASSERT_OK_AND_ASSIGN(ShardingSpec again,
                         ParseShardingSpec(ShardingSpecToText(spec)));
    EXPECT_EQ(spec, again);
    ASSERT_OK_AND_ASSIGN(again, ShardingSpecFromJson(ShardingSpecToJson(spec)));
    EXPECT_EQ(spec, again);
  }
}

TEST(ShardingSpecToJsonTest, PrintsTheJsonForms) {
  ASSERT_OK_AND_ASSIGN(ShardingSpec chunk,
                       ParseShardingSpec("chunk:dim=-1:rank:0/cpu,rank:1/cpu"));
  EXPECT_EQ(
      ShardingSpecToJson(chunk),
      R"({"type":"chunk","dim":-1,"placements":["rank:0/cpu","rank:1/cpu"]})");
  ASSERT_OK_AND_ASSIGN(ShardingSpec enumerable,
                       ParseShardingSpec("enum:0:4@rank:0/cpu;4:4"));
  EXPECT_EQ(ShardingSpecToJson(enumerable),
            R"({"type":"enumerable","shards":[)"
            R"({"offsets":[0],"sizes":[4],"placement":"rank:0/cpu"},)"
            R"({"offsets":[4],"sizes":[4],"placement":null}]})");
}

TEST(ShardsToJsonTest, PrintsTheShardObjects) {
  const std::vector<ShardMetadata> shards = {
      Shard({0, 0}, {3, 20}, Rank(0)),
      Shard({3, 0}, {3, 20}, RemoteDevice::ForRank(1, Device::Cuda(1))),
      Shard({6, 0}, {0, 20}, std::nullopt)};
  EXPECT_EQ(ShardsToJson(shards),
            R"([{"offsets":[0,0],"sizes":[3,20],"placement":"rank:0/cpu"},)"
            R"({"offsets":[3,0],"sizes":[3,20],"placement":"rank:1/cuda:1"},)"
            R"({"offsets":[6,0],"sizes":[0,20],"placement":null}])");
  EXPECT_EQ(ShardsToJson({}), "[]");
}

TEST(ShardsToJsonTest, OutputIsAcceptedAsAnEnumerableSpec) {
  const std::vector<ShardMetadata> shards = {Shard({0}, {3}, Rank(0)),
                                             Shard({3}, {3}, std::nullopt)};
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec,
                       ShardingSpecFromJson(ShardsToJson(shards)));
  EXPECT_EQ(std::get<EnumerableShardingSpec>(spec).shards(), shards);
}

}  // namespace
}  // namespace tessera
