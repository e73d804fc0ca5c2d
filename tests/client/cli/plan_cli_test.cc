// Runs the built `tessera` binary as a user would and checks its stdout,
// stderr and exit code.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/cli/cli_runner.h"

namespace {

using ::tessera::testing::Lines;
using ::tessera::testing::RunResult;
using ::tessera::testing::RunTessera;
using ::tessera::testing::TempDir;

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

constexpr char kChunk4[] =
    "chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu";
constexpr char kEnum4[] =
    "enum:0,0:5,5@rank:0/cpu;0,5:5,5@rank:1/cpu;5,0:5,5@rank:2/cpu;"
    "5,5:5,5@rank:3/cpu";

// A usage error: exit 2, nothing on stdout, one line on stderr.
void ExpectUsageError(const RunResult& result, const std::string& message) {
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_THAT(result.out, IsEmpty());
  EXPECT_THAT(result.err, AllOf(StartsWith("tessera plan: error: "),
                                HasSubstr(message), EndsWith("\n")));
  EXPECT_EQ(Lines(result.err).size(), 1u) << result.err;
}

struct JsonShard {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  std::string placement;
  friend bool operator==(const JsonShard& a, const JsonShard& b) {
    return a.offsets == b.offsets && a.sizes == b.sizes &&
           a.placement == b.placement;
  }
  friend std::ostream& operator<<(std::ostream& os, const JsonShard& s) {
    return os << nlohmann::json(s.offsets) << " " << nlohmann::json(s.sizes)
              << " " << s.placement;
  }
};

// Parses `tessera plan --json` output; a null placement reads as "null".
std::vector<JsonShard> ParseShards(const std::string& text) {
  std::vector<JsonShard> shards;
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  EXPECT_TRUE(json.is_array()) << text;
  if (!json.is_array()) return shards;
  for (const nlohmann::json& shard : json) {
    EXPECT_EQ(shard.size(), 3u) << shard;
    JsonShard parsed;
    parsed.offsets = shard.at("offsets").get<std::vector<int64_t>>();
    parsed.sizes = shard.at("sizes").get<std::vector<int64_t>>();
    parsed.placement = shard.at("placement").is_null()
                           ? "null"
                           : shard.at("placement").get<std::string>();
    shards.push_back(parsed);
  }
  return shards;
}

// ------------------------------------------------------------- Success.

TEST(PlanCliTest, PrintsTheTableForTheIssueExample) {
  const RunResult result =
      RunTessera({"plan", "--size", "10,20", "--spec", kChunk4});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.err, IsEmpty());
  EXPECT_EQ(result.out,
            "Sharded tensor [10, 20] float32, 4 shards over chunk dim 0\n"
            "SHARD  OFFSETS  SIZES    PLACEMENT   ELEMENTS  BYTES\n"
            "0      [0, 0]   [3, 20]  rank:0/cpu  60        240\n"
            "1      [3, 0]   [3, 20]  rank:1/cpu  60        240\n"
            "2      [6, 0]   [3, 20]  rank:2/cpu  60        240\n"
            "3      [9, 0]   [1, 20]  rank:3/cpu  20        80\n"
            "Total: 200 elements, 800 bytes on 4 ranks; per rank: min 20 "
            "(rank 3), max 60 (rank 0), max/mean 1.20\n");
}

