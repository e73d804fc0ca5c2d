// The `tessera` CLI end to end: the real binary against 4 real daemons
// (tests/testing/daemon_cluster.h), and `tessera launch` starting and
// stopping daemons itself.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/bench_command.h"
#include "client/client.h"
#include "client/npy.h"
#include "client/version_writer.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/subprocess.h"
#include "nlohmann/json.hpp"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/until_serving.h"

namespace tessera {
namespace {

using ::tessera::Subprocess;
using ::tessera::testing::DaemonCluster;
using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::IsOk;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Checks for a line read the whole log, not its last 4 KiB: a restarted
// daemon's startup lines (more of them under the sanitizers) can push a
// launcher's line out of a tail.
constexpr size_t kWholeLog = size_t{1} << 20;

struct CliResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `tessera args...` with TESSERA_ADDRESS=address, bounded by 60 s.
CliResult RunCli(
    const std::string& address, std::vector<std::string> args,
    const std::string& log_path,
    const std::vector<std::pair<std::string, std::string>>& env = {},
    const std::string& program = TESSERA_CLI_PATH) {
  SpawnOptions spawn;
  spawn.program = program;
  spawn.args = std::move(args);
  spawn.env = {{"TESSERA_ADDRESS", address}};
  spawn.env.insert(spawn.env.end(), env.begin(), env.end());
  spawn.unset_env = {"TESSERA_TLS_CA", "TESSERA_TLS_CERT", "TESSERA_TLS_KEY",
                     "TESSERA_TOKEN", "TESSERA_TOKEN_FILE"};
  spawn.log_path = log_path;
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(spawn);
  CliResult result;
  if (!process.ok()) return result;
  std::optional<int> status = process->WaitFor(absl::Seconds(60));
  if (status.has_value() && WIFEXITED(*status)) {
    result.exit_code = WEXITSTATUS(*status);
  }
  result.output = process->LogTail(1 << 20);
  return result;
}

class CliDaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto cluster = DaemonCluster::Start(
        ::tessera::testing::QuietClusterOptions(4, TESSERA_SERVER_PATH));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  CliResult Run(std::vector<std::string> args) {
    return RunCli(cluster_->address(0), std::move(args),
                  Path(absl::StrCat("cli", ++runs_, ".log")));
  }
  std::string Path(const std::string& name) const {
    return absl::StrCat(cluster_->scratch_dir(), "/", name);
  }

  static DaemonCluster* cluster_;
  int runs_ = 0;
};

DaemonCluster* CliDaemonTest::cluster_ = nullptr;

constexpr char kRows[] =
    "chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu";

TEST_F(CliDaemonTest, CreateDescribeWriteReadFetchRemove) {
  ASSERT_NE(cluster_, nullptr);
  CliResult created = Run({"create", "cli_t", "--size", "10,20", "--spec",
                           kRows, "--init", "zeros"});
  ASSERT_EQ(created.exit_code, 0) << created.output;

  CliResult listed = Run({"ls"});
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("cli_t"));

  CliResult described = Run({"describe", "cli_t"});
  ASSERT_EQ(described.exit_code, 0) << described.output;
  EXPECT_THAT(described.output, HasSubstr("rank:3/cpu"));
  EXPECT_THAT(described.output, HasSubstr(cluster_->address(3)));

  // Write 0..199 from a .npy file, fetch it whole, read a box.
  std::vector<float> values(200);
  std::iota(values.begin(), values.end(), 0.0f);
  Tensor iota = *Tensor::FromVector<float>(values, {10, 20});
  ASSERT_THAT(WriteNpy(Path("in.npy"), iota), IsOk());
  CliResult written =
      Run({"write", "cli_t", "--offsets", "0,0", "-i", Path("in.npy")});
  ASSERT_EQ(written.exit_code, 0) << written.output;

  CliResult fetched = Run({"fetch", "cli_t", "-o", Path("out.npy")});
  ASSERT_EQ(fetched.exit_code, 0) << fetched.output;
  ASSERT_OK_AND_ASSIGN(Tensor out, ReadNpy(Path("out.npy")));
  EXPECT_TRUE(Equal(out, iota));

  CliResult shard =
      Run({"fetch", "cli_t", "--shard", "2", "-o", Path("shard2.npy")});
  ASSERT_EQ(shard.exit_code, 0) << shard.output;
  ASSERT_OK_AND_ASSIGN(Tensor shard2, ReadNpy(Path("shard2.npy")));
  EXPECT_EQ(shard2.sizes(), (std::vector<int64_t>{3, 20}));
  EXPECT_EQ(shard2.data<float>()[0], 120.0f);

  CliResult box = Run({"read", "cli_t", "--offsets", "2,5", "--sizes", "6,10",
                       "-o", Path("box.npy")});
  ASSERT_EQ(box.exit_code, 0) << box.output;
  ASSERT_OK_AND_ASSIGN(Tensor region, ReadNpy(Path("box.npy")));
  ASSERT_EQ(region.sizes(), (std::vector<int64_t>{6, 10}));
  EXPECT_EQ(region.data<float>()[0], 45.0f);
  EXPECT_EQ(region.data<float>()[59], 7 * 20 + 14.0f);

  CliResult printed =
      Run({"read", "cli_t", "--offsets", "9,17", "--sizes", "1,3"});
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  EXPECT_THAT(printed.output, HasSubstr("197"));
  EXPECT_THAT(printed.output, HasSubstr("199"));

  // Save, remove, load back.
  CliResult saved = Run({"save", Path("ckpt"), "cli_t"});
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  CliResult removed = Run({"rm", "cli_t"});
  ASSERT_EQ(removed.exit_code, 0) << removed.output;
  EXPECT_THAT(Run({"ls"}).output, Not(HasSubstr("cli_t")));
  CliResult loaded = Run({"load", Path("ckpt")});
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;
  CliResult again = Run({"fetch", "cli_t", "-o", Path("again.npy")});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  ASSERT_OK_AND_ASSIGN(Tensor reloaded, ReadNpy(Path("again.npy")));
  EXPECT_TRUE(Equal(reloaded, iota));
  EXPECT_EQ(Run({"rm", "cli_t"}).exit_code, 0);
}

