// The daemon's JSON log lines (server/daemon/log_format.h): every line is
// one object that parses, with the process's and the thread's context.
#include "server/daemon/log_format.h"

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/log_context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/logger.h"
#include "spdlog/sinks/ostream_sink.h"

namespace tessera {
namespace {

std::vector<nlohmann::json> Lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    lines.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  return lines;
}

TEST(JsonLogFormatTest, EveryLineIsOneObjectWithItsContext) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  spdlog::logger logger("json", sink);
  logger.set_formatter(NewJsonLogFormatter());
  SetLogRank(3);
  SetLogGeneration(2);

  logger.info("plain");
  {
    const ScopedLogContext op(LogContext{17, "w\"eights", "r-1", -1});
    // A hostile message: quotes, a newline that would forge a line, bytes
    // that are not UTF-8.
    logger.warn("quote \" newline \n{\"op\":1} bad \xff\xfe end");
    {
      const ScopedLogContext peer(LogContext{17, "w\"eights", "r-1", 2});
      logger.error("peer");
    }
    logger.info("back");
  }
  logger.info("after");

  const std::vector<nlohmann::json> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 5u) << out.str();
  for (const nlohmann::json& line : lines) {
    ASSERT_FALSE(line.is_discarded()) << out.str();
    EXPECT_EQ(line["rank"], 3);
    EXPECT_EQ(line["generation"], 2);
    EXPECT_THAT(line["time"].get<std::string>(),
                ::testing::MatchesRegex(
                    "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\\.[0-9]{3}Z"));
  }
  EXPECT_EQ(lines[0]["level"], "info");
  EXPECT_FALSE(lines[0].contains("op"));
  EXPECT_FALSE(lines[0].contains("peer"));
  EXPECT_EQ(lines[1]["level"], "warning");
  EXPECT_EQ(lines[1]["op"], 17);
  EXPECT_EQ(lines[1]["tensor"], "w\"eights");
  EXPECT_EQ(lines[1]["request"], "r-1");
  EXPECT_THAT(lines[1]["message"].get<std::string>(),
              ::testing::StartsWith("quote \" newline \n{\"op\":1} bad "));
  EXPECT_EQ(lines[2]["peer"], 2);
  // Fields in a fixed order, time first and message last.
  EXPECT_THAT(out.str(),
              ::testing::HasSubstr("\"op\":17,\"tensor\":\"w\\\"eights\","
                                   "\"request\":\"r-1\",\"peer\":2,"
                                   "\"message\":\"peer\"}"));
  EXPECT_EQ(out.str().rfind("{\"time\":", 0), 0u);
  EXPECT_FALSE(lines[3].contains("peer"));
  EXPECT_EQ(lines[3]["op"], 17);
  EXPECT_FALSE(lines[4].contains("op"));
}

// A message of a megabyte (an error quoting a caller's path or name) takes
// kMaxLogMessageBytes of a line and its length, in either format; shorter
// ones are whole, and the text format is the daemon's pattern.
TEST(LogFormatTest, ALongMessageIsCutAndSaysHowLongItWas) {
  const std::string huge = "start " + std::string(1 << 20, 'p') + " end";
  for (const bool json : {true, false}) {
    std::ostringstream out;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
    spdlog::logger logger("cut", sink);
    logger.set_formatter(json ? NewJsonLogFormatter() : NewTextLogFormatter());
    logger.info("short {}", 1);
    logger.warn("{}", huge);
    const std::vector<std::string> lines =
        absl::StrSplit(out.str(), '\n', absl::SkipEmpty());
    ASSERT_EQ(lines.size(), 2u) << json;
    EXPECT_LT(lines[1].size(), kMaxLogMessageBytes + 256) << json;
    EXPECT_THAT(lines[1], ::testing::HasSubstr("start ppp")) << json;
    EXPECT_THAT(lines[1], ::testing::HasSubstr(
                              absl::StrCat("...(", huge.size(), " bytes)")))
        << json;
    EXPECT_THAT(lines[1], ::testing::Not(::testing::HasSubstr(" end")));
    if (json) {
      EXPECT_EQ(Lines(out.str())[0]["message"], "short 1");
    } else {
      EXPECT_THAT(lines[0],
                  ::testing::MatchesRegex(
                      "\\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8}\\.[0-9]{3}"
                      "\\] \\[info\\] short 1"));
      EXPECT_THAT(lines[1], ::testing::HasSubstr("] [warning] start "));
    }
  }
}

}  // namespace
}  // namespace tessera
