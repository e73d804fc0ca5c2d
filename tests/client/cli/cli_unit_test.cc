// The CLI's own functions, without running the binary: value and table
// formatting, progress bars, flag parsing helpers, address resolution and
// the launcher's options, daemon command lines and server lookup.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/cli/bench_command.h"
#include "client/cli/connection.h"
#include "client/cli/create_command.h"
#include "client/cli/fetch_command.h"
#include "client/cli/health_command.h"
#include "client/cli/launch/launch_command.h"
#include "client/cli/progress_bar.h"
#include "client/cli/read_command.h"
#include "client/cli/save_command.h"
#include "client/cli/table.h"
#include "client/cli/top_command.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera::cli {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::StartsWith;

// ----------------------------------------------------------- Formatting.

TEST(FormatTensorValuesTest, MatrixRowsAreAligned) {
  const Tensor t =
      Tensor::FromVector<float>({0, 1.5, -2, 30, 4, 5}, {2, 3}).value();
  EXPECT_EQ(FormatTensorValues(t),
            "[[  0, 1.5,  -2],\n"
            " [ 30,   4,   5]]\n");
}

TEST(FormatTensorValuesTest, EveryKindOfElement) {
  EXPECT_EQ(
      FormatTensorValues(
          Tensor::FromVector<int64_t>({-9000000000000000000, 7}, {2}).value()),
      "[-9000000000000000000,                    7]\n");
  EXPECT_EQ(
      FormatTensorValues(Tensor::FromVector<bool>({true, false}, {2}).value()),
      "[ True, False]\n");
  EXPECT_EQ(FormatTensorValues(Tensor::FromVector<std::complex<float>>(
                                   {{1, 2}, {0.5, -3}}, {2})
                                   .value()),
            "[  1+2j, 0.5-3j]\n");
  EXPECT_EQ(FormatTensorValues(Tensor::FromVector<uint8_t>({255}, {}).value()),
            "255\n");
  EXPECT_EQ(
      FormatTensorValues(
          Tensor::Full({2}, 0.25, TensorOptions().WithDType(DType::kBFloat16))
              .value()),
      "[0.25, 0.25]\n");
  EXPECT_EQ(FormatTensorValues(Tensor::Zeros({0, 3}).value()), "[]\n");
}

TEST(FormatTensorValuesTest, ThreeDimensionsSeparateBlocksByABlankLine) {
  const Tensor t =
      Tensor::FromVector<int32_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2}).value();
  EXPECT_EQ(FormatTensorValues(t),
            "[[[1, 2],\n"
            "  [3, 4]],\n"
            "\n"
            " [[5, 6],\n"
            "  [7, 8]]]\n");
  // Non-contiguous views print in their logical order.
  const Tensor m = Tensor::FromVector<int32_t>({1, 2, 3, 4}, {2, 2}).value();
  EXPECT_EQ(FormatTensorValues(m.T().value()), "[[1, 3],\n [2, 4]]\n");
}

TEST(TableTest, ColumnsBytesAndArrays) {
  EXPECT_EQ(FormatColumns({{"A", "BB"}, {"ccc", "d"}}), "A    BB\nccc  d\n");
  EXPECT_EQ(FormatDims({10, 20}), "[10, 20]");
  EXPECT_EQ(FormatDims({}), "[]");
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(int64_t{37} << 20), "37.0 MiB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 30), "5.00 GiB");
  EXPECT_EQ(DescribeArray(DType::kFloat32, {10, 20}),
            "float32 [10, 20], 800 B");
  EXPECT_EQ(DescribeArray(DType::kInt64, {int64_t{1} << 62, 4}),
            "int64 [4611686018427387904, 4], too many bytes");
}

// --------------------------------------------------------- Progress bar.

TEST(ProgressTest, LineShowsBarPercentBytesAndRate) {
  EXPECT_EQ(FormatProgressLine("fetch w", 0, 100 << 20, absl::ZeroDuration()),
            "fetch w  [>                       ]   0%  0 B / 100.0 MiB");
  EXPECT_EQ(
      FormatProgressLine("fetch w", 50 << 20, 100 << 20, absl::Seconds(2)),
      "fetch w  [============>           ]  50%  50.0 MiB / 100.0 MiB  "
      "25.0 MiB/s");
  EXPECT_EQ(FormatProgressLine("w", 8, 8, absl::Seconds(1)),
            "w  [========================] 100%  8 B / 8 B  8 B/s");
}