// -o is a path a user names: a device is written in place, never replaced
// (run as root, `fetch -o /dev/null` once renamed a regular file over
// /dev/null), a directory is refused before the transfer, a link is
// written through.
TEST_F(CliDaemonTest, OutputsAreWrittenAsAShellWouldTreatThePath) {
  ASSERT_NE(cluster_, nullptr);
  ASSERT_EQ(Run({"create", "cli_o", "--size", "4,4", "--spec", kRows, "--init",
                 "ones"})
                .exit_code,
            0);
  const auto is_device = [](const char* path) {
    struct stat entry;
    return ::lstat(path, &entry) == 0 && S_ISCHR(entry.st_mode);
  };
  ASSERT_TRUE(is_device("/dev/null"));
  CliResult to_null = Run({"fetch", "cli_o", "-o", "/dev/null"});
  EXPECT_EQ(to_null.exit_code, 0) << to_null.output;
  CliResult box_to_null = Run({"read", "cli_o", "--offsets", "0,0", "--sizes",
                               "2,2", "-o", "/dev/null"});
  EXPECT_EQ(box_to_null.exit_code, 0) << box_to_null.output;
  EXPECT_TRUE(is_device("/dev/null"));
  if (is_device("/dev/full")) {
    CliResult full = Run({"fetch", "cli_o", "-o", "/dev/full"});
    EXPECT_EQ(full.exit_code, 1);
    EXPECT_THAT(full.output, HasSubstr("No space left on device"));
    EXPECT_TRUE(is_device("/dev/full"));
  }

  const std::string dir = Path("outputs");
  std::filesystem::create_directory(dir);
  CliResult into_dir = Run({"fetch", "cli_o", "-o", dir});
  EXPECT_EQ(into_dir.exit_code, 2) << into_dir.output;
  EXPECT_THAT(into_dir.output, HasSubstr(dir + " is a directory"));
  EXPECT_TRUE(std::filesystem::is_empty(dir));

  std::filesystem::create_symlink("real.npy", dir + "/link.npy");
  CliResult through = Run({"fetch", "cli_o", "-o", dir + "/link.npy"});
  ASSERT_EQ(through.exit_code, 0) << through.output;
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link.npy"));
  ASSERT_OK_AND_ASSIGN(Tensor fetched, ReadNpy(dir + "/real.npy"));
  EXPECT_EQ(fetched.sizes(), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(Run({"rm", "cli_o"}).exit_code, 0);
}

TEST_F(CliDaemonTest, VersionsReadAndWatch) {
  ASSERT_NE(cluster_, nullptr);
  CliResult created = Run({"create", "cli_v", "--size", "8,4", "--spec", kRows,
                           "--init", "ones", "--versions", "2"});
  ASSERT_EQ(created.exit_code, 0) << created.output;
  CliResult described = Run({"describe", "cli_v"});
  EXPECT_THAT(described.output, HasSubstr("Versions: latest 1, kept 1"));
  // 8 x 4 float32: 128 bytes per version.
  EXPECT_THAT(described.output,
              HasSubstr("128 B per version, 128 B held by 1 version"));
  CliResult json = Run({"describe", "cli_v", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_THAT(
      json.output,
      HasSubstr("\"versions\":{\"latest\":1,\"keeps\":2,\"kept\":[1],"
                "\"pinned\":[],\"open\":[],\"bytes_per_version\":128}"));

  // `watch --after 1` runs while a writer publishes version 2 (as 3 in a
  // file): it reports 2 whether its stream opened before the publish or
  // after it (a loaded machine can start the CLI late).
  SpawnOptions spawn;
  spawn.program = TESSERA_CLI_PATH;
  spawn.args = {"watch",   "cli_v", "--after",        "1",
                "--count", "1",     "--idle-timeout", "30"};
  spawn.env = {{"TESSERA_ADDRESS", cluster_->address(1)}};
  spawn.log_path = Path("watch.log");
  ASSERT_OK_AND_ASSIGN(Subprocess watch, Subprocess::Spawn(spawn));
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                       Client::Connect(cluster_->address(0)));
  ASSERT_OK_AND_ASSIGN(VersionWriter writer, client->Begin({"cli_v"}));
  ASSERT_OK_AND_ASSIGN(Tensor threes, Tensor::Full({8, 4}, 3.0));
  ASSERT_THAT(writer.view("cli_v")->Write({0, 0}, threes), IsOk());
  ASSERT_THAT(writer.Publish().status(), IsOk());
  const std::optional<int> status = watch.WaitFor(absl::Seconds(30));
  ASSERT_TRUE(status.has_value() && WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0) << watch.LogTail(4096);
  EXPECT_EQ(watch.LogTail(4096), "2\n");

  CliResult versions = Run({"versions", "cli_v"});
  ASSERT_EQ(versions.exit_code, 0) << versions.output;
  EXPECT_THAT(versions.output,
              HasSubstr("cli_v: Versions: latest 2, kept 1, 2 (keeps 2)"));
  EXPECT_THAT(versions.output,
              HasSubstr("128 B per version, 256 B held by 2 versions"));
  CliResult old = Run({"read", "cli_v", "--offsets", "0,0", "--sizes", "1,4",
                       "--version", "1"});
  ASSERT_EQ(old.exit_code, 0) << old.output;
  EXPECT_THAT(old.output, HasSubstr("[[1, 1, 1, 1]]"));
  CliResult latest =
      Run({"read", "cli_v", "--offsets", "0,0", "--sizes", "1,4"});
  EXPECT_THAT(latest.output, HasSubstr("[[3, 3, 3, 3]]"));
  // A write to a published version is refused, naming why.
  ASSERT_THAT(WriteNpy(Path("v.npy"), threes), IsOk());
  CliResult written =
      Run({"write", "cli_v", "--offsets", "0,0", "-i", Path("v.npy")});
  EXPECT_NE(written.exit_code, 0);
  EXPECT_THAT(written.output, HasSubstr("read-only"));
  // An unversioned tensor has no versions: a usage error.
  ASSERT_EQ(Run({"create", "cli_nv", "--size", "4", "--spec",
                 "chunk:dim=0:rank:0/cpu"})
                .exit_code,
            0);
  EXPECT_EQ(Run({"versions", "cli_nv"}).exit_code, 2);
  EXPECT_EQ(Run({"watch", "cli_nv", "--idle-timeout", "1"}).exit_code, 2);
  EXPECT_EQ(Run({"watch", "cli_v", "--after", "0"}).exit_code, 2);
}

// `tessera bench` against real daemons: a table per daemon, a JSON
// document whose fit agrees with its own points, the scratch tensors gone
// afterwards, and usage errors refused before anything is made.
TEST_F(CliDaemonTest, BenchMeasuresEachTransportAndCleansUp) {
  ASSERT_NE(cluster_, nullptr);
  CliResult json = Run({"bench", "--rank", "1", "--sizes", "4KiB,64KiB,1MiB",
                        "--lanes", "1,2", "--reps", "3", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const nlohmann::json shown =
      nlohmann::json::parse(json.output, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(shown.is_discarded()) << json.output;
  ASSERT_EQ(shown["daemons"].size(), 1u);
  const nlohmann::json& daemon = shown["daemons"][0];
  EXPECT_EQ(daemon["rank"], 1);
  std::set<std::string> seen;
  for (const nlohmann::json& row : daemon["rows"]) {
    seen.insert(absl::StrCat(row["transport"].get<std::string>(), "/",
                             row["lanes"].get<int>(), "/",
                             row["op"].get<std::string>()));
    ASSERT_EQ(row["points"].size(), 3u);
    for (const nlohmann::json& point : row["points"]) {
      EXPECT_GT(point["p50_s"].get<double>(), 0);
    }
    // The fit printed is the fit of the points printed (how well it
    // explains them depends on the machine's noise: FitTwoTerms' own
    // tests in cli_unit_test check that on known data).
    std::vector<int64_t> bytes;
    std::vector<double> seconds;
    for (const nlohmann::json& point : row["points"]) {
      bytes.push_back(point["bytes"].get<int64_t>());
      seconds.push_back(point["p50_s"].get<double>());
    }
    const cli::TwoTermFit fit = cli::FitTwoTerms(bytes, seconds);
    EXPECT_NEAR(row["per_op_us"].get<double>(), fit.per_op_seconds * 1e6,
                1e-6 * std::max(1.0, std::abs(fit.per_op_seconds * 1e6)))
        << row.dump();
    EXPECT_NEAR(row["gbs"].get<double>(), fit.bytes_per_second / 1e9,
                1e-6 * std::max(1.0, std::abs(fit.bytes_per_second / 1e9)))
        << row.dump();
  }
  for (const char* expected : {"data_plane/1/read", "data_plane/2/write",
                               "grpc/0/read", "local_path/0/write"}) {
    EXPECT_TRUE(seen.count(expected)) << expected << ": " << json.output;
  }
  EXPECT_THAT(Run({"ls"}).output, Not(HasSubstr("tessera_bench")));
  // The table form names each size and the fit's columns.
  CliResult table = Run({"bench", "--rank", "0", "--sizes", "4KiB,8KiB",
                         "--lanes", "1", "--reps", "2"});
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, HasSubstr("rank 0 at "));
  EXPECT_THAT(table.output, HasSubstr("PER-OP"));
  EXPECT_THAT(table.output, HasSubstr("8.00 KiB"));
  // Usage errors: exit 2, nothing created.
  EXPECT_EQ(Run({"bench", "--rank", "9"}).exit_code, 2);
  EXPECT_EQ(Run({"bench", "--lanes", "0"}).exit_code, 2);
  EXPECT_EQ(Run({"bench", "--sizes", "lots"}).exit_code, 2);
  EXPECT_THAT(Run({"ls"}).output, Not(HasSubstr("tessera_bench")));
}

TEST_F(CliDaemonTest, ErrorsAndExitCodes) {
  ASSERT_NE(cluster_, nullptr);
  CliResult health = Run({"health"});
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_THAT(health.output, HasSubstr("SERVING"));

  // An unknown tensor is a failure (1), with one line naming it.
  CliResult unknown = Run({"describe", "no_such_tensor"});
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("no_such_tensor"));
  EXPECT_EQ(std::count(unknown.output.begin(), unknown.output.end(), '\n'), 1)
      << unknown.output;

  // Usage errors (2): a bad spec, a bad size, a missing flag.
  EXPECT_EQ(
      Run({"create", "x", "--size", "4,4", "--spec", "chunk:dim=0:"}).exit_code,
      2);
  EXPECT_EQ(Run({"create", "x", "--size", "4,a", "--spec", kRows}).exit_code,
            2);
  EXPECT_EQ(Run({"read", "x", "--offsets", "0"}).exit_code, 2);
  // A region outside the tensor is the user's mistake too.
  ASSERT_EQ(
      Run({"create", "cli_small", "--size", "4,4", "--spec", kRows}).exit_code,
      0);
  CliResult outside =
      Run({"read", "cli_small", "--offsets", "3,0", "--sizes", "2,4"});
  EXPECT_EQ(outside.exit_code, 2) << outside.output;
  EXPECT_EQ(Run({"rm", "cli_small"}).exit_code, 0);

  // Nothing listening: a failure within the timeout.
  auto port = testing::PickFreePort();
  ASSERT_TRUE(port.ok());
  const absl::Time start = absl::Now();
  CliResult dead = RunCli(absl::StrCat("127.0.0.1:", *port),
                          {"ls", "--timeout", "3"}, Path("dead.log"));
  EXPECT_EQ(dead.exit_code, 1) << dead.output;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

// `rm` of several names deletes them in one logged call; when one of them
// does not exist, the others are still deleted and the missing one named.
TEST_F(CliDaemonTest, RmOfSeveralNames) {
  ASSERT_NE(cluster_, nullptr);
  for (const char* name : {"rm_a", "rm_b", "rm_c", "rm_d"}) {
    ASSERT_EQ(Run({"create", name, "--size", "4,4", "--spec", kRows}).exit_code,
              0);
  }
  CliResult together = Run({"rm", "rm_a", "rm_b"});
  EXPECT_EQ(together.exit_code, 0) << together.output;
  EXPECT_THAT(together.output, HasSubstr("deleted rm_a\ndeleted rm_b"));
  CliResult missing = Run({"rm", "rm_c", "rm_nope", "rm_d"});
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("deleted rm_c"));
  EXPECT_THAT(missing.output, HasSubstr("rm_nope"));
  EXPECT_THAT(missing.output, HasSubstr("deleted rm_d"));
  EXPECT_THAT(Run({"ls"}).output, Not(HasSubstr("rm_")));
  EXPECT_EQ(Run({"rm", "-f", "rm_a", "rm_nope"}).exit_code, 0);
}

// --request-id is the operations' idempotency key, and `tessera op` tells
// what became of one.
TEST_F(CliDaemonTest, RequestIdsAreIdempotencyKeysAndOpTellsTheirOutcome) {
  ASSERT_NE(cluster_, nullptr);
  const std::vector<std::string> create = {
      "create", "cli_idem", "--size",       "4,4",
      "--spec", kRows,      "--request-id", "cli-idem-1"};
  CliResult first = Run(create);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  CliResult again = Run(create);  // Not ALREADY_EXISTS: the first outcome.
  EXPECT_EQ(again.exit_code, 0) << again.output;

  CliResult committed = Run({"op", "cli-idem-1"});
  EXPECT_EQ(committed.exit_code, 0) << committed.output;
  EXPECT_THAT(committed.output,
              HasSubstr("request cli-idem-1: committed (CreateTensor "
                        "'cli_idem', log entry "));
  CliResult json = Run({"op", "cli-idem-1", "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_THAT(json.output, HasSubstr("\"state\":\"committed\""));

  // A new id for the same name fails, changes nothing, and says so.
  CliResult taken = Run({"create", "cli_idem", "--size", "4,4", "--spec", kRows,
                         "--request-id", "cli-idem-2"});
  EXPECT_EQ(taken.exit_code, 1) << taken.output;
  CliResult failed = Run({"op", "cli-idem-2"});
  EXPECT_EQ(failed.exit_code, 3) << failed.output;
  EXPECT_THAT(failed.output,
              AllOf(HasSubstr("failed"), HasSubstr("ALREADY_EXISTS"),
                    HasSubstr("it changed nothing")));
  CliResult unknown = Run({"op", "cli-never-sent"});
  EXPECT_EQ(unknown.exit_code, 5) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("unknown"));
  EXPECT_EQ(Run({"op", "not an id"}).exit_code, 2);
  EXPECT_EQ(Run({"rm", "cli_idem"}).exit_code, 0);
}

// A failed operation is exit 1 even when the daemons call it a failed
// precondition: after a peer died the group is broken, and every later op
// says so (FAILED_PRECONDITION); that is the cluster's state, not a usage
// error (issue 14).
TEST(CliFailureTest, ABrokenGroupIsAFailureNotAUsageError) {
  DaemonClusterOptions options;
  options.world_size = 2;
  options.server_path = TESSERA_SERVER_PATH;
  options.extra_args = {"--timeout", "3", "--log-level", "warn"};
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(options));
  ASSERT_EQ(kill(cluster->daemon(1).pid(), SIGKILL), 0);
  cluster->daemon(1).WaitFor(absl::Seconds(10));
  const std::string spec = "chunk:dim=0:rank:0/cpu,rank:1/cpu";
  std::vector<CliResult> results;
  for (int i = 0; i < 3; ++i) {
    results.push_back(RunCli(
        cluster->address(0),
        {"create", absl::StrCat("t", i), "--size", "4,4", "--spec", spec},
        absl::StrCat(cluster->scratch_dir(), "/create", i, ".log")));
  }
  bool saw_precondition = false;
  for (const CliResult& result : results) {
    EXPECT_EQ(result.exit_code, 1) << result.output;
    saw_precondition |= absl::StrContains(result.output, "broken") ||
                        absl::StrContains(result.output, "shut down");
  }
  EXPECT_TRUE(saw_precondition) << results.back().output;
}

// The launcher's whole log once `done(log)` holds, the launcher exited or
// `timeout` passed (then the log as it was): callers check the log for
// what they waited for.
std::string WaitForLog(Subprocess& launcher, absl::Duration timeout,
                       const std::function<bool(const std::string&)>& done) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string log = launcher.LogTail(kWholeLog);
  while (!done(log) && absl::Now() < deadline &&
         !launcher.WaitFor(absl::ZeroDuration()).has_value()) {
    absl::SleepFor(absl::Milliseconds(50));
    log = launcher.LogTail(kWholeLog);
  }
  return log;
}

