// The cluster subcommands of the built `tessera` binary without a cluster:
// --help, usage errors (exit 2, one line, before any daemon is contacted),
// unreachable daemons (exit 1, quickly), and `tessera launch` supervising
// stand-in daemons (a shell script that behaves as told), so that its
// start-up, signal handling and failure paths are checked without
// tessera-server. End-to-end runs against real daemons live in
// tests/integration.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/subprocess.h"
#include "tests/client/cli/cli_runner.h"
#include "tests/testing/daemon_cluster.h"

namespace tessera::testing {
namespace {

using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kChunk2[] = "chunk:dim=0:rank:0/cpu,rank:1/cpu";

// An address where nothing listens: a command that should not contact a
// daemon and does so anyway fails with 1, not the 2 these tests expect.
std::string DeadAddress() {
  absl::StatusOr<int> port = PickFreePort();
  EXPECT_TRUE(port.ok()) << port.status();
  return absl::StrCat("127.0.0.1:", port.ok() ? *port : 1);
}

RunResult RunOffline(const std::vector<std::string>& args) {
  return RunTessera(args, {{"TESSERA_ADDRESS", DeadAddress()}});
}

// Exit 2, nothing on stdout, one line "tessera <command>: error: ...".
void ExpectUsageError(const RunResult& result, const std::string& command,
                      const std::string& message) {
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_THAT(result.out, IsEmpty());
  EXPECT_THAT(result.err,
              AllOf(StartsWith(absl::StrCat("tessera ", command, ": error: ")),
                    HasSubstr(message), EndsWith("\n")));
  EXPECT_EQ(Lines(result.err).size(), 1u) << result.err;
}

// Exit 1 with one error line.
void ExpectFailure(const RunResult& result, const std::string& command,
                   const std::string& message) {
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_THAT(result.err,
              AllOf(StartsWith(absl::StrCat("tessera ", command, ": error: ")),
                    HasSubstr(message), EndsWith("\n")));
  EXPECT_EQ(Lines(result.err).size(), 1u) << result.err;
}

// ------------------------------------------------------------------ Help.

TEST(CommandsCliTest, EveryCommandHasHelp) {
  for (const char* command :
       {"launch", "health", "ls", "describe", "create", "fetch", "read",
        "write", "rm", "save", "load", "plan"}) {
    const RunResult result = RunOffline({command, "--help"});
    EXPECT_EQ(result.exit_code, 0) << command << ": " << result.err;
    EXPECT_THAT(result.out, HasSubstr("Exit status")) << command;
    EXPECT_THAT(result.err, IsEmpty()) << command;
    // A checked flag shows its own type name alone, not CLI11's
    // "TYPE:CHECK" (which read "--timeout SECONDS:SECONDS").
    if (std::string(command) != "launch" && std::string(command) != "plan") {
      EXPECT_THAT(result.out, HasSubstr("--timeout SECONDS ")) << command;
      EXPECT_THAT(result.out, HasSubstr("--request-id ID ")) << command;
    }
    EXPECT_THAT(result.out, Not(HasSubstr("SECONDS:"))) << command;
    EXPECT_THAT(result.out, Not(HasSubstr(":INT in"))) << command;
  }
  const RunResult top = RunOffline({"--help"});
  EXPECT_EQ(top.exit_code, 0);
  for (const char* command : {"launch", "health", "ls", "describe", "create",
                              "fetch", "read", "write", "rm", "save", "load"}) {
    EXPECT_THAT(top.out, HasSubstr(command));
  }
}

// -------------------------------------------------- Usage errors (exit 2).

TEST(CommandsCliTest, LsAndDescribeUsageErrors) {
  ExpectUsageError(RunOffline({"ls", "extra"}), "ls", "extra");
  ExpectUsageError(RunOffline({"describe"}), "describe", "name is required");
  ExpectUsageError(RunOffline({"describe", "w", "--timeout", "0"}), "describe",
                   "--timeout");
  ExpectUsageError(RunOffline({"ls", "--timeout", "soon"}), "ls", "--timeout");
  // NaN passed CLI11's positive check; infinity or more than 1e7 seconds
  // would be no deadline.
  for (const char* seconds : {"nan", "inf", "-inf", "1e400", "10000001"}) {
    ExpectUsageError(RunOffline({"ls", "--timeout", seconds}), "ls",
                     absl::StrCat("--timeout: must be a number of seconds "
                                  "above 0 and at most 10000000, not ",
                                  seconds));
  }
  ExpectUsageError(RunOffline({"top", "--interval", "nan"}), "top",
                   "--interval: must be a number of seconds from 0.1 to 3600");
  ExpectUsageError(RunOffline({"watch", "w", "--idle-timeout", "inf"}), "watch",
                   "--idle-timeout: must be a number of seconds");
}

// Whole-number flags are checked on their text: CLI11 took a number its
// type cannot hold as the type's largest (a 20-digit --after watched for a
// version that never comes) and answered a negative one with a range up
// to 1.8e308.
TEST(CommandsCliTest, WholeNumberFlagsSayTheirRange) {
  const std::string kInt64Max = "9223372036854775807";
  struct Case {
    std::vector<std::string> args;
    std::string command;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"read", "w", "--offsets", "0", "--sizes", "1", "--version",
        "99999999999999999999"},
       "read",
       "--version: must be a whole number from 1 to " + kInt64Max +
           ", not 99999999999999999999"},
      {{"fetch", "w", "-o", "w.npy", "--version", "0"},
       "fetch",
       "--version: must be a whole number from 1 to " + kInt64Max + ", not 0"},
      {{"fetch", "w", "-o", "w.npy", "--shard", "-1"},
       "fetch",
       "--shard: must be a whole number from 0 to " + kInt64Max + ", not -1"},
      {{"watch", "w", "--after", "1.5"},
       "watch",
       "--after: must be a whole number from 1 to " + kInt64Max + ", not 1.5"},
      {{"watch", "w", "--count", "99999999999999999999"},
       "watch",
       "--count: must be a whole number"},
      {{"top", "--iterations", "3000000000"},
       "top",
       "--iterations: must be a whole number from 0 to 2147483647"},
      {{"create", "w", "--size", "4", "--spec", kChunk2, "--seed", "-1"},
       "create",
       "--seed: must be a whole number from 0 to 18446744073709551615, not "
       "-1"},
      {{"bench", "--lanes", "1,4294967297"},
       "bench",
       "--lanes: must be a whole number from 1 to 16, not 4294967297"},
      {{"bench", "--rank", "-3"},
       "bench",
       "--rank: must be a whole number from 0 to 2147483647, not -3"},
      {{"bench", "--reps", "0"},
       "bench",
       "--reps: must be a whole number from 1 to 100000, not 0"},
      {{"create", "w", "--size", "4", "--spec", kChunk2, "--versions", "2.5"},
       "create",
       "--versions: must be a whole number from 1 to 64, not 2.5"},
      {{"create", "w", "--size", "4", "--spec", kChunk2, "--copies", "0"},
       "create",
       "--copies: must be a whole number from 1 to 1048576, not 0"},
      {{"load", "ckpt", "--versions", "65"},
       "load",
       "--versions: must be a whole number from 1 to 64, not 65"},
  };
  for (const Case& c : cases) {
    ExpectUsageError(RunOffline(c.args), c.command, c.error);
  }
}