TEST(ProgressTest, BarDrawsInPlaceAndEndsItsLine) {
  std::ostringstream out;
  ProgressBar bar(out, "read x", /*enabled=*/true, /*min_bytes=*/100);
  bar.Update(10, 200);
  bar.Update(20, 200);   // within 100 ms of the last draw: skipped
  bar.Update(200, 200);  // the last one is always drawn
  bar.Finish();
  bar.Finish();
  const std::string text = out.str();
  EXPECT_THAT(text, StartsWith("\rread x  [=>"));
  EXPECT_THAT(text, HasSubstr("\rread x  [========================] 100%"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\r'), 2);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
}

TEST(ProgressTest, SmallOrDisabledTransfersDrawNothing) {
  std::ostringstream small_out;
  ProgressBar small(small_out, "x", /*enabled=*/true, /*min_bytes=*/1000);
  small.Update(999, 999);
  small.Finish();
  EXPECT_THAT(small_out.str(), IsEmpty());

  std::ostringstream off_out;
  ProgressBar off(off_out, "x", /*enabled=*/false, /*min_bytes=*/1);
  off.Callback()(5, 10);
  off.Finish();
  EXPECT_THAT(off_out.str(), IsEmpty());
  ConnectionFlags flags;
  EXPECT_FALSE(MakeTransferOptions(flags, &off).progress);
  EXPECT_FALSE(ProgressWanted(flags, off_out));  // not stderr
}

// ------------------------------------------------------ Flags and helpers.

TEST(FlagHelpersTest, IndexListsNamesInitsAndDtypes) {
  EXPECT_THAT(ParseIndexList("2,5", "--offsets"), IsOk());
  EXPECT_THAT(ParseIndexList("2,5", "--offsets").value(), ElementsAre(2, 5));
  EXPECT_THAT(ParseIndexList("", "--offsets").value(), IsEmpty());
  EXPECT_THAT(ParseIndexList("2,-5", "--sizes"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid --sizes '2,-5'")));
  EXPECT_THAT(ParseNameList("a,b", "--names").value(), ElementsAre("a", "b"));
  EXPECT_THAT(ParseNameList("a,", "--as"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid --as 'a,'")));
  EXPECT_EQ(ParseTensorInit("randn").value(), TensorInit::kRandn);
  EXPECT_EQ(ParseTensorInit("full").value(), TensorInit::kFull);
  EXPECT_THAT(ParseTensorInit("Ones"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected empty, zeros, ones, full, rand or "
                                 "randn")));
  EXPECT_EQ(NpyOutputDType(DType::kFloat16, "").value(), DType::kFloat16);
  EXPECT_EQ(NpyOutputDType(DType::kBFloat16, "float32").value(),
            DType::kFloat32);
  EXPECT_THAT(NpyOutputDType(DType::kBFloat16, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("add --cast float32")));
  EXPECT_THAT(NpyOutputDType(DType::kFloat32, "bfloat16"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

// Checkpoint paths go to the daemons as given: they resolve them beneath
// their --checkpoint-root.
TEST(FlagHelpersTest, CheckpointPathsAreTheDaemonsToResolve) {
  EXPECT_OK(CheckCheckpointPath("ckpt/./step1"));
  EXPECT_OK(CheckCheckpointPath("/shared/ckpt"));
  EXPECT_THAT(CheckCheckpointPath(""),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(FlagHelpersTest, SaveVersionsAreNumbersOfNamedTensors) {
  EXPECT_THAT(ParseSaveVersions({"7"}, {"w"}),
              IsOkAndHolds(ElementsAre(Pair("w", 7))));
  EXPECT_THAT(ParseSaveVersions({"w=7", "b=3"}, {"w", "b"}),
              IsOkAndHolds(ElementsAre(Pair("b", 3), Pair("w", 7))));
  EXPECT_THAT(ParseSaveVersions({}, {}), IsOkAndHolds(IsEmpty()));
  // A bare number needs exactly one tensor named.
  EXPECT_THAT(ParseSaveVersions({"7"}, {"w", "b"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--version NAME=N")));
  EXPECT_THAT(ParseSaveVersions({"7"}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  for (const char* bad : {"w=0", "w=-1", "w=x", "w=", "=3", "w=7=8"}) {
    EXPECT_THAT(ParseSaveVersions({bad}, {"w"}),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_))
        << bad;
  }
  EXPECT_THAT(ParseSaveVersions({"b=3"}, {"w"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not among the tensors named")));
  EXPECT_THAT(
      ParseSaveVersions({"w=3", "w=4"}, {"w"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("given twice")));
}

TEST(FlagHelpersTest, HealthStates) {
  EXPECT_EQ(HealthState(absl::OkStatus()), "SERVING");
  EXPECT_EQ(HealthState(absl::UnavailableError("127.0.0.1:1: NOT_SERVING")),
            "NOT_SERVING");
  EXPECT_EQ(HealthState(absl::UnavailableError("127.0.0.1:1: refused")),
            "UNAVAILABLE");
}

TEST(ConnectionTest, AddressPrecedenceAndTimeouts) {
  ConnectionFlags flags;
  ::unsetenv(kAddressEnv);
  EXPECT_EQ(ResolveAddress(flags), "127.0.0.1:29600");
  ::setenv(kAddressEnv, "10.0.0.1:1", 1);
  EXPECT_EQ(ResolveAddress(flags), "10.0.0.1:1");
  flags.address = "10.0.0.2:2";
  EXPECT_EQ(ResolveAddress(flags), "10.0.0.2:2");
  ::unsetenv(kAddressEnv);

  EXPECT_EQ(Timeout(flags), absl::Seconds(60));
  EXPECT_EQ(MakeTransferOptions(flags, nullptr).timeout, absl::Seconds(300));
  flags.timeout_seconds = 2.5;
  EXPECT_EQ(Timeout(flags), absl::Milliseconds(2500));
  EXPECT_EQ(MakeTransferOptions(flags, nullptr).timeout,
            absl::Milliseconds(2500));
}

// Each credential flag wins over its variable; messages name the one that
// gave the file at fault.
TEST(ConnectionTest, CredentialFlagsWinOverTheirVariables) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base != nullptr ? base : "/tmp",
                                       "/tessera-credentials-", ::getpid());
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = absl::StrCat(dir, "/", name);
    std::ofstream(path) << text;
    return path;
  };
  const std::string ca = write("ca.pem", "-----BEGIN CERTIFICATE-----\n");
  const std::string cert = write("cert.pem", "-----BEGIN CERTIFICATE-----\n");
  const std::string key = write("key.pem", "-----BEGIN PRIVATE KEY-----\n");
  const std::string junk = write("junk.pem", "not pem");
  const std::string token =
      write("token", "# the admin token\n\n  0123456789abcdef admin ops\n");
  const std::string comments = write("comments", "# none yet\n\n");

  for (const char* variable : {kTlsCaEnv, kTlsCertEnv, kTlsKeyEnv}) {
    ::unsetenv(variable);
  }
  ConnectionFlags flags;
  ::setenv(kTlsCaEnv, junk.c_str(), 1);
  EXPECT_THAT(
      ResolveCredentials(flags),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("$TESSERA_TLS_CA: " + junk + " holds no PEM")));
  flags.tls_ca = ca;
  ASSERT_THAT(ResolveCredentials(flags), IsOk());
  EXPECT_EQ(ResolveCredentials(flags)->tls.ca_file, ca);
  EXPECT_FALSE(ResolveCredentials(flags)->token.has_value());
  flags.tls_ca = junk;
  ::setenv(kTlsCaEnv, ca.c_str(), 1);
  EXPECT_THAT(
      ResolveCredentials(flags),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-ca: ")));
  flags.tls_ca.clear();
  EXPECT_EQ(ResolveCredentials(flags)->tls.ca_file, ca);

  // Mutual TLS: flag and variable mix, each named as given.
  flags.tls_cert = cert;
  EXPECT_THAT(
      ResolveCredentials(flags),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("--tls-cert and --tls-key or $TESSERA_TLS_KEY go "
                         "together")));
  ::setenv(kTlsKeyEnv, key.c_str(), 1);
  ASSERT_THAT(ResolveCredentials(flags), IsOk());
  EXPECT_EQ(ResolveCredentials(flags)->tls.key_file, key);
  flags.tls_key = junk;
  EXPECT_THAT(
      ResolveCredentials(flags),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-key: ")));
  ::unsetenv(kTlsCaEnv);
  ::unsetenv(kTlsKeyEnv);
  flags.tls_key = key;
  EXPECT_THAT(ResolveCredentials(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("needs --tls-ca or $TESSERA_TLS_CA")));

  // --token-file: the first word of the first line that is not a comment.
  flags = ConnectionFlags();
  flags.token_file = token;
  ASSERT_THAT(ResolveCredentials(flags), IsOk());
  EXPECT_EQ(ResolveCredentials(flags)->token, "0123456789abcdef");
  flags.token_file = comments;
  EXPECT_THAT(
      ResolveCredentials(flags),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("--token-file: " + comments + " holds no token")));
  flags.token_file = dir + "/missing";
  EXPECT_THAT(ResolveCredentials(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--token-file: ")));
  std::filesystem::remove_all(dir);
}

// ------------------------------------------------------------- Launcher.

LaunchOptions Options(int nproc) {
  LaunchOptions options;
  options.nproc = nproc;
  return options;
}

TEST(LaunchOptionsTest, Validation) {
  EXPECT_THAT(ValidateLaunchOptions(Options(4)), IsOk());
  LaunchOptions any_port = Options(4);
  any_port.base_port = 0;
  any_port.master_port = 29600;
  EXPECT_THAT(ValidateLaunchOptions(any_port), IsOk());
  EXPECT_THAT(
      ValidateLaunchOptions(Options(0)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--nproc")));
  LaunchOptions collide = Options(4);
  collide.master_port = 29603;
  EXPECT_THAT(
      ValidateLaunchOptions(collide),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("29600..29603")));
  LaunchOptions no_host = Options(1);
  no_host.host = "";
  EXPECT_THAT(
      ValidateLaunchOptions(no_host),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--host")));
  LaunchOptions level = Options(1);
  level.log_level = "debug";
  EXPECT_THAT(ValidateLaunchOptions(level), IsOk());
  level.log_level = "verbose";
  EXPECT_THAT(
      ValidateLaunchOptions(level),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--log-level")));
  LaunchOptions store = Options(2);
  store.store = "etcd://127.0.0.1:2379/job";
  EXPECT_THAT(ValidateLaunchOptions(store), IsOk());
  store.store = "embedded";
  EXPECT_THAT(ValidateLaunchOptions(store), IsOk());
  store.store = "127.0.0.1:2379";
  EXPECT_THAT(ValidateLaunchOptions(store),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--store"), HasSubstr("etcd://"))));
  for (const char* flag :
       {"--metrics-port", "--metrics-port=9000", "--metrics-address-file"}) {
    LaunchOptions twice = Options(2);
    twice.server_flags = {"--timeout", "5s", flag, "9000"};
    EXPECT_THAT(ValidateLaunchOptions(twice),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("--metrics-base-port")))
        << flag;
  }
  LaunchOptions host_only = Options(2);
  host_only.server_flags = {"--metrics-host", "127.0.0.1"};
  EXPECT_THAT(ValidateLaunchOptions(host_only), IsOk());
  LaunchOptions overlap = Options(4);
  overlap.metrics_base_port = 29602;  // the daemons have 29600..29603
  EXPECT_THAT(ValidateLaunchOptions(overlap),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("overlap the daemons' ports")));
  overlap.metrics_base_port = 29498;  // the master has 29500
  EXPECT_THAT(
      ValidateLaunchOptions(overlap),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--master-port")));
  overlap.metrics_base_port = 29700;
  EXPECT_THAT(ValidateLaunchOptions(overlap), IsOk());
  for (const int bad : {-2, 65534}) {
    LaunchOptions metrics = Options(4);
    metrics.metrics_base_port = bad;
    EXPECT_THAT(ValidateLaunchOptions(metrics),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("--metrics-base-port")));
  }
  LaunchOptions stop = Options(1);
  stop.stop_timeout_seconds = 0;
  EXPECT_THAT(ValidateLaunchOptions(stop),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(LaunchOptionsTest, DaemonCommandLikeTorchrun) {
  LaunchOptions options = Options(4);
  options.log_level = "debug";
  options.server_flags = {"--timeout", "30s"};
  const DaemonCommand command = BuildDaemonCommand(options, 2, "/tmp/a");
  EXPECT_EQ(command.address_file, "/tmp/a/rank2.address");
  EXPECT_THAT(
      command.args,
      ElementsAre("--rank", "2", "--world-size", "4", "--local-rank", "2",
                  "--local-world-size", "4", "--master-addr", "127.0.0.1",
                  "--master-port", "29500", "--host", "127.0.0.1", "--port",
                  "29602", "--device", "auto", "--address-file",
                  "/tmp/a/rank2.address", "--metrics-port", "0",
                  "--metrics-address-file", "/tmp/a/rank2.metrics",
                  "--log-level", "debug", "--timeout", "30s"));
  EXPECT_EQ(command.metrics_address_file, "/tmp/a/rank2.metrics");
  EXPECT_THAT(
      command.env,
      ElementsAre(Pair("RANK", "2"), Pair("WORLD_SIZE", "4"),
                  Pair("LOCAL_RANK", "2"), Pair("LOCAL_WORLD_SIZE", "4"),
                  Pair("MASTER_ADDR", "127.0.0.1"),
                  Pair("MASTER_PORT", "29500")));

  LaunchOptions cpu = Options(2);
  cpu.cpu = true;
  cpu.base_port = 0;
  cpu.host = "0.0.0.0";
  const DaemonCommand any = BuildDaemonCommand(cpu, 1, "/d");
  EXPECT_THAT(any.args, ::testing::IsSupersetOf({"cpu", "0.0.0.0"}));
  // The value after `flag` in the daemon's arguments.
  auto value_of = [&](absl::string_view flag) {
    auto it = std::find(any.args.begin(), any.args.end(), flag);
    return it == any.args.end() || it + 1 == any.args.end() ? std::string()
                                                            : *(it + 1);
  };
  EXPECT_EQ(value_of("--port"), "0");                 // any free port
  EXPECT_EQ(value_of("--master-addr"), "127.0.0.1");  // a wildcard is no master
  EXPECT_EQ(value_of("--local-world-size"), "2");
  EXPECT_EQ(value_of("--store"), "");
  cpu.store = "embedded";  // the launcher's word: rank 0 serves the store
  EXPECT_THAT(BuildDaemonCommand(cpu, 1, "/d").args,
              ::testing::Not(::testing::Contains("--store")));
  cpu.store = "etcd://127.0.0.1:2379/job";
  const DaemonCommand on_etcd = BuildDaemonCommand(cpu, 1, "/d");
  EXPECT_THAT(on_etcd.args, ::testing::IsSupersetOf(
                                {"--store", "etcd://127.0.0.1:2379/job"}));
  // Metrics: base + rank, or none.
  cpu.metrics_base_port = 29700;
  EXPECT_THAT(BuildDaemonCommand(cpu, 1, "/d").args,
              ::testing::IsSupersetOf({"--metrics-port", "29701"}));
  cpu.metrics_base_port = -1;
  const DaemonCommand quiet = BuildDaemonCommand(cpu, 1, "/d");
  EXPECT_THAT(quiet.args,
              ::testing::Not(::testing::Contains("--metrics-port")));
  EXPECT_EQ(quiet.metrics_address_file, "");
  EXPECT_EQ(MasterAddress("10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(MasterAddress("::"), "127.0.0.1");
}

// The launcher's settings table: defaults, resolution and --help.
TEST(LaunchOptionsTest, SettingsTable) {
  const LaunchOptions defaults;
  EXPECT_EQ(defaults.master_port, 29500);
  EXPECT_EQ(defaults.base_port, 29600);
  EXPECT_EQ(defaults.metrics_base_port, 0);
  EXPECT_EQ(defaults.host, "127.0.0.1");
  EXPECT_EQ(defaults.start_timeout_seconds, 120);
  EXPECT_EQ(defaults.stop_timeout_seconds, 15);
  EXPECT_EQ(defaults.max_restarts, 3);
  EXPECT_EQ(defaults.store, "");  // a local etcd member

  LaunchFlags flags;
  flags.nproc = "3";
  flags.base_port = "0";
  flags.cpu = true;
  flags.server_flags = {"--timeout", "5s"};
  ASSERT_OK_AND_ASSIGN(LaunchOptions options,
                       ResolveLaunchOptions(flags, nullptr));
  EXPECT_EQ(options.nproc, 3);
  EXPECT_EQ(options.base_port, 0);
  EXPECT_EQ(options.master_port, 29500);
  EXPECT_TRUE(options.cpu);
  EXPECT_FALSE(options.secure);
  EXPECT_THAT(options.server_flags, ElementsAre("--timeout", "5s"));
  flags.stop_timeout = "soon";
  EXPECT_THAT(ResolveLaunchOptions(flags, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--stop-timeout must be a number, got 'soon'"));
  EXPECT_THAT(
      ResolveLaunchOptions({}, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, "--nproc is required"));

  CLI::App app("launch", "launch");
  LaunchFlags parsed;
  LaunchSettings().AddTo(app, parsed);
  const std::string help = app.help();
  for (const LaunchSettingTable::Setting& setting :
       LaunchSettings().settings()) {
    int listed = 0;
    for (absl::string_view line : absl::StrSplit(help, '\n')) {
      line = absl::StripLeadingAsciiWhitespace(line);
      listed += absl::StartsWith(line, setting.flag() + " ") ||
                absl::StartsWith(line, setting.flag() + ",") ||
                line == setting.flag();
    }
    EXPECT_EQ(listed, 1) << setting.flag() << "\n" << help;
  }
  EXPECT_THAT(help, HasSubstr("[default 29500]"));
}

class FindServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern =
        absl::StrCat(base != nullptr ? base : "/tmp", "/tessera_find_XXXXXX");
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string MakeFile(const std::string& relative, bool executable) {
    const std::filesystem::path path = std::filesystem::path(root_) / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << "#!/bin/sh\n";
    chmod(path.c_str(), executable ? 0755 : 0644);
    return path.string();
  }

  std::string root_;
};

TEST_F(FindServerTest, NextToItselfThenTheBuildTreeThenPath) {
  const std::string self = MakeFile("build/bin/tessera", true);
  const std::string in_tree =
      MakeFile("build/server/daemon/tessera-server", true);
  const std::string on_path = MakeFile("usr/bin/tessera-server", true);
  const std::string path_env =
      absl::StrCat(root_, "/nothing:", root_, "/usr/bin");
  // Only the old build-tree layout (tessera in build/client/cli).
  const std::string old_self = MakeFile("build/client/cli/tessera", true);
  EXPECT_EQ(FindServerBinary("", old_self, path_env).value(), in_tree);
  EXPECT_EQ(FindServerBinary("", self, path_env).value(), on_path);
  const std::string next_to = MakeFile("build/bin/tessera-server", true);
  EXPECT_EQ(FindServerBinary("", self, path_env).value(), next_to);
  // --server wins, and must be executable.
  EXPECT_EQ(FindServerBinary(on_path, self, path_env).value(), on_path);
  const std::string plain = MakeFile("plain", false);
  EXPECT_THAT(FindServerBinary(plain, self, path_env),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("is not an executable file")));
}

TEST_F(FindServerTest, NotFoundSaysWhatToDo) {
  const std::string self = MakeFile("bin/tessera", true);
  MakeFile("bin/tessera-server", false);  // not executable: skipped
  EXPECT_THAT(FindServerBinary("", self, "/nonexistent"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("--target tessera-server) or pass --server")));
}

TEST(PrometheusTextTest, SamplesLabelsAndValues) {
  ASSERT_OK_AND_ASSIGN(
      std::vector<MetricSample> samples,
      ParsePrometheusText("# HELP x_total Things\n"
                          "# TYPE x_total counter\n"
                          "x_total{a=\"1\",b=\"q\\\"uo\\\\te\\n\"} 3\n"
                          "\n"
                          "x_total{a=\"2\"} 4.5 1700000000000\n"
                          "up 1\n"
                          "h_bucket{le=\"+Inf\"} 7\n"));
  ASSERT_EQ(samples.size(), 4u);
  EXPECT_EQ(samples[0].name, "x_total");
  EXPECT_EQ(samples[0].labels.at("b"), "q\"uo\\te\n");
  EXPECT_EQ(samples[1].value, 4.5);
  EXPECT_EQ(samples[2].name, "up");
  EXPECT_TRUE(samples[2].labels.empty());
  EXPECT_EQ(SumOf(samples, "x_total"), 7.5);
  EXPECT_EQ(SumOf(samples, "x_total", {{"a", "2"}}), 4.5);
  EXPECT_EQ(SumOf(samples, "x_total", {{"a", "3"}}), 0);
  for (const char* bad : {"x_total{a=\"1\" 3", "x_total", "{a=\"1\"} 2",
                          "x_total one", "x 1 2 3"}) {
    EXPECT_THAT(ParsePrometheusText(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("metrics line 1")))
        << bad;
  }
}

TEST(PrometheusTextTest, QuantilesInterpolateWithinTheirBucket) {
  // 10 observations: 4 up to 1 ms, 4 more up to 2 ms, 2 above 4 ms.
  const std::map<double, double> buckets = {
      {0.001, 4}, {0.002, 8}, {0.004, 8}, {INFINITY, 10}};
  EXPECT_DOUBLE_EQ(HistogramQuantile(buckets, 0.2), 0.0005);
  EXPECT_DOUBLE_EQ(HistogramQuantile(buckets, 0.5), 0.00125);
  // In the unbounded bucket: its lower bound.
  EXPECT_DOUBLE_EQ(HistogramQuantile(buckets, 0.99), 0.004);
  EXPECT_EQ(HistogramQuantile({{0.001, 0}, {INFINITY, 0}}, 0.5), -1);
  EXPECT_EQ(HistogramQuantile({}, 0.5), -1);
}

TEST(TopTest, RatesAndLatenciesComeFromTwoLooks) {
  DaemonLook before;
  before.rank = 2;
  before.address = "127.0.0.1:29602";
  before.state = "serving";
  before.generation = 3;
  ASSERT_OK_AND_ASSIGN(
      before.metrics,
      ParsePrometheusText(
          "tessera_transfer_bytes_total{transport=\"data_plane\","
          "direction=\"read\"} 1000\n"
          "tessera_control_ops_total{op=\"CreateTensor\",code=\"OK\"} 4\n"
          "tessera_transfer_seconds_bucket{transport=\"grpc\","
          "direction=\"read\",le=\"0.001\"} 100\n"
          "tessera_transfer_seconds_bucket{transport=\"grpc\","
          "direction=\"read\",le=\"0.01\"} 100\n"
          "tessera_transfer_seconds_bucket{transport=\"grpc\","
          "direction=\"read\",le=\"+Inf\"} 100\n"));
  DaemonLook after = before;
  ASSERT_OK_AND_ASSIGN(
      after.metrics,
      ParsePrometheusText(
          "tessera_transfer_bytes_total{transport=\"data_plane\","
          "direction=\"read\"} 5000\n"
          "tessera_control_ops_total{op=\"CreateTensor\",code=\"OK\"} 6\n"
          // A failure of the cluster's: an error (a caller's NOT_FOUND is
          // not: TopTest.CallersMistakesAreNotErrors).
          "tessera_control_ops_total{op=\"Reshard\",code=\"UNAVAILABLE\"} 1\n"
          "tessera_checksum_failures_total{transport=\"grpc\"} 2\n"
          "tessera_tensors 5\n"
          "tessera_shard_bytes{device=\"cpu\"} 4096\n"
          "tessera_shard_bytes{device=\"cuda\"} 1024\n"
          "tessera_transfer_seconds_bucket{transport=\"grpc\","
          "direction=\"read\",le=\"0.001\"} 100\n"
          "tessera_transfer_seconds_bucket{transport=\"grpc\","
          "direction=\"read\",le=\"0.01\"} 110\n"
          "tessera_transfer_seconds_bucket{transport=\"grpc\","
          "direction=\"read\",le=\"+Inf\"} 110\n"));
  const DaemonView view = ViewOf(before, after, 2.0);
  EXPECT_EQ(view.rank, 2);
  EXPECT_EQ(view.generation, 3);
  EXPECT_EQ(view.read_bytes_per_second[1], 2000);  // data_plane
  EXPECT_EQ(view.read_bytes_per_second[0], 0);
  EXPECT_EQ(view.ops_per_second, 1.5);
  EXPECT_EQ(view.op_errors, 1);
  EXPECT_EQ(view.errors(), 3);
  EXPECT_EQ(view.tensors, 5);
  EXPECT_EQ(view.bytes_held, 5120);
  // The 10 fetches of the interval, all between 1 and 10 ms.
  EXPECT_DOUBLE_EQ(view.fetch_p50_seconds, 0.0055);
  EXPECT_TRUE(view.latency_of_interval);
  // No fetch in the interval: the daemon's whole life.
  const DaemonView quiet = ViewOf(after, after, 2.0);
  EXPECT_LT(quiet.fetch_p50_seconds, 0.001);
  EXPECT_FALSE(quiet.latency_of_interval);
  EXPECT_EQ(quiet.ops_per_second, 0);

  DaemonLook gone;
  gone.rank = 3;
  gone.error = absl::UnavailableError("connection refused");
  const DaemonView unreachable = ViewOf(after, gone, 2.0);
  EXPECT_EQ(unreachable.state, "unreachable");
  const std::string table = FormatTopTable({view, unreachable});
  EXPECT_THAT(table, AllOf(HasSubstr("FETCH p50"), HasSubstr("5.5ms"),
                           HasSubstr("unreachable (connection refused)")));
  const std::string json = FormatTopJson({view, unreachable}, 2.0);
  EXPECT_THAT(json, AllOf(HasSubstr("\"ops_per_second\": 1.5"),
                          HasSubstr("\"error\": \"connection refused\"")));
}

// The clean demo deletes its tensor before creating it: NOT_FOUND on every
// daemon, which is the caller's answer, not an error of the daemon's.
TEST(TopTest, CallersMistakesAreNotErrors) {
  DaemonLook look;
  look.rank = 0;
  look.address = "127.0.0.1:29600";
  ASSERT_OK_AND_ASSIGN(
      look.metrics,
      ParsePrometheusText(
          "tessera_control_ops_total{op=\"DeleteTensor\",code=\"NOT_FOUND\"} "
          "1\n"
          "tessera_control_ops_total{op=\"CreateTensor\",code=\"OK\"} 2\n"
          "tessera_control_ops_total{op=\"CreateTensor\","
          "code=\"ALREADY_EXISTS\"} 1\n"
          "tessera_control_ops_total{op=\"ReadRegion\","
          "code=\"INVALID_ARGUMENT\"} 1\n"));
  DaemonView view = ViewOf(look, look, 2.0);
  EXPECT_EQ(view.ops_total, 5);
  EXPECT_EQ(view.op_errors, 0);
  EXPECT_EQ(view.op_refusals, 3);
  EXPECT_EQ(view.errors(), 0);
  EXPECT_THAT(FormatTopTable({view}), ::testing::EndsWith("  0\n"));
  EXPECT_THAT(FormatTopJson({view}, 2.0),
              HasSubstr("\"refused\": {\n        \"control_ops\": 3"));

  // What fails in the cluster stays an error.
  for (const char* code : {"INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                           "DEADLINE_EXCEEDED", "FAILED_PRECONDITION"}) {
    EXPECT_FALSE(IsCallerOutcome(code)) << code;
    ASSERT_OK_AND_ASSIGN(
        look.metrics,
        ParsePrometheusText(absl::StrCat(
            "tessera_control_ops_total{op=\"CreateTensor\",code=\"", code,
            "\"} 1\n")));
    view = ViewOf(look, look, 2.0);
    EXPECT_EQ(view.errors(), 1) << code;
    EXPECT_EQ(view.op_refusals, 0) << code;
  }
  for (const char* code : {"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS",
                           "OUT_OF_RANGE", "PERMISSION_DENIED"}) {
    EXPECT_TRUE(IsCallerOutcome(code)) << code;
  }
}

TEST(BenchFitTest, RecoversPerOpCostAndRate) {
  // 20 us per op and 2.5 GB/s, exactly.
  const std::vector<int64_t> bytes = {4096, 65536, 1 << 20, 16 << 20};
  std::vector<double> seconds;
  for (int64_t b : bytes) seconds.push_back(20e-6 + b / 2.5e9);
  const TwoTermFit fit = FitTwoTerms(bytes, seconds);
  EXPECT_NEAR(fit.per_op_seconds, 20e-6, 1e-9);
  EXPECT_NEAR(fit.bytes_per_second, 2.5e9, 1e3);
  // Noisy points (10% either way): still within 15%.
  std::vector<double> noisy = seconds;
  for (size_t i = 0; i < noisy.size(); ++i) noisy[i] *= i % 2 ? 1.1 : 0.9;
  const TwoTermFit rough = FitTwoTerms(bytes, noisy);
  EXPECT_NEAR(rough.per_op_seconds, 20e-6, 3e-6);
  EXPECT_NEAR(rough.bytes_per_second, 2.5e9, 0.375e9);
  // Times that do not grow with size: a per-op cost, no rate.
  const TwoTermFit flat = FitTwoTerms({4096, 8192}, {1e-3, 1e-3});
  EXPECT_EQ(flat.bytes_per_second, 0);
  EXPECT_NEAR(flat.per_op_seconds, 1e-3, 1e-9);
  // Nothing to fit.
  EXPECT_EQ(FitTwoTerms({}, {}).per_op_seconds, 0);
}

}  // namespace
}  // namespace tessera::cli