// The address of the "ready: export TESSERA_ADDRESS=HOST:PORT" line once
// the launcher printed it; "" when the launcher exited or `timeout` passed.
std::string WaitForReady(Subprocess& launcher, absl::Duration timeout) {
  constexpr absl::string_view kReady = "ready: export TESSERA_ADDRESS=";
  std::string address;
  WaitForLog(launcher, timeout, [&](const std::string& text) {
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::ConsumePrefix(&line, kReady)) {
        address = std::string(line);
        return true;
      }
    }
    return false;
  });
  return address;
}

// Waits up to 30 s for `launcher` to exit, expecting exit code `code`
// (else quoting its wait status and log).
void ExpectExitsWith(Subprocess& launcher, int code) {
  std::optional<int> status = launcher.WaitFor(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << launcher.LogTail();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == code)
      << DescribeWaitStatus(*status) << "\n"
      << launcher.LogTail();
}

struct Launched {
  std::unique_ptr<Subprocess> launcher;
  std::string dir;
};

// `env`: variables set for the launcher (e.g. TMPDIR, its private
// directory's parent).
Launched Launch(
    int nproc, const std::vector<std::string>& more = {},
    const std::vector<std::pair<std::string, std::string>>& env = {}) {
  Launched launched;
  char dir[] = "/tmp/tessera-launch-XXXXXX";
  if (mkdtemp(dir) == nullptr) return launched;
  launched.dir = dir;
  const int master = *testing::PickFreePort();
  SpawnOptions spawn;
  spawn.program = TESSERA_CLI_PATH;
  spawn.args = {"launch", "--nproc", absl::StrCat(nproc), "--cpu", "--host",
                "127.0.0.1", "--master-port", absl::StrCat(master),
                // Every daemon binds a free port: a picked base port says
                // nothing about base + 1, which another test may hold.
                "--base-port", "0", "--server", TESSERA_SERVER_PATH,
                "--checkpoint-root", launched.dir};
  spawn.args.insert(spawn.args.end(), more.begin(), more.end());
  spawn.log_path = absl::StrCat(launched.dir, "/launch.log");
  spawn.env = env;
  spawn.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                     "MASTER_PORT"};
  auto process = Subprocess::Spawn(spawn);
  if (!process.ok()) return launched;
  launched.launcher = std::make_unique<Subprocess>(*std::move(process));
  return launched;
}