TEST(CommandsCliTest, CreateUsageErrors) {
  ExpectUsageError(RunOffline({"create", "w", "--spec", kChunk2}), "create",
                   "--size is required");
  // A flag of 100,000 bytes that a parser quotes: one line of at most
  // 2 KiB, cut in its middle.
  const std::string huge(100000, 'q');
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"create", "w", "--size", "4", "--spec", huge},
           {"create", "w", "--size", "4", "--spec", kChunk2, "--dtype",
            huge}}) {
    const RunResult result = RunOffline(args);
    ExpectUsageError(result, "create", "bytes cut ...]");
    EXPECT_LT(result.err.size(), 2200u);
  }
  ExpectUsageError(RunOffline({"create", "w", "--size", "4,4"}), "create",
                   "--spec is required");
  ExpectUsageError(
      RunOffline({"create", "w", "--size", "4,x", "--spec", kChunk2}), "create",
      "Invalid size '4,x'");
  ExpectUsageError(
      RunOffline({"create", "w", "--size", "4,4", "--spec", "split:0"}),
      "create", "split:0");
  ExpectUsageError(RunOffline({"create", "w", "--size", "4,4", "--spec",
                               "chunk:dim=2:rank:0/cpu,rank:1/cpu"}),
                   "create", "Invalid sharding dim");
  ExpectUsageError(RunOffline({"create", "w", "--size", "4,4", "--spec",
                               kChunk2, "--dtype", "float8"}),
                   "create", "float8");
  ExpectUsageError(RunOffline({"create", "w", "--size", "4,4", "--spec",
                               kChunk2, "--init", "twos"}),
                   "create", "unknown --init 'twos'");
  ExpectUsageError(RunOffline({"create", "w", "--size", "4,4", "--spec",
                               kChunk2, "--init", "ones", "--fill", "2"}),
                   "create", "--fill needs --init full");
  ExpectUsageError(RunOffline({"create", "w", "--size", "4,4", "--spec",
                               kChunk2, "--init", "randn", "--dtype", "int64"}),
                   "create", "needs a floating or complex dtype");
  ExpectUsageError(RunOffline({"create", "w", "--size", "4,4", "--spec",
                               kChunk2, "--seed", "-1"}),
                   "create", "--seed");
}

