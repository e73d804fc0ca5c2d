// The settings table (common/setting_table.h): resolution from a flag, a
// variable or a default, errors that name their source, required settings,
// and a CLI11 command line and --help built from the table.
#include "common/setting_table.h"

#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Flags {
  std::optional<std::string> workers, port, name, verbose;
  bool dry_run = false;
  std::vector<std::string> tags;
};

struct Options {
  int workers = 0;
  int port = 0;
  std::string name;
  bool verbose = false;
  bool dry_run = false;
  std::vector<std::string> tags;
};

using Table = SettingTable<Flags, Options>;

Table MakeTable() {
  Table table;
  table.Add("--workers", &Flags::workers)
      .Env({"WORKERS", "SLURM_NTASKS"})
      .Required("worker count")
      .Help("N", "how many workers")
      .Int(&Options::workers, 1, 64);
  table.Add("--port", &Flags::port)
      .Env({"APP_PORT"})
      .Default(
          [](const Options& options) {
            return absl::StrCat(9000 + options.workers);
          },
          "9000 + workers")
      .Help("PORT", "where to listen")
      .Int(&Options::port, 1, 65535);
  table.Add("--name", &Flags::name)
      .Default("app")
      .Help("NAME", "what to call it")
      .Text(&Options::name)
      .Check([](absl::string_view source, const Options& options) {
        if (!options.name.empty()) return absl::OkStatus();
        return absl::InvalidArgumentError(
            absl::StrCat(source, " must not be empty"));
      });
  table.Add("--verbose", &Flags::verbose)
      .Env({"APP_VERBOSE"})
      .Default("false")
      .Help("BOOL", "say more")
      .Bool(&Options::verbose);
  table.Add("--dry-run", &Flags::dry_run)
      .Help("", "change nothing")
      .Bool(&Options::dry_run);
  table.Add("--tag", &Flags::tags)
      .DefaultNote("none")
      .Help("TAG", "a label (repeatable)")
      .List(&Options::tags);
  return table;
}

class SettingTableTest : public ::testing::Test {
 protected:
  absl::StatusOr<Options> Resolve(const Flags& flags) {
    Options options;
    absl::Status status = table_.Resolve(
        flags,
        [this](const std::string& name) -> std::optional<std::string> {
          auto it = vars_.find(name);
          if (it == vars_.end()) return std::nullopt;
          return it->second;
        },
        options);
    if (!status.ok()) return status;
    return options;
  }

  const Table table_ = MakeTable();
  std::map<std::string, std::string> vars_;
};

TEST_F(SettingTableTest, FromFlag) {
  vars_ = {{"WORKERS", "8"}, {"APP_PORT", "1234"}};
  Flags flags;
  flags.workers = "4";
  flags.port = "80";
  flags.name = "web";
  flags.dry_run = true;
  flags.tags = {"a", "b"};
  ASSERT_OK_AND_ASSIGN(Options options, Resolve(flags));
  EXPECT_EQ(options.workers, 4);  // The flag wins over the variable.
  EXPECT_EQ(options.port, 80);
  EXPECT_EQ(options.name, "web");
  EXPECT_TRUE(options.dry_run);
  EXPECT_THAT(options.tags, ElementsAre("a", "b"));
}

TEST_F(SettingTableTest, FromEnvironmentInOrder) {
  // An empty variable counts as unset: the next one is read.
  vars_ = {{"WORKERS", ""}, {"SLURM_NTASKS", "3"}, {"APP_VERBOSE", "TRUE"}};
  ASSERT_OK_AND_ASSIGN(Options options, Resolve({}));
  EXPECT_EQ(options.workers, 3);
  EXPECT_TRUE(options.verbose);
}

TEST_F(SettingTableTest, FromDefaults) {
  Flags flags;
  flags.workers = "2";
  ASSERT_OK_AND_ASSIGN(Options options, Resolve(flags));
  EXPECT_EQ(options.port, 9002);  // Computed from the setting before.
  EXPECT_EQ(options.name, "app");
  EXPECT_FALSE(options.verbose);
  EXPECT_FALSE(options.dry_run);
  EXPECT_TRUE(options.tags.empty());  // No default: left as it started.
}