TEST(CliLaunchTest, LaunchServesAndStopsOnSigint) {
  Launched launched = Launch(2);
  ASSERT_NE(launched.launcher, nullptr);
  const std::string address =
      WaitForReady(*launched.launcher, absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << launched.launcher->LogTail();
  const std::string log = launched.launcher->LogTail(kWholeLog);
  EXPECT_THAT(log, HasSubstr("rank 0: " + address));
  EXPECT_THAT(log, HasSubstr("rank 1: "));

  CliResult health = RunCli(address, {"health"}, launched.dir + "/health.log");
  EXPECT_EQ(health.exit_code, 0) << health.output;

  launched.launcher->Signal(SIGINT);
  ASSERT_NO_FATAL_FAILURE(ExpectExitsWith(*launched.launcher, 0));
  CliResult after = RunCli(address, {"health", "--timeout", "2"},
                           launched.dir + "/after.log");
  EXPECT_EQ(after.exit_code, 1) << after.output;
}

TEST(CliLaunchTest, LaunchStopsAllWhenOneDaemonDies) {
  Launched launched = Launch(2, {"--max-restarts", "0"});
  ASSERT_NE(launched.launcher, nullptr);
  const std::string address =
      WaitForReady(*launched.launcher, absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << launched.launcher->LogTail();
  // "rank 1: HOST:PORT (pid P)": kill that daemon.
  const std::string log = launched.launcher->LogTail(kWholeLog);
  const size_t at = log.find("rank 1: ");
  ASSERT_NE(at, std::string::npos) << log;
  const size_t pid_at = log.find("(pid ", at);
  ASSERT_NE(pid_at, std::string::npos) << log;
  const pid_t pid = std::stoi(log.substr(pid_at + 5));
  ASSERT_EQ(kill(pid, SIGKILL), 0);

  ASSERT_NO_FATAL_FAILURE(ExpectExitsWith(*launched.launcher, 1));
  EXPECT_THAT(
      launched.launcher->LogTail(kWholeLog),
      HasSubstr(absl::StrCat("rank 1 (pid ", pid, ") exited with signal 9")));
  CliResult after = RunCli(address, {"health", "--timeout", "2"},
                           launched.dir + "/after.log");
  EXPECT_EQ(after.exit_code, 1) << after.output;
}

// The pid on the last "rank R: HOST:PORT (pid P...)" line of `log`; -1 when
// there is none.
// The start of the last line of `log` that begins "rank R: ".
size_t LastRankLine(const std::string& log, int rank) {
  const std::string line = absl::StrCat("rank ", rank, ": ");
  const size_t at = log.rfind(absl::StrCat("\n", line));
  if (at != std::string::npos) return at + 1;
  return absl::StartsWith(log, line) ? 0 : std::string::npos;
}

pid_t LastPidOf(const std::string& log, int rank) {
  const size_t at = LastRankLine(log, rank);
  if (at == std::string::npos) return -1;
  const size_t pid_at = log.find("(pid ", at);
  if (pid_at == std::string::npos) return -1;
  return std::stoi(log.substr(pid_at + 5));
}

// The HOST:PORT on the last "rank R: HOST:PORT (pid P...)" line of `log`;
// empty when there is none.
std::string RankAddressOf(const std::string& log, int rank) {
  const size_t at = LastRankLine(log, rank);
  if (at == std::string::npos) return "";
  const size_t start = log.find(": ", at) + 2;
  return log.substr(start, log.find(' ', start) - start);
}

// SIGKILLs rank `rank`'s daemon of the launch (--max-restarts
// `max_restarts`), then runs a create through `address` until one works
// (the cluster serves again with the daemon restarted) or 30 s pass, and
// waits (30 s at most) for the launcher's line naming the new daemon: the
// cluster can serve before the launcher has seen the new daemon's address
// file. The killed pid.
pid_t KillAndCreateUntilServing(Launched& launched, int rank,
                                const std::string& address,
                                int max_restarts = 1) {
  const pid_t pid = LastPidOf(launched.launcher->LogTail(kWholeLog), rank);
  EXPECT_GT(pid, 0) << launched.launcher->LogTail();
  if (pid <= 0 || kill(pid, SIGKILL) != 0) return pid;
  const absl::Time killed = absl::Now();
  const absl::Status created = testing::UntilServing(
      [&]() -> absl::Status {
        const CliResult run = RunCli(address,
                                     {"create", "t", "--size", "4,4", "--spec",
                                      "chunk:dim=0:rank:0/cpu,rank:1/cpu"},
                                     launched.dir + "/create.log");
        if (run.exit_code == 0) return absl::OkStatus();
        if (absl::StrContains(run.output, "ALREADY_EXISTS")) {
          return absl::AlreadyExistsError(run.output);
        }
        return absl::UnknownError(run.output);
      },
      killed, absl::Seconds(30));
  const std::string log = WaitForLog(*launched.launcher, absl::Seconds(30),
                                     [&](const std::string& text) {
                                       const pid_t now = LastPidOf(text, rank);
                                       return now > 0 && now != pid;
                                     });
  EXPECT_OK(created) << log;
  EXPECT_THAT(log, HasSubstr(absl::StrCat(
                       "rank ", rank, " (pid ", pid,
                       ") exited with signal 9 (Killed); restarting it (1 of ",
                       max_restarts, ")")));
  return pid;
}

// `tessera launch --max-restarts 1`: a killed daemon is started again and
// rejoins the running cluster (no other daemon restarts); killed once more,
// the launch ends naming it.
TEST(CliLaunchTest, MaxRestartsStartsAKilledDaemonAgain) {
  Launched launched = Launch(2, {"--max-restarts", "1"});
  ASSERT_NE(launched.launcher, nullptr);
  const std::string address =
      WaitForReady(*launched.launcher, absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << launched.launcher->LogTail();
  const pid_t rank0 = LastPidOf(launched.launcher->LogTail(kWholeLog), 0);
  const pid_t first = KillAndCreateUntilServing(launched, 1, address);
  const std::string log = launched.launcher->LogTail(kWholeLog);
  EXPECT_THAT(log, HasSubstr("restarted)"));
  const pid_t second = LastPidOf(log, 1);
  EXPECT_NE(second, first);
  EXPECT_EQ(LastPidOf(log, 0), rank0);  // rank 0 kept running
  CliResult health = RunCli(address, {"health"}, launched.dir + "/health.log");
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_THAT(health.output, HasSubstr("generation 2"));

  // The second death is past --max-restarts.
  ASSERT_EQ(kill(second, SIGKILL), 0);
  ASSERT_NO_FATAL_FAILURE(ExpectExitsWith(*launched.launcher, 1));
  EXPECT_THAT(launched.launcher->LogTail(kWholeLog),
              HasSubstr("after 1 restarts (--max-restarts)"));
}

// With the store in etcd (`--store`), `--max-restarts` restarts rank 0
// too, and the cluster keeps its names.
TEST(CliLaunchTest, WithEtcdMaxRestartsRestartsRankZero) {
  absl::StatusOr<std::unique_ptr<testing::EtcdCluster>> etcd =
      testing::EtcdCluster::Start(1);
  ASSERT_OK(etcd.status());
  Launched launched =
      Launch(2, {"--max-restarts", "1", "--store", (*etcd)->Url("cli")});
  ASSERT_NE(launched.launcher, nullptr);
  const std::string address =
      WaitForReady(*launched.launcher, absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << launched.launcher->LogTail();
  const pid_t rank1 = LastPidOf(launched.launcher->LogTail(kWholeLog), 1);
  const std::string address1 =
      RankAddressOf(launched.launcher->LogTail(kWholeLog), 1);
  CliResult created = RunCli(
      address1,
      {"create", "kept", "--size", "4,4", "--spec", "chunk:dim=0:rank:1/cpu"},
      launched.dir + "/kept.log");
  ASSERT_EQ(created.exit_code, 0) << created.output;
  const pid_t first = KillAndCreateUntilServing(launched, 0, address1);
  const std::string log = launched.launcher->LogTail(kWholeLog);
  EXPECT_NE(LastPidOf(log, 0), first) << log;
  EXPECT_GT(LastPidOf(log, 0), 0) << log;
  EXPECT_EQ(LastPidOf(log, 1), rank1) << log;  // kept running
  CliResult listed = RunCli(address1, {"ls"}, launched.dir + "/ls.log");
  EXPECT_THAT(listed.output, AllOf(HasSubstr("kept"), HasSubstr("t ")));
}

// Issue 18 against 4 launched daemons: launch prints each one's metrics
// endpoint; `tessera top --once --json` shows every daemon and the bytes
// a read moved; with --log-format json every log line parses, and one
// grep of the request id finds the same op on every daemon.
TEST(CliLaunchTest, TopAndJsonLogsFollowTrafficOnFourDaemons) {
  char logs[] = "/tmp/tessera-logs-XXXXXX";
  ASSERT_NE(mkdtemp(logs), nullptr);
  Launched launched =
      Launch(4, {"--log-dir", logs, "--", "--log-format", "json"});
  ASSERT_NE(launched.launcher, nullptr);
  const std::string address =
      WaitForReady(*launched.launcher, absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << launched.launcher->LogTail();
  const std::string launch_log = launched.launcher->LogTail(kWholeLog);
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(launch_log, HasSubstr(absl::StrCat("rank ", r, ": ")));
  }
  const std::vector<std::string> parts =
      absl::StrSplit(launch_log, "metrics http://127.0.0.1:");
  EXPECT_EQ(parts.size(), 5u) << launch_log;

  const std::string dir = launched.dir;
  CliResult created =
      RunCli(address,
             {"create", "seen", "--size", "64,256", "--spec",
              "chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu",
              "--init", "ones", "--request-id", "trace-me.1"},
             dir + "/create.log");
  ASSERT_EQ(created.exit_code, 0) << created.output;

  // A read during top's interval: 64 KiB, 16 KiB from each daemon.
  std::thread reader([&] {
    absl::SleepFor(absl::Milliseconds(300));
    RunCli(address, {"fetch", "seen", "-o", dir + "/seen.npy"},
           dir + "/fetch.log");
  });
  CliResult top =
      RunCli(address, {"top", "--once", "--json", "--interval", "4"},
             dir + "/top.log");
  reader.join();
  ASSERT_EQ(top.exit_code, 0) << top.output;
  const nlohmann::json shown =
      nlohmann::json::parse(top.output, nullptr,
                            /*allow_exceptions=*/false);
  ASSERT_FALSE(shown.is_discarded()) << top.output;
  ASSERT_EQ(shown["daemons"].size(), 4u) << top.output;
  double read_bytes = 0;
  for (int r = 0; r < 4; ++r) {
    const nlohmann::json& daemon = shown["daemons"][r];
    EXPECT_EQ(daemon["rank"], r);
    EXPECT_EQ(daemon["state"], "serving");
    EXPECT_EQ(daemon["tensors"], 1);
    EXPECT_EQ(daemon["bytes_held"], 16 * 256 * 4);
    EXPECT_EQ(daemon["errors"]["total"], 0);
    for (const auto& [transport, rate] :
         daemon["read_bytes_per_second"].items()) {
      read_bytes +=
          rate.get<double>() * shown["interval_seconds"].get<double>();
    }
  }
  EXPECT_NEAR(read_bytes, 64 * 256 * 4, 1) << top.output;

  // The text view: a header and one line per daemon.
  CliResult table = RunCli(address, {"top", "--once", "--interval", "0.2"},
                           dir + "/table.log");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, AllOf(HasSubstr("RANK"), HasSubstr("FETCH p50"),
                                  HasSubstr("serving")));
  // Frames into a file (not a terminal) follow each other without the
  // escape codes that clear a screen.
  CliResult frames =
      RunCli(address, {"top", "--iterations", "2", "--interval", "0.1"},
             dir + "/frames.log");
  ASSERT_EQ(frames.exit_code, 0) << frames.output;
  EXPECT_THAT(frames.output, Not(HasSubstr("\x1b[")));
  EXPECT_EQ(
      std::vector<std::string>(absl::StrSplit(frames.output, "tessera top:"))
          .size(),
      3u)
      << frames.output;

  // Every daemon logged the create as one op with the client's id.
  std::set<int64_t> ops;
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(absl::StrCat(logs, "/rank", r, ".log"));
    int lines = 0;
    bool found = false;
    for (std::string line; std::getline(in, line);) {
      ++lines;
      const nlohmann::json entry =
          nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(entry.is_discarded()) << "rank " << r << ": " << line;
      EXPECT_EQ(entry["rank"], r) << line;
      for (const char* field : {"time", "level", "generation", "message"}) {
        EXPECT_TRUE(entry.contains(field)) << line;
      }
      if (entry.value("request", "") == "trace-me.1") {
        found = true;
        EXPECT_EQ(entry["tensor"], "seen") << line;
        ops.insert(entry["op"].get<int64_t>());
      }
    }
    EXPECT_GT(lines, 0) << "rank " << r;
    EXPECT_TRUE(found) << "rank " << r << " never logged the request";
  }
  EXPECT_EQ(ops.size(), 1u);

  launched.launcher->Signal(SIGINT);
  EXPECT_TRUE(launched.launcher->WaitFor(absl::Seconds(30)).has_value());
  std::filesystem::remove_all(logs);
}

// `tessera launch --secure` with 4 daemons: mutual TLS and tokens from a
// throwaway CA; the ready line's variables make a client that runs the
// demo end to end, the same files given as --tls-ca, --tls-cert,
// --tls-key and --token-file make one too (winning over wrong variables),
// and a client without them is refused in one clear line. Stopping removes
// the keys.
TEST(CliLaunchTest, SecureLaunchRunsTheDemoAndRefusesStrangers) {
  Launched launched = Launch(4, {"--secure"});
  ASSERT_NE(launched.launcher, nullptr);
  const std::string ready = WaitForReady(*launched.launcher, absl::Seconds(60));
  ASSERT_FALSE(ready.empty()) << launched.launcher->LogTail();
  // "HOST:PORT NAME=VALUE...".
  std::vector<std::string> words = absl::StrSplit(ready, ' ');
  const std::string address = words[0];
  std::vector<std::pair<std::string, std::string>> env;
  for (size_t i = 1; i < words.size(); ++i) {
    std::vector<std::string> pair =
        absl::StrSplit(words[i], absl::MaxSplits('=', 1));
    ASSERT_EQ(pair.size(), 2u) << ready;
    env.emplace_back(pair[0], pair[1]);
  }
  ASSERT_EQ(env.size(), 4u) << ready;
  const std::string dir = launched.dir;

  CliResult demo = RunCli(address, {"--checkpoint", "demo"}, dir + "/demo.log",
                          env, TESSERA_DEMO_PATH);
  EXPECT_EQ(demo.exit_code, 0) << demo.output;
  CliResult health = RunCli(address, {"health"}, dir + "/health.log", env);
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_EQ(std::count(health.output.begin(), health.output.end(), '\n'), 4)
      << health.output;

  // The same credentials as flags, with no variable set.
  std::map<std::string, std::string> files(env.begin(), env.end());
  const std::vector<std::string> flags = {
      "--tls-ca",     files["TESSERA_TLS_CA"],
      "--tls-cert",   files["TESSERA_TLS_CERT"],
      "--tls-key",    files["TESSERA_TLS_KEY"],
      "--token-file", files["TESSERA_TOKEN_FILE"]};
  auto with_flags = [&](std::vector<std::string> args) {
    args.insert(args.end(), flags.begin(), flags.end());
    return args;
  };
  CliResult created = RunCli(
      address,
      with_flags({"create", "flagged", "--size", "8,4", "--spec",
                  "chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu",
                  "--init", "ones"}),
      dir + "/create.log");
  ASSERT_EQ(created.exit_code, 0) << created.output;
  CliResult flagged_health =
      RunCli(address, with_flags({"health"}), dir + "/flagged_health.log");
  EXPECT_EQ(flagged_health.exit_code, 0) << flagged_health.output;
  // Each flag wins over its variable, here all wrong: a certificate that
  // signed nothing as the CA, another cluster's token (and file).
  const std::string wrong_token = dir + "/wrong.token";
  {
    std::ofstream out(wrong_token);
    out << "0123456789abcdef-not-this-clusters\n";
  }
  std::vector<std::pair<std::string, std::string>> wrong = {
      {"TESSERA_TLS_CA", files["TESSERA_TLS_CERT"]},
      {"TESSERA_TLS_CERT", files["TESSERA_TLS_CA"]},
      {"TESSERA_TLS_KEY", files["TESSERA_TLS_KEY"]},
      {"TESSERA_TOKEN", "0123456789abcdef-not-this-clusters"},
      {"TESSERA_TOKEN_FILE", wrong_token}};
  CliResult fetched =
      RunCli(address, with_flags({"fetch", "flagged", "-o", dir + "/f.npy"}),
             dir + "/fetch.log", wrong);
  ASSERT_EQ(fetched.exit_code, 0) << fetched.output;
  ASSERT_OK_AND_ASSIGN(Tensor ones, ReadNpy(dir + "/f.npy"));
  EXPECT_EQ(ones.sizes(), (std::vector<int64_t>{8, 4}));
  // And a wrong flag is not rescued by right variables.
  CliResult wrong_flag =
      RunCli(address, {"ls", "--timeout", "5", "--token-file", wrong_token},
             dir + "/wrong_flag.log", env);
  EXPECT_EQ(wrong_flag.exit_code, 1) << wrong_flag.output;
  EXPECT_THAT(wrong_flag.output, HasSubstr("unauthenticated: "));
  CliResult listed = RunCli(address, with_flags({"ls"}), dir + "/ls.log");
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("flagged"));

  // No credentials: the TLS handshake fails, and the line says what to set.
  CliResult stranger =
      RunCli(address, {"ls", "--timeout", "5"}, dir + "/stranger.log");
  EXPECT_EQ(stranger.exit_code, 1) << stranger.output;
  EXPECT_THAT(stranger.output, HasSubstr("TESSERA_TLS_CA"));
  EXPECT_THAT(stranger.output, HasSubstr("--tls-ca"));
  // The certificate without a token: unauthenticated, in one line (the
  // client sends this user's own token to loopback, which a --secure
  // cluster does not know), saying what to set.
  std::vector<std::pair<std::string, std::string>> no_token(env.begin(),
                                                            env.end() - 1);
  CliResult tokenless = RunCli(address, {"ls", "--timeout", "5"},
                               dir + "/tokenless.log", no_token);
  EXPECT_EQ(tokenless.exit_code, 1) << tokenless.output;
  EXPECT_THAT(tokenless.output, HasSubstr("unauthenticated: "));
  EXPECT_THAT(tokenless.output, HasSubstr("TESSERA_TOKEN"));
  EXPECT_THAT(tokenless.output, HasSubstr("--token-file"));
  EXPECT_EQ(std::count(tokenless.output.begin(), tokenless.output.end(), '\n'),
            1)
      << tokenless.output;

  launched.launcher->Signal(SIGINT);
  std::optional<int> status = launched.launcher->WaitFor(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << launched.launcher->LogTail();
  // The CA, keys and tokens went with the launch.
  EXPECT_FALSE(std::filesystem::exists(env[0].second)) << env[0].second;
}

// The pid on the launcher's "store: etcd (local member, pid P, ...)" line;
// -1 without one.
pid_t LocalEtcdPid(const std::string& log) {
  const std::string line = "store: etcd (local member, pid ";
  const size_t at = log.find(line);
  if (at == std::string::npos) return -1;
  return std::stoi(log.substr(at + line.size()));
}

bool Gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

// Issue: rank 0 is not special by default. `tessera launch` with no store
// flag runs a local etcd member (mutual TLS) as the store, so a SIGKILLed
// rank 0 is restarted like any other rank (--max-restarts defaults to 3):
// the cluster serves again, keeps its tensors and creates new ones. Ctrl-C
// then stops the daemons and etcd and leaves no private directory behind.
TEST(CliLaunchTest, WithNoStoreFlagRankZeroIsRestartedLikeAnyOther) {
  char tmp[] = "/tmp/tessera-launch-tmp-XXXXXX";
  ASSERT_NE(mkdtemp(tmp), nullptr);
  Launched launched = Launch(4, {}, {{"TMPDIR", tmp}});
  ASSERT_NE(launched.launcher, nullptr);
  const std::string address =
      WaitForReady(*launched.launcher, absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << launched.launcher->LogTail();
  std::string log = launched.launcher->LogTail(kWholeLog);
  const pid_t etcd = LocalEtcdPid(log);
  ASSERT_GT(etcd, 0) << log;
  EXPECT_THAT(log, HasSubstr("mutual TLS)"));
  const std::string address1 = RankAddressOf(log, 1);

  // A tensor on ranks 1..3, written, outlives rank 0.
  std::vector<float> values(24);
  std::iota(values.begin(), values.end(), 0.0f);
  Tensor iota = *Tensor::FromVector<float>(values, {6, 4});
  const std::string in = launched.dir + "/in.npy";
  ASSERT_THAT(WriteNpy(in, iota), IsOk());
  CliResult created = RunCli(address,
                             {"create", "kept", "--size", "6,4", "--spec",
                              "chunk:dim=0:rank:1/cpu,rank:2/cpu,rank:3/cpu"},
                             launched.dir + "/kept.log");
  ASSERT_EQ(created.exit_code, 0) << created.output;
  CliResult written =
      RunCli(address, {"write", "kept", "--offsets", "0,0", "-i", in},
             launched.dir + "/write.log");
  ASSERT_EQ(written.exit_code, 0) << written.output;

  const pid_t first = KillAndCreateUntilServing(launched, 0, address1, 3);
  log = launched.launcher->LogTail(kWholeLog);
  EXPECT_THAT(log, HasSubstr("restarted)"));
  const pid_t second = LastPidOf(log, 0);
  EXPECT_NE(second, first);
  CliResult health =
      RunCli(RankAddressOf(log, 0), {"health"}, launched.dir + "/health.log");
  EXPECT_EQ(health.exit_code, 0) << health.output;
  CliResult again = RunCli(
      RankAddressOf(log, 0),
      {"create", "after", "--size", "8,4", "--spec", kRows, "--init", "ones"},
      launched.dir + "/after.log");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  const std::string out = launched.dir + "/out.npy";
  CliResult fetched =
      RunCli(address1, {"fetch", "kept", "-o", out}, launched.dir + "/f.log");
  ASSERT_EQ(fetched.exit_code, 0) << fetched.output;
  ASSERT_OK_AND_ASSIGN(Tensor kept, ReadNpy(out));
  EXPECT_TRUE(Equal(kept, iota));

  launched.launcher->Signal(SIGINT);
  ASSERT_NO_FATAL_FAILURE(ExpectExitsWith(*launched.launcher, 0));
  EXPECT_TRUE(Gone(etcd)) << etcd;
  EXPECT_TRUE(Gone(second)) << second;
  EXPECT_TRUE(std::filesystem::is_empty(tmp))
      << std::filesystem::directory_iterator(tmp)->path();
  std::filesystem::remove_all(tmp);
  std::filesystem::remove_all(launched.dir);
}

// `--store embedded` keeps the store in rank 0, as before etcd: rank 0's
// death ends the launch (the others stop), whatever --max-restarts says.
TEST(CliLaunchTest, EmbeddedStoreRankZeroEndsTheLaunch) {
  Launched launched = Launch(2, {"--store", "embedded"});
  ASSERT_NE(launched.launcher, nullptr);
  const std::string address =
      WaitForReady(*launched.launcher, absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << launched.launcher->LogTail();
  const std::string log = launched.launcher->LogTail(kWholeLog);
  EXPECT_THAT(log, HasSubstr("store: rank 0 (embedded, 127.0.0.1:"));
  EXPECT_EQ(LocalEtcdPid(log), -1);
  const pid_t rank0 = LastPidOf(log, 0);
  ASSERT_GT(rank0, 0) << log;
  ASSERT_EQ(kill(rank0, SIGKILL), 0);
  ASSERT_NO_FATAL_FAILURE(ExpectExitsWith(*launched.launcher, 1));
  EXPECT_THAT(launched.launcher->LogTail(kWholeLog),
              HasSubstr("rank 0 serves the cluster's store (--store embedded"));
  std::filesystem::remove_all(launched.dir);
}

// An etcd that cannot start fails the launch before any daemon starts, in
// one error that quotes its log.
TEST(CliLaunchTest, AnEtcdThatCannotStartFailsTheLaunchQuotingItsLog) {
  char bin[] = "/tmp/tessera-fake-etcd-XXXXXX";
  ASSERT_NE(mkdtemp(bin), nullptr);
  const std::string etcd = absl::StrCat(bin, "/etcd");
  {
    std::ofstream out(etcd);
    out << "#!/bin/sh\necho 'fake etcd: no disk today' >&2\nexit 3\n";
  }
  ASSERT_EQ(chmod(etcd.c_str(), 0755), 0);
  const char* path = std::getenv("PATH");
  Launched launched =
      Launch(2, {}, {{"PATH", absl::StrCat(bin, ":", path ? path : "")}});
  ASSERT_NE(launched.launcher, nullptr);
  ASSERT_NO_FATAL_FAILURE(ExpectExitsWith(*launched.launcher, 1));
  const std::string log = launched.launcher->LogTail(kWholeLog);
  EXPECT_THAT(log, HasSubstr("tessera launch: error: the local etcd ("));
  EXPECT_THAT(log, HasSubstr("stopped before serving (exit code 3)"));
  EXPECT_THAT(log, HasSubstr("fake etcd: no disk today"));
  EXPECT_THAT(log, Not(HasSubstr("rank 0")));
  std::filesystem::remove_all(bin);
  std::filesystem::remove_all(launched.dir);
}

// Two launches at once on one host: each runs its own etcd member on ports
// of its own, and their clusters are apart (the same tensor name in both).
TEST(CliLaunchTest, TwoLaunchesAtOnceEachRunTheirOwnEtcd) {
  Launched first = Launch(2);
  Launched second = Launch(2);
  ASSERT_NE(first.launcher, nullptr);
  ASSERT_NE(second.launcher, nullptr);
  const std::string address1 = WaitForReady(*first.launcher, absl::Seconds(60));
  const std::string address2 =
      WaitForReady(*second.launcher, absl::Seconds(60));
  ASSERT_FALSE(address1.empty()) << first.launcher->LogTail();
  ASSERT_FALSE(address2.empty()) << second.launcher->LogTail();
  const pid_t etcd1 = LocalEtcdPid(first.launcher->LogTail(kWholeLog));
  const pid_t etcd2 = LocalEtcdPid(second.launcher->LogTail(kWholeLog));
  ASSERT_GT(etcd1, 0) << first.launcher->LogTail();
  ASSERT_GT(etcd2, 0) << second.launcher->LogTail();
  EXPECT_NE(etcd1, etcd2);
  for (const auto& [address, dir] :
       {std::pair(address1, first.dir), std::pair(address2, second.dir)}) {
    CliResult created = RunCli(address,
                               {"create", "t", "--size", "4,4", "--spec",
                                "chunk:dim=0:rank:0/cpu,rank:1/cpu"},
                               dir + "/create.log");
    EXPECT_EQ(created.exit_code, 0) << created.output;
  }
  for (Launched* launched : {&first, &second}) {
    launched->launcher->Signal(SIGINT);
    ASSERT_NO_FATAL_FAILURE(ExpectExitsWith(*launched->launcher, 0));
    std::filesystem::remove_all(launched->dir);
  }
  EXPECT_TRUE(Gone(etcd1));
  EXPECT_TRUE(Gone(etcd2));
}

}  // namespace
}  // namespace tessera