TEST(CommandsCliTest, FetchAndReadUsageErrors) {
  ExpectUsageError(RunOffline({"fetch", "w"}), "fetch", "--output is required");
  ExpectUsageError(RunOffline({"fetch", "w", "-o", "w.npy", "--shard", "-1"}),
                   "fetch", "--shard");
  ExpectUsageError(
      RunOffline({"fetch", "w", "-o", "w.npy", "--cast", "float8"}), "fetch",
      "float8");
  ExpectUsageError(RunOffline({"read", "w", "--offsets", "0,0"}), "read",
                   "--sizes is required");
  ExpectUsageError(
      RunOffline({"read", "w", "--offsets", "0,-1", "--sizes", "2,2"}), "read",
      "invalid --offsets '0,-1'");
  ExpectUsageError(
      RunOffline({"read", "w", "--offsets", "0,0", "--sizes", "2"}), "read",
      "--offsets has 2 entries but --sizes has 1");
  ExpectUsageError(
      RunOffline({"read", "w", "--offsets", "0,0", "--sizes", "1000,1000"}),
      "read",
      "the box holds 1000000 elements, more than the 10000 printed; write "
      "them to a file with -o");
  ExpectUsageError(RunOffline({"read", "w", "--offsets", "0", "--sizes", "2",
                               "--cast", "float8"}),
                   "read", "float8");
}

TEST(CommandsCliTest, WriteChecksItsFileBeforeAnyDaemon) {
  TempDir dir;
  ExpectUsageError(RunOffline({"write", "w", "--offsets", "0,0"}), "write",
                   "--input is required");
  // Missing: the environment failed (1); malformed: the user's input (2).
  ExpectFailure(RunOffline({"write", "w", "-i", dir.File("missing.npy")}),
                "write", "No such file or directory");
  const std::string garbage = dir.Write("garbage.npy", "not numpy at all");
  ExpectUsageError(RunOffline({"write", "w", "-i", garbage}), "write",
                   "not a valid .npy file");
  Tensor tensor = Tensor::Ones({2, 3}).value();
  const std::string good = dir.File("good.npy");
  ASSERT_TRUE(WriteNpy(good, tensor).ok());
  ExpectUsageError(RunOffline({"write", "w", "-i", good, "--offsets", "1"}),
                   "write", "--offsets has 1 entries but");
  ExpectUsageError(RunOffline({"write", "w", "-i", good, "--offsets", "a,b"}),
                   "write", "invalid --offsets 'a,b'");
}

TEST(CommandsCliTest, RmSaveLoadUsageErrors) {
  ExpectUsageError(RunOffline({"rm"}), "rm", "names is required");
  ExpectUsageError(RunOffline({"save"}), "save", "path is required");
  ExpectUsageError(RunOffline({"load"}), "load", "path is required");
  ExpectUsageError(RunOffline({"load", "/tmp/ckpt", "--as", "x"}), "load",
                   "--as gives 1 names but --names 0");
  ExpectUsageError(
      RunOffline({"load", "/tmp/ckpt", "--names", "a,b", "--as", "x"}), "load",
      "--as gives 1 names but --names 2");
  ExpectUsageError(RunOffline({"load", "/tmp/ckpt", "--names", "a,,b"}), "load",
                   "invalid --names 'a,,b'");
  ExpectUsageError(RunOffline({"load", "/tmp/ckpt", "--spec", "chunk:dim=0:"}),
                   "load", "chunk");
}