TEST_F(SettingTableTest, ErrorsNameTheirSource) {
  vars_ = {{"WORKERS", "many"}};
  EXPECT_THAT(Resolve({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "WORKERS must be an integer, got 'many'"));
  vars_ = {{"SLURM_NTASKS", "99"}};
  EXPECT_THAT(Resolve({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "SLURM_NTASKS must be in [1, 64], got 99"));
  // A whole number beyond int is told the range, not that it is none.
  vars_ = {{"SLURM_NTASKS", "99999999999"}};
  EXPECT_THAT(Resolve({}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "SLURM_NTASKS must be in [1, 64], got 99999999999"));
  vars_ = {{"WORKERS", "2"}, {"APP_PORT", "0"}};
  EXPECT_THAT(Resolve({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "APP_PORT must be in [1, 65535], got 0"));
  vars_ = {{"WORKERS", "2"}, {"APP_VERBOSE", "yes"}};
  EXPECT_THAT(Resolve({}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "APP_VERBOSE must be true or false; got 'yes'"));
  Flags flags;
  flags.workers = "x";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--workers must be an integer, got 'x'"));
  flags.workers = "2";
  flags.name = "";  // Given empty: applied, and checked.
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "--name must not be empty"));
}

TEST_F(SettingTableTest, RequiredSaysWhereItCouldComeFrom) {
  EXPECT_THAT(Resolve({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "no worker count: pass --workers or set "
                                    "WORKERS (or SLURM_NTASKS)"));
  Table bare;
  bare.Add("--id", &Flags::name).Required("id").Text(&Options::name);
  Options options;
  EXPECT_THAT(bare.Resolve({}, nullptr, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "--id is required"));
}

TEST_F(SettingTableTest, ValidateAndDefaultsOfOptionsMadeByCode) {
  Options options;
  ASSERT_THAT(table_.SetDefaults(options), IsOk());
  EXPECT_EQ(options.name, "app");
  EXPECT_EQ(options.port, 0);  // Computed defaults need a resolution.
  options.workers = 65;
  EXPECT_THAT(table_.Validate(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--workers must be in [1, 64], got 65"));
}

// ---- the command line ------------------------------------------------------

struct Parsed {
  int exit_code = 0;
  std::string out;
  std::string error;
  Flags flags;
};

Parsed Parse(const Table& table, std::vector<std::string> args) {
  Parsed parsed;
  CLI::App app("an app", "app");
  table.AddTo(app, parsed.flags);
  std::vector<const char*> argv = {"app"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    parsed.exit_code = app.exit(e, out, err);
    parsed.out = out.str();
    parsed.error = e.what();
  }
  return parsed;
}

TEST_F(SettingTableTest, CommandLineFillsTheFlags) {
  Parsed parsed = Parse(table_, {"--workers", "4", "--dry-run", "--tag", "a",
                                 "--tag=b", "--name", ""});
  ASSERT_EQ(parsed.exit_code, 0) << parsed.error;
  EXPECT_EQ(parsed.flags.workers, "4");
  EXPECT_EQ(parsed.flags.port, std::nullopt);
  EXPECT_EQ(parsed.flags.name, "");  // Given empty is given.
  EXPECT_TRUE(parsed.flags.dry_run);
  EXPECT_THAT(parsed.flags.tags, ElementsAre("a", "b"));
}

TEST_F(SettingTableTest, ParserRequiresOnlySettingsWithoutVariables) {
  // --workers may come from WORKERS: resolution says it is missing.
  EXPECT_EQ(Parse(table_, {}).exit_code, 0);
  Table bare;
  bare.Add("--id", &Flags::name).Required("id").Text(&Options::name);
  const Parsed missing = Parse(bare, {});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_THAT(missing.error, HasSubstr("--id is required"));
}

TEST_F(SettingTableTest, HelpListsEverySettingOnceWithItsSources) {
  const Parsed help = Parse(table_, {"--help"});
  ASSERT_EQ(help.exit_code, 0);
  std::map<std::string, int> listed;
  for (absl::string_view line : absl::StrSplit(help.out, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    for (const Table::Setting& setting : table_.settings()) {
      if (absl::StartsWith(line, setting.flag() + " ") ||
          line == setting.flag()) {
        ++listed[setting.flag()];
      }
    }
  }
  for (const Table::Setting& setting : table_.settings()) {
    EXPECT_EQ(listed[setting.flag()], 1) << setting.flag() << "\n" << help.out;
  }
  EXPECT_THAT(help.out,
              HasSubstr("how many workers [env WORKERS, SLURM_NTASKS]"));
  EXPECT_THAT(help.out, HasSubstr("[env APP_PORT; default 9000 + workers]"));
  EXPECT_THAT(help.out, HasSubstr("what to call it [default app]"));
  EXPECT_THAT(help.out, HasSubstr("a label (repeatable) [default none]"));
}

}  // namespace
}  // namespace tessera