TEST(PlanCliTest, DtypeSetsTheByteCounts) {
  const RunResult result = RunTessera(
      {"plan", "--size", "10,20", "--spec", kChunk4, "--dtype", "float64"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("[10, 20] float64"));
  EXPECT_THAT(result.out, HasSubstr("rank:0/cpu  60        480\n"));
  EXPECT_THAT(result.out, HasSubstr("Total: 200 elements, 1600 bytes"));
}

TEST(PlanCliTest, JsonOutputForTheIssueExample) {
  const RunResult result =
      RunTessera({"plan", "--size", "10,20", "--spec", kChunk4, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.err, IsEmpty());
  EXPECT_EQ(Lines(result.out).size(), 1u);
  EXPECT_THAT(ParseShards(result.out),
              ElementsAre(JsonShard{{0, 0}, {3, 20}, "rank:0/cpu"},
                          JsonShard{{3, 0}, {3, 20}, "rank:1/cpu"},
                          JsonShard{{6, 0}, {3, 20}, "rank:2/cpu"},
                          JsonShard{{9, 0}, {1, 20}, "rank:3/cpu"}));
}

TEST(PlanCliTest, NineRowsOverFourRanksLeaveTheLastEmpty) {
  const RunResult result =
      RunTessera({"plan", "--size", "9,4", "--spec", kChunk4, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(ParseShards(result.out),
              ElementsAre(JsonShard{{0, 0}, {3, 4}, "rank:0/cpu"},
                          JsonShard{{3, 0}, {3, 4}, "rank:1/cpu"},
                          JsonShard{{6, 0}, {3, 4}, "rank:2/cpu"},
                          JsonShard{{9, 0}, {0, 4}, "rank:3/cpu"}));

  const RunResult table =
      RunTessera({"plan", "--size", "9,4", "--spec", kChunk4});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("3      [9, 0]   [0, 4]  rank:3/cpu  0"));
  EXPECT_THAT(table.out, HasSubstr("min 0 (rank 3), max 12 (rank 0)"));
  EXPECT_THAT(table.out, HasSubstr("; 1 empty shard\n"));
}

TEST(PlanCliTest, TwoRowsOverFourRanks) {
  const RunResult result =
      RunTessera({"plan", "--size", "2,5", "--spec", kChunk4, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(ParseShards(result.out),
              ElementsAre(JsonShard{{0, 0}, {1, 5}, "rank:0/cpu"},
                          JsonShard{{1, 0}, {1, 5}, "rank:1/cpu"},
                          JsonShard{{2, 0}, {0, 5}, "rank:2/cpu"},
                          JsonShard{{3, 0}, {0, 5}, "rank:3/cpu"}));
}

TEST(PlanCliTest, NegativeDimCountsFromTheEnd) {
  const RunResult result =
      RunTessera({"plan", "--size", "4,8", "--spec",
                  "chunk:dim=-1:rank:0/cpu,rank:1/cpu", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(ParseShards(result.out),
              ElementsAre(JsonShard{{0, 0}, {4, 4}, "rank:0/cpu"},
                          JsonShard{{0, 4}, {4, 4}, "rank:1/cpu"}));

  const RunResult table = RunTessera({"plan", "--size", "4,8", "--spec",
                                      "chunk:dim=-1:rank:0/cpu,rank:1/cpu"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, StartsWith("Sharded tensor [4, 8] float32, 2 shards "
                                    "over chunk dim -1 (= 1)\n"));
}

TEST(PlanCliTest, EnumerableSpec) {
  const RunResult result =
      RunTessera({"plan", "--size", "10,10", "--spec", kEnum4, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(ParseShards(result.out),
              ElementsAre(JsonShard{{0, 0}, {5, 5}, "rank:0/cpu"},
                          JsonShard{{0, 5}, {5, 5}, "rank:1/cpu"},
                          JsonShard{{5, 0}, {5, 5}, "rank:2/cpu"},
                          JsonShard{{5, 5}, {5, 5}, "rank:3/cpu"}));

  const RunResult table = RunTessera(
      {"plan", "--size", "10,10", "--spec", kEnum4, "--dtype", "int8"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(Lines(table.out),
              ElementsAre("Sharded tensor [10, 10] int8, 4 shards from an "
                          "enumerable spec",
                          "SHARD  OFFSETS  SIZES   PLACEMENT   ELEMENTS  BYTES",
                          "0      [0, 0]   [5, 5]  rank:0/cpu  25        25",
                          "1      [0, 5]   [5, 5]  rank:1/cpu  25        25",
                          "2      [5, 0]   [5, 5]  rank:2/cpu  25        25",
                          "3      [5, 5]   [5, 5]  rank:3/cpu  25        25",
                          "Total: 100 elements, 100 bytes on 4 ranks; per "
                          "rank: min 25 (rank 0), max 25 (rank 0), max/mean "
                          "1.00"));
}

TEST(PlanCliTest, SpecFileRoundTrip) {
  TempDir dir;
  const std::string spec_file = dir.Write("spec.json",
                                          R"({"type": "chunk", "dim": 0,
          "placements": ["rank:0/cpu", "rank:1/cpu", "rank:2/cpu",
                         "rank:3/cpu"]})");
  const RunResult from_file = RunTessera(
      {"plan", "--size", "10,20", "--spec-file", spec_file, "--json"});
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  const RunResult from_text =
      RunTessera({"plan", "--size", "10,20", "--spec", kChunk4, "--json"});
  ASSERT_EQ(from_text.exit_code, 0) << from_text.err;
  EXPECT_EQ(from_file.out, from_text.out);

  // The --json output, wrapped or bare, is an enumerable spec giving back
  // the same shards.
  const std::string wrapped = dir.Write(
      "wrapped.json",
      absl::StrCat(R"({"type": "enumerable", "shards": )", from_file.out, "}"));
  const std::string bare = dir.Write("bare.json", from_file.out);
  for (const std::string& file : {wrapped, bare}) {
    SCOPED_TRACE(file);
    const RunResult again =
        RunTessera({"plan", "--size", "10,20", "--spec-file", file, "--json"});
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(again.out, from_file.out);
  }
}

TEST(PlanCliTest, SpecFileEnumerable) {
  TempDir dir;
  const std::string spec_file = dir.Write("spec.json",
                                          R"({"type": "enumerable", "shards": [
            {"offsets": [0], "sizes": [6], "placement": "rank:0/cuda:0"},
            {"offsets": [6], "sizes": [4], "placement": "rank:1/cuda:1"}]})");
  const RunResult result =
      RunTessera({"plan", "--size", "10", "--spec-file", spec_file, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(ParseShards(result.out),
              ElementsAre(JsonShard{{0}, {6}, "rank:0/cuda:0"},
                          JsonShard{{6}, {4}, "rank:1/cuda:1"}));
}

// ------------------------------------------------------------ Failures.

TEST(PlanCliTest, BadSize) {
  ExpectUsageError(RunTessera({"plan", "--size", "10,-2", "--spec", kChunk4}),
                   "Invalid size '10,-2': sizes must be non-negative integers "
                   "separated by commas");
  ExpectUsageError(RunTessera({"plan", "--size", "10x20", "--spec", kChunk4}),
                   "Invalid size '10x20'");
}

TEST(PlanCliTest, BadSpecGrammar) {
  ExpectUsageError(
      RunTessera({"plan", "--size", "10,20", "--spec", "split:rank:0/cpu"}),
      "Invalid sharding spec 'split:rank:0/cpu': expected chunk:dim=<int>:");
  ExpectUsageError(RunTessera({"plan", "--size", "10,20", "--spec",
                               "enum:0,0:5@rank:0/cpu"}),
                   "shard_offsets and shard_sizes");
  ExpectUsageError(RunTessera({"plan", "--size", "10,20", "--spec",
                               "chunk:dim=0:rank:0/cpu,bad/place/x"}),
                   "Could not parse remote_device: bad/place/x");
}

TEST(PlanCliTest, NamedDim) {
  ExpectUsageError(RunTessera({"plan", "--size", "10,20", "--spec",
                               "chunk:dim=H:rank:0/cpu,rank:1/cpu"}),
                   "does not support named dimension");
}

TEST(PlanCliTest, InvalidShardingDim) {
  ExpectUsageError(RunTessera({"plan", "--size", "10,20", "--spec",
                               "chunk:dim=2:rank:0/cpu,rank:1/cpu"}),
                   "Invalid sharding dim: 2");
  ExpectUsageError(RunTessera({"plan", "--size", "10,20", "--spec",
                               "chunk:dim=-3:rank:0/cpu,rank:1/cpu"}),
                   "Invalid sharding dim: -3");
}

TEST(PlanCliTest, OverlappingEnumerableShards) {
  ExpectUsageError(RunTessera({"plan", "--size", "10,10", "--spec",
                               "enum:0,0:5,5@rank:0/cpu;4,4:6,6@rank:1/cpu"}),
                   "overlap");
}

TEST(PlanCliTest, NonCoveringShards) {
  ExpectUsageError(RunTessera({"plan", "--size", "10,10", "--spec",
                               "enum:0,0:5,10@rank:0/cpu"}),
                   "does not match tensor volume");
}

TEST(PlanCliTest, BadDtype) {
  ExpectUsageError(RunTessera({"plan", "--size", "10,20", "--spec", kChunk4,
                               "--dtype", "float128"}),
                   "float128");
}

TEST(PlanCliTest, BadSpecFileContents) {
  TempDir dir;
  const std::string spec_file = dir.Write("spec.json", R"({"type": "chunk"})");
  ExpectUsageError(
      RunTessera({"plan", "--size", "10", "--spec-file", spec_file}),
      absl::StrCat(spec_file,
                   ": Invalid JSON sharding spec: field \"dim\" is "
                   "missing"));
  const std::string not_json = dir.Write("bad.json", "chunk:dim=0:rank:0/cpu");
  ExpectUsageError(
      RunTessera({"plan", "--size", "10", "--spec-file", not_json}),
      "parse error");
}

TEST(PlanCliTest, UnreadableSpecFileIsAFailureNotAUsageError) {
  TempDir dir;
  for (const std::string& path : {dir.path() + "/missing.json", dir.path()}) {
    const RunResult result =
        RunTessera({"plan", "--size", "10", "--spec-file", path});
    EXPECT_EQ(result.exit_code, 1) << result.err;
    EXPECT_THAT(result.out, IsEmpty());
    EXPECT_THAT(
        result.err,
        AllOf(StartsWith("tessera plan: error: cannot read spec file '" + path +
                         "': "),
              EndsWith("\n")));
  }
}

TEST(PlanCliTest, MissingSpec) {
  ExpectUsageError(RunTessera({"plan", "--size", "10,20"}),
                   "exactly one of --spec or --spec-file is required");
}

TEST(PlanCliTest, BothSpecAndSpecFile) {
  ExpectUsageError(RunTessera({"plan", "--size", "10,20", "--spec", kChunk4,
                               "--spec-file", "spec.json"}),
                   "--spec");
}

TEST(PlanCliTest, MissingSize) {
  ExpectUsageError(RunTessera({"plan", "--spec", kChunk4}), "--size");
}

TEST(PlanCliTest, UnknownFlag) {
  ExpectUsageError(
      RunTessera({"plan", "--size", "10,20", "--spec", kChunk4, "--bogus"}),
      "--bogus");
}

TEST(PlanCliTest, MissingSpecFileExitsOne) {
  TempDir dir;
  const std::string missing = absl::StrCat(dir.path(), "/missing.json");
  const RunResult result =
      RunTessera({"plan", "--size", "10,20", "--spec-file", missing});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_THAT(result.out, IsEmpty());
  EXPECT_THAT(result.err,
              AllOf(StartsWith("tessera plan: error: "), HasSubstr(missing),
                    HasSubstr("No such file or directory")));
  EXPECT_EQ(Lines(result.err).size(), 1u) << result.err;
}

TEST(PlanCliTest, SpecFileThatIsADirectoryExitsOne) {
  TempDir dir;
  const RunResult result =
      RunTessera({"plan", "--size", "10,20", "--spec-file", dir.path()});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_THAT(result.err, AllOf(StartsWith("tessera plan: error: "),
                                HasSubstr(dir.path())));
}

// --------------------------------------------------------- Top level.

TEST(TesseraCliTest, HelpListsSubcommands) {
  const RunResult result = RunTessera({"--help"});
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_THAT(result.err, IsEmpty());
  EXPECT_THAT(result.out, HasSubstr("plan"));
}

TEST(TesseraCliTest, PlanHelpDocumentsFlagsAndExamples) {
  const RunResult result = RunTessera({"plan", "--help"});
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_THAT(result.err, IsEmpty());
  EXPECT_THAT(result.out, AllOf(HasSubstr("--size"), HasSubstr("--spec"),
                                HasSubstr("--spec-file"), HasSubstr("--dtype"),
                                HasSubstr("--json"), HasSubstr("Examples:"),
                                HasSubstr("chunk:dim=<int>")));
}

TEST(TesseraCliTest, NoSubcommandIsAUsageError) {
  const RunResult result = RunTessera({});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, StartsWith("tessera: error: "));
  EXPECT_EQ(Lines(result.err).size(), 1u) << result.err;
}

TEST(TesseraCliTest, UnknownSubcommandIsAUsageError) {
  const RunResult result = RunTessera({"frobnicate"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err,
              AllOf(StartsWith("tessera: error: "), HasSubstr("frobnicate")));
  EXPECT_EQ(Lines(result.err).size(), 1u) << result.err;
}

}  // namespace