TEST(CommandsCliTest, HealthUsageErrors) {
  ExpectUsageError(RunOffline({"health", "extra"}), "health", "extra");
  ExpectUsageError(RunOffline({"health", "--timeout", "-3"}), "health",
                   "--timeout");
}

TEST(CommandsCliTest, LaunchUsageErrors) {
  ExpectUsageError(RunOffline({"launch"}), "launch", "--nproc is required");
  ExpectUsageError(RunOffline({"launch", "--nproc", "0"}), "launch",
                   "--nproc must be in [1, 4096], got 0");
  ExpectUsageError(RunOffline({"launch", "--nproc", "2147483648"}), "launch",
                   "--nproc must be in [1, 4096], got 2147483648");
  ExpectUsageError(
      RunOffline({"launch", "--nproc", "2", "--base-port", "70000"}), "launch",
      "--base-port must be in [1, 65535]");
  ExpectUsageError(
      RunOffline({"launch", "--nproc", "4", "--base-port", "65534"}), "launch",
      "the last would listen on port 65537");
  ExpectUsageError(
      RunOffline({"launch", "--nproc", "4", "--master-port", "29602"}),
      "launch", "--master-port 29602 is also a daemon's port");
  ExpectUsageError(
      RunOffline({"launch", "--nproc", "2", "--log-level", "loud"}), "launch",
      "unknown --log-level 'loud'");
  ExpectUsageError(RunOffline({"launch", "--nproc", "2", "--bogus"}), "launch",
                   "--bogus");
  ExpectFailure(
      RunOffline({"launch", "--nproc", "2", "--server", "/nonexistent"}),
      "launch", "--server '/nonexistent' is not an executable file");
}

// ------------------------------------------- Unreachable daemons (exit 1).

TEST(CommandsCliTest, HealthWithNothingListeningFailsQuickly) {
  const std::string address = DeadAddress();
  const absl::Time start = absl::Now();
  const RunResult result = RunTessera({"health", "--address", address});
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ExpectFailure(result, "health", absl::StrCat("cannot connect to ", address));
  EXPECT_THAT(result.out, IsEmpty());
}

TEST(CommandsCliTest, AddressComesFromFlagGlobalFlagOrEnvironment) {
  const std::string address = DeadAddress();
  const std::string other = DeadAddress();
  ExpectFailure(RunTessera({"health"}, {{"TESSERA_ADDRESS", address}}),
                "health", absl::StrCat("cannot connect to ", address));
  ExpectFailure(RunTessera({"--address", address, "health"},
                           {{"TESSERA_ADDRESS", other}}),
                "health", absl::StrCat("cannot connect to ", address));
  ExpectFailure(RunTessera({"--address", other, "ls", "-a", address}), "ls",
                absl::StrCat("cannot connect to ", address));
  // Neither: the first daemon `tessera launch` starts.
  const RunResult fallback =
      RunTessera({"health", "--timeout", "2"}, {{"TESSERA_ADDRESS", ""}});
  EXPECT_NE(fallback.exit_code, 2);
  if (fallback.exit_code != 0) {
    EXPECT_THAT(fallback.err, HasSubstr("127.0.0.1:29600"));
  }
}

TEST(CommandsCliTest, ClusterCommandsReportAnUnreachableDaemon) {
  TempDir dir;
  const std::vector<std::vector<std::string>> commands = {
      {"ls"},
      {"describe", "w"},
      {"create", "w", "--size", "4,4", "--spec", kChunk2},
      {"fetch", "w", "-o", dir.File("w.npy")},
      {"read", "w", "--offsets", "0,0", "--sizes", "2,2"},
      {"rm", "w"},
      {"save", dir.File("ckpt")},
      {"load", dir.File("ckpt")},
      {"op", "r-0123456789abcdef"}};
  for (const std::vector<std::string>& args : commands) {
    const std::string address = DeadAddress();
    std::vector<std::string> with_address = args;
    with_address.insert(with_address.end(), {"--address", address});
    ExpectFailure(RunTessera(with_address), args[0],
                  absl::StrCat("cannot connect to ", address));
  }
}

// Every command that talks to daemons takes --tls-ca, --tls-cert,
// --tls-key and --token-file, after the command or before it: a bad one is
// a usage error naming the flag before anything is dialled, and a good one
// wins over a bad variable (and one after the command over one before).
TEST(CommandsCliTest, ClusterCommandsTakeCredentialFlags) {
  TempDir dir;
  const std::string npy = dir.File("in.npy");
  ASSERT_TRUE(WriteNpy(npy, Tensor::Ones({2, 2}).value()).ok());
  const std::string token =
      dir.Write("token", "# ops\n\n  0123456789abcdef admin ops\n");
  const std::string comments = dir.Write("comments", "# none yet\n");
  const std::string not_pem = dir.Write("not.pem", "not a certificate");
  const std::vector<std::vector<std::string>> commands = {
      {"health"},
      {"top", "--once"},
      {"ls"},
      {"describe", "w"},
      {"create", "w", "--size", "4,4", "--spec", kChunk2},
      {"fetch", "w", "-o", dir.File("w.npy")},
      {"read", "w", "--offsets", "0,0", "--sizes", "2,2"},
      {"write", "w", "-i", npy, "--offsets", "0,0"},
      {"rm", "w"},
      {"save", dir.File("ckpt")},
      {"load", dir.File("ckpt")},
      {"op", "r-0123456789abcdef"}};
  for (const std::vector<std::string>& args : commands) {
    const std::string& command = args[0];
    const RunResult help = RunOffline({command, "--help"});
    for (const char* flag :
         {"--tls-ca", "--tls-cert", "--tls-key", "--token-file"}) {
      EXPECT_THAT(help.out, HasSubstr(flag)) << command;
    }
    auto with = [&](const std::vector<std::string>& more) {
      std::vector<std::string> line = args;
      line.insert(line.end(), more.begin(), more.end());
      line.insert(line.end(), {"--address", DeadAddress()});
      return line;
    };
    ExpectUsageError(RunTessera(with({"--token-file", dir.File("missing")})),
                     command, "--token-file: open " + dir.File("missing"));
    ExpectUsageError(RunTessera(with({"--token-file", comments})), command,
                     "--token-file: " + comments + " holds no token");
    ExpectUsageError(
        RunTessera(with({"--tls-ca", not_pem}), {{"TESSERA_TLS_CA", token}}),
        command, "--tls-ca: " + not_pem + " holds no PEM certificate");
    ExpectUsageError(RunTessera(with({}), {{"TESSERA_TLS_CA", not_pem}}),
                     command, "$TESSERA_TLS_CA: ");
    ExpectUsageError(RunTessera(with({"--tls-cert", not_pem})), command,
                     "--tls-cert and --tls-key or $TESSERA_TLS_KEY go "
                     "together");
    // A good --token-file wins over a bad $TESSERA_TOKEN_FILE: the command
    // goes on to dial.
    ExpectFailure(RunTessera(with({"--token-file", token}),
                             {{"TESSERA_TOKEN_FILE", dir.File("missing")}}),
                  command, "cannot connect to ");

    // Before the command: `tessera --token-file FILE ls`.
    auto before = [&](const std::vector<std::string>& flags,
                      const std::vector<std::string>& after = {}) {
      std::vector<std::string> line = flags;
      line.insert(line.end(), args.begin(), args.end());
      line.insert(line.end(), after.begin(), after.end());
      line.insert(line.end(), {"--address", DeadAddress()});
      return line;
    };
    ExpectUsageError(RunTessera(before({"--token-file", comments})), command,
                     "--token-file: " + comments + " holds no token");
    ExpectUsageError(
        RunTessera(before({"--tls-ca", not_pem}), {{"TESSERA_TLS_CA", token}}),
        command, "--tls-ca: " + not_pem + " holds no PEM certificate");
    ExpectUsageError(RunTessera(before({"--tls-key", not_pem})), command,
                     "--tls-cert or $TESSERA_TLS_CERT and --tls-key go "
                     "together");
    ExpectFailure(
        RunTessera(before({"--token-file", comments}, {"--token-file", token})),
        command, "cannot connect to ");
  }
}

// ------------------------------------------------------------ The launcher.

// Stands in for tessera-server: records its arguments and environment in
// $LAUNCH_TEST_DIR/rank<R>.args, then behaves as $LAUNCH_TEST_MODE says.
constexpr char kStandInServer[] = R"(#!/bin/sh
args="$*"
address_file=""
port=""
while [ $# -gt 0 ]; do
  case "$1" in
    --address-file) address_file="$2"; shift ;;
    --port) port="$2"; shift ;;
  esac
  shift
done
echo "$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT $args" \
  > "$LAUNCH_TEST_DIR/rank$RANK.args"
case "$LAUNCH_TEST_MODE" in
  fail_early) echo "stand-in rank $RANK failing" >&2; exit 4 ;;
  stubborn) trap '' TERM ;;
  *) trap 'exit 0' TERM ;;
esac
if [ "$LAUNCH_TEST_MODE" != never_serve ]; then
  printf '127.0.0.1:%s\n' "$port" > "$address_file.tmp"
  mv "$address_file.tmp" "$address_file"
fi
while :; do
  if [ "$LAUNCH_TEST_MODE" = die_rank1 ] && [ "$RANK" = 1 ] &&
     [ -e "$LAUNCH_TEST_DIR/go" ]; then
    exit 3
  fi
  sleep 0.05
done
)";

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = dir_.Write("tessera-server", kStandInServer);
    ASSERT_EQ(chmod(server_.c_str(), 0755), 0);
  }

  // Starts `tessera launch --nproc 2 --server <stand-in> ... extra`.
  void StartLauncher(const std::string& mode,
                     const std::vector<std::string>& extra = {}) {
    SpawnOptions spawn;
    spawn.program = TesseraPath();
    spawn.args = {"launch", "--nproc",     "2",     "--cpu",         "--server",
                  server_,  "--base-port", "45100", "--master-port", "45099"};
    spawn.args.insert(spawn.args.end(), extra.begin(), extra.end());
    spawn.env = {{"LAUNCH_TEST_DIR", dir_.path()}, {"LAUNCH_TEST_MODE", mode}};
    spawn.log_path = dir_.File("launch.log");
    absl::StatusOr<Subprocess> launcher = Subprocess::Spawn(std::move(spawn));
    ASSERT_TRUE(launcher.ok()) << launcher.status();
    launcher_.emplace(*std::move(launcher));
  }

  // The launcher's output once it says "ready", or "" when it exits or
  // times out first.
  std::string WaitForReady() {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      const std::string log = ReadAll(launcher_->log_path());
      if (absl::StrContains(log, "ready: ")) return log;
      if (!launcher_->running()) break;
      if (launcher_->WaitFor(absl::Milliseconds(20)).has_value()) break;
    }
    ADD_FAILURE() << "no 'ready' line: " << ReadAll(launcher_->log_path());
    return "";
  }

  // The daemons' pids from the "rank R: ADDRESS (pid P)" lines.
  static std::vector<pid_t> Pids(const std::string& log) {
    std::vector<pid_t> pids;
    for (const std::string& line : Lines(log)) {
      const size_t at = line.find("(pid ");
      if (!absl::StartsWith(line, "rank ") || at == std::string::npos) continue;
      int pid = 0;
      if (absl::SimpleAtoi(line.substr(at + 5, line.size() - at - 6), &pid)) {
        pids.push_back(pid);
      }
    }
    return pids;
  }

  static bool Gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

  // The launcher's exit code, once it exited within `timeout`.
  std::optional<int> ExitCode(absl::Duration timeout) {
    std::optional<int> status = launcher_->WaitFor(timeout);
    if (!status.has_value() || !WIFEXITED(*status)) return std::nullopt;
    return WEXITSTATUS(*status);
  }

  TempDir dir_;
  std::string server_;
  std::optional<Subprocess> launcher_;
};

TEST_F(LaunchTest, StartsEveryRankPrintsAddressesAndStopsOnSigint) {
  StartLauncher("serve", {"--", "--timeout", "120s"});
  const std::string log = WaitForReady();
  EXPECT_THAT(
      log,
      ContainsRegex("rank 0: 127\\.0\\.0\\.1:45100 \\(pid [0-9]+\\)\n"
                    "rank 1: 127\\.0\\.0\\.1:45101 \\(pid [0-9]+\\)\n"
                    "ready: export TESSERA_ADDRESS=127\\.0\\.0\\.1:45100\n"));
  const std::vector<pid_t> pids = Pids(log);
  ASSERT_EQ(pids.size(), 2u) << log;

  // torchrun's variables and the same as flags, then the extra flags.
  for (int rank = 0; rank < 2; ++rank) {
    const std::string args =
        ReadAll(dir_.File(absl::StrCat("rank", rank, ".args")));
    EXPECT_THAT(args, StartsWith(absl::StrCat(
                          rank, " 2 ", rank, " 127.0.0.1 45099 --rank ", rank,
                          " --world-size 2 --local-rank ", rank)))
        << args;
    EXPECT_THAT(args, HasSubstr(absl::StrCat(
                          "--master-addr 127.0.0.1 --master-port 45099 --host "
                          "127.0.0.1 --port ",
                          45100 + rank, " --device cpu --address-file ")));
    EXPECT_THAT(args, EndsWith(" --timeout 120s\n"));
  }

  launcher_->Signal(SIGINT);
  EXPECT_EQ(ExitCode(absl::Seconds(15)), 0) << ReadAll(launcher_->log_path());
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid;
  EXPECT_THAT(ReadAll(launcher_->log_path()), HasSubstr("stopping 2 daemons"));
}

TEST_F(LaunchTest, ADaemonThatExitsStopsTheOthers) {
  StartLauncher("die_rank1", {"--max-restarts", "0"});
  const std::string log = WaitForReady();
  const std::vector<pid_t> pids = Pids(log);
  ASSERT_EQ(pids.size(), 2u) << log;
  dir_.Write("go", "");
  EXPECT_EQ(ExitCode(absl::Seconds(15)), 1);
  EXPECT_THAT(
      ReadAll(launcher_->log_path()),
      HasSubstr(absl::StrCat("tessera launch: error: rank 1 (pid ", pids[1],
                             ") exited with exit code 3; stopped the "
                             "others\n")));
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid;
}

TEST_F(LaunchTest, SigtermAfterTheStopTimeoutBecomesSigkill) {
  StartLauncher("stubborn", {"--stop-timeout", "0.5"});
  const std::vector<pid_t> pids = Pids(WaitForReady());
  ASSERT_EQ(pids.size(), 2u);
  const absl::Time start = absl::Now();
  launcher_->Signal(SIGTERM);
  EXPECT_EQ(ExitCode(absl::Seconds(15)), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(ReadAll(launcher_->log_path()),
              HasSubstr("did not stop in time; killing it"));
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid;
}

TEST_F(LaunchTest, ADaemonFailingAtStartUpFailsTheLaunch) {
  StartLauncher("fail_early");
  EXPECT_EQ(ExitCode(absl::Seconds(15)), 1);
  const std::string log = ReadAll(launcher_->log_path());
  EXPECT_THAT(log, HasSubstr("stand-in rank"));  // its stderr is shown
  EXPECT_THAT(log, ContainsRegex("tessera launch: error: rank [01] \\(pid "
                                 "[0-9]+\\) exited before serving with exit "
                                 "code 4"));
  EXPECT_THAT(log, Not(HasSubstr("ready")));
}

TEST_F(LaunchTest, ADaemonThatNeverServesTimesOut) {
  StartLauncher("never_serve", {"--start-timeout", "0.5"});
  EXPECT_EQ(ExitCode(absl::Seconds(15)), 1);
  EXPECT_THAT(ReadAll(launcher_->log_path()),
              HasSubstr("tessera launch: error: rank 0 did not serve within "
                        "500ms; stopped every daemon"));
}

TEST_F(LaunchTest, LogDirHoldsEachRanksOutput) {
  const std::string logs = dir_.File("logs");
  StartLauncher("fail_early", {"--log-dir", logs});
  EXPECT_EQ(ExitCode(absl::Seconds(15)), 1);
  const std::string log = ReadAll(launcher_->log_path());
  EXPECT_THAT(log, Not(HasSubstr("stand-in rank")));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("(its log: ", logs, "/rank")));
  EXPECT_THAT(ReadAll(absl::StrCat(logs, "/rank0.log")) +
                  ReadAll(absl::StrCat(logs, "/rank1.log")),
              HasSubstr("stand-in rank"));
}

}  // namespace
}  // namespace tessera::testing
