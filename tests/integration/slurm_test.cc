// deploy/slurm/tessera.sbatch under a real single-node Slurm (Debian's
// slurm-wlm and munge): the test runs munged, slurmctld and slurmd of its
// own (their ports, state, spool and socket in a scratch directory),
// submits the script for 2 tasks, writes and reads through the daemons it
// started (mutual TLS and tokens, as the script requires), kills one daemon
// and sees the job start it again, rejoin and refill, then scancels the job
// and sees every daemon gone. Skipped, with the reason, when the test is
// not root (slurmd launches jobs as root) or a Slurm or munge program is
// missing.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file.h"
#include "io/output_file.h"
#include "io/subprocess.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/iota.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_pki.h"
#include "wire/auth.h"
#include "wire/credentials.h"

namespace tessera {
namespace {

namespace tt = ::tessera::testing;
using ::testing::HasSubstr;

constexpr char kAdminToken[] = "fedcba9876543210fedcba9876543210";

// `name` in PATH or the system directories Debian puts daemons in; "" when
// it is nowhere.
std::string FindProgram(const std::string& name) {
  std::vector<std::string> dirs = {"/usr/sbin", "/sbin"};
  if (const char* path = std::getenv("PATH")) {
    for (absl::string_view dir : absl::StrSplit(path, ':')) {
      if (!dir.empty()) dirs.emplace_back(dir);
    }
  }
  for (const std::string& dir : dirs) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// The pids of the tessera-server processes whose command line (arguments
// joined by spaces) holds every one of `markers`.
std::vector<pid_t> DaemonsWith(const std::vector<std::string>& markers) {
  std::vector<pid_t> pids;
  std::error_code error;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc", error)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    absl::StatusOr<std::string> cmdline =
        ReadFileToString(absl::StrCat(entry.path().string(), "/cmdline"));
    if (!cmdline.ok()) continue;
    const std::vector<std::string> args = absl::StrSplit(*cmdline, '\0');
    if (args.empty() || !absl::EndsWith(args[0], "tessera-server")) continue;
    const std::string line = absl::StrJoin(args, " ");
    bool all = true;
    for (const std::string& marker : markers) {
      all &= absl::StrContains(line, marker);
    }
    if (all) pids.push_back(pid);
  }
  return pids;
}

class SlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "needs root: slurmd runs the job's tasks as root";
    }
    for (const char* program :
         {"munged", "slurmctld", "slurmd", "sbatch", "scancel", "squeue",
          "sinfo", "scontrol", "srun", "openssl"}) {
      if (FindProgram(program).empty()) {
        GTEST_SKIP() << program
                     << " is missing: install slurm-wlm and munge "
                        "(deploy/install-deps.sh)";
      }
    }
    ASSERT_TRUE(dir_.ok());
    char host[256] = {};
    ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
    hostname_ = host;
    for (const char* sub : {"munge", "state", "spool", "secrets", "ckpt"}) {
      std::filesystem::create_directories(Path(sub));
    }
    std::filesystem::permissions(Path("munge"),
                                 std::filesystem::perms::owner_all);
    ASSERT_NO_FATAL_FAILURE(StartMunge());
    ASSERT_NO_FATAL_FAILURE(StartSlurm());
  }

  void TearDown() override {
    if (!job_.empty()) {
      Run("scancel", {job_});
      WaitForJobGone(absl::Seconds(30));
    }
    for (std::optional<Subprocess>* daemon :
         {&slurmd_, &slurmctld_, &munged_}) {
      if (!daemon->has_value() || !(*daemon)->running()) continue;
      (*daemon)->Signal(SIGTERM);
      if (!(*daemon)->WaitFor(absl::Seconds(10)).has_value()) (*daemon)->Kill();
    }
    // Nothing of the job may outlive the test.
    for (pid_t pid : DaemonsWith({dir_.path()})) ::kill(pid, SIGKILL);
    SetProcessTls(TlsConfig());
    ClearProcessToken();
  }

  std::string Path(absl::string_view name) const {
    return absl::StrCat(dir_.path(), "/", name);
  }

  struct Ran {
    int exit_code = -1;
    std::string output;
  };
  // A Slurm or munge command with this test's configuration.
  Ran Run(const std::string& program, std::vector<std::string> args,
          std::vector<std::pair<std::string, std::string>> env = {}) {
    SpawnOptions spawn;
    spawn.program = FindProgram(program);
    spawn.args = std::move(args);
    spawn.env = std::move(env);
    spawn.env.emplace_back("SLURM_CONF", Path("slurm.conf"));
    spawn.log_path = Path(absl::StrCat("tool", runs_++, ".log"));
    spawn.stdin_null = true;
    Ran ran;
    absl::StatusOr<Subprocess> process = Subprocess::Spawn(std::move(spawn));
    if (!process.ok()) return ran;
    std::optional<int> status = process->WaitFor(absl::Seconds(30));
    if (!status.has_value()) process->Kill();
    if (status.has_value() && WIFEXITED(*status)) {
      ran.exit_code = WEXITSTATUS(*status);
    }
    ran.output = ReadFileToString(Path(absl::StrCat("tool", runs_ - 1, ".log")))
                     .value_or("");
    return ran;
  }

  std::optional<Subprocess> Daemon(const std::string& program,
                                   std::vector<std::string> args) {
    SpawnOptions spawn;
    spawn.program = FindProgram(program);
    spawn.args = std::move(args);
    spawn.env = {{"SLURM_CONF", Path("slurm.conf")}};
    spawn.log_path = Path(absl::StrCat(program, ".out"));
    spawn.stdin_null = true;
    spawn.die_with_parent = true;
    absl::StatusOr<Subprocess> process = Subprocess::Spawn(std::move(spawn));
    EXPECT_OK(process.status());
    if (!process.ok()) return std::nullopt;
    return *std::move(process);
  }

  void StartMunge() {
    std::string key(1024, '\0');
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      random.read(key.data(), static_cast<std::streamsize>(key.size()));
    }
    const std::string key_file = Path("munge/munge.key");
    ASSERT_OK(WriteOutputFile(key_file, key, 0400));
    munged_ =
        Daemon("munged", {"--foreground", "--force",
                          absl::StrCat("--socket=", Path("munge/socket")),
                          absl::StrCat("--key-file=", key_file),
                          absl::StrCat("--log-file=", Path("munged.log")),
                          absl::StrCat("--pid-file=", Path("munged.pid")),
                          absl::StrCat("--seed-file=", Path("munge/seed"))});
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    ASSERT_TRUE(munged_.has_value());
    while (!std::filesystem::exists(Path("munge/socket"))) {
      ASSERT_TRUE(munged_->running()) << munged_->LogTail();
      ASSERT_LT(absl::Now(), deadline) << "munged made no socket";
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  void StartSlurm() {
    ASSERT_OK_AND_ASSIGN(const int controller_port, tt::PickFreePort());
    ASSERT_OK_AND_ASSIGN(const int node_port, tt::PickFreePort());
    const unsigned cpus = std::max(2u, std::thread::hardware_concurrency());
    // Job ids (and so the script's ports) differ from run to run.
    const int first_job =
        1 + static_cast<int>(absl::ToUnixMicros(absl::Now()) % 100000);
    std::ofstream(Path("slurm.conf")) << absl::StrCat(
        "ClusterName=tessera\n", "SlurmctldHost=", hostname_, "(127.0.0.1)\n",
        "SlurmctldPort=", controller_port, "\n", "SlurmdPort=", node_port, "\n",
        "SlurmUser=root\nSlurmdUser=root\n",
        "AuthType=auth/munge\nCredType=cred/munge\n",
        "AuthInfo=socket=", Path("munge/socket"), "\n",
        "StateSaveLocation=", Path("state"), "\n",
        "SlurmdSpoolDir=", Path("spool"), "\n",
        "SlurmctldPidFile=", Path("slurmctld.pid"), "\n",
        "SlurmdPidFile=", Path("slurmd.pid"), "\n",
        "SlurmctldLogFile=", Path("slurmctld.log"), "\n",
        "SlurmdLogFile=", Path("slurmd.log"), "\n", "FirstJobId=", first_job,
        "\n",
        // No cgroups: the test runs wherever it is put.
        "ProctrackType=proctrack/pgid\nTaskPlugin=task/none\n",
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n",
        "SchedulerType=sched/builtin\nMpiDefault=none\nReturnToService=2\n",
        "JobAcctGatherType=jobacct_gather/none\n",
        "AccountingStorageType=accounting_storage/none\n", "KillWait=15\n",
        "NodeName=", hostname_, " NodeAddr=127.0.0.1 CPUs=", cpus,
        " RealMemory=1000 State=UNKNOWN\n",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
        "OverSubscribe=YES\n");
    slurmctld_ = Daemon("slurmctld", {"-D", "-c", "-f", Path("slurm.conf")});
    slurmd_ = Daemon("slurmd", {"-D", "-f", Path("slurm.conf")});
    ASSERT_TRUE(slurmctld_.has_value() && slurmd_.has_value());
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (true) {
      ASSERT_TRUE(slurmctld_->running()) << slurmctld_->LogTail();
      ASSERT_TRUE(slurmd_->running()) << slurmd_->LogTail();
      const Ran state = Run("sinfo", {"-h", "-o", "%t"});
      if (absl::StrContains(state.output, "idle")) return;
      ASSERT_LT(absl::Now(), deadline)
          << "the node never became idle: " << state.output << "\n"
          << ReadFileToString(Path("slurmd.log")).value_or("");
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  // The secrets the script reads from $TESSERA_SECRETS: daemon.pem and
  // daemon.key (for this host's name), ca.pem and tokens; the client's
  // certificate beside them.
  void MakeSecrets() {
    tt::TestPki pki(Path("secrets"));
    ASSERT_TRUE(pki.MakeCa("ca"));
    ASSERT_TRUE(pki.MakeCert("daemon", "ca", 1, {hostname_}));
    ASSERT_TRUE(pki.MakeCert("client", "ca", 1, {hostname_}));
    ASSERT_OK(WriteOutputFile(
        Path("secrets/tokens"),
        absl::StrCat("0123456789abcdef0123456789abcdef cluster daemons\n",
                     kAdminToken, " admin test\n"),
        0600));
    client_tls_ = pki.Client("ca", "client");
  }

  // sbatch of the script for 2 tasks on this node: the job id.
  void Submit() {
    const std::string bin =
        std::filesystem::path(TESSERA_SERVER_PATH).parent_path().string();
    const char* path = std::getenv("PATH");
    const Ran submitted = Run(
        "sbatch",
        {"--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
         "--gres=none", "--time=10",
         absl::StrCat("--output=", Path("job-%j.out")), TESSERA_SBATCH_SCRIPT},
        {{"PATH", absl::StrCat(bin, ":", path != nullptr ? path : "/usr/bin")},
         {"TESSERA_SECRETS", Path("secrets")},
         {"TESSERA_CHECKPOINT_ROOT", Path("ckpt")}});
    ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
    // --parsable: "<id>" or "<id>;<cluster>".
    const std::string line(absl::StripAsciiWhitespace(submitted.output));
    job_ = line.substr(0, line.find(';'));
    int id = 0;
    ASSERT_TRUE(absl::SimpleAtoi(job_, &id)) << submitted.output;
  }

  std::string JobOutput() const {
    return ReadFileToString(Path(absl::StrCat("job-", job_, ".out")))
        .value_or("");
  }

  // Waits until the job's output holds `text` `times` times.
  void WaitForOutput(const std::string& text, int times,
                     absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const std::string output = JobOutput();
      int seen = 0;
      for (size_t at = output.find(text); at != std::string::npos;
           at = output.find(text, at + 1)) {
        ++seen;
      }
      if (seen >= times) return;
      ASSERT_LT(absl::Now(), deadline)
          << "no \"" << text << "\" (x" << times << ") in the job's output:\n"
          << output << "\nslurmd:\n"
          << ReadFileToString(Path("slurmd.log")).value_or("");
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  void WaitForJobGone(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      const Ran queue = Run("squeue", {"-h", "-j", job_, "-o", "%T"});
      if (absl::StripAsciiWhitespace(queue.output).empty() ||
          queue.exit_code != 0) {
        return;
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  tt::ScopedTempDir dir_{"tessera-slurm"};
  std::string hostname_;
  std::optional<Subprocess> munged_, slurmctld_, slurmd_;
  TlsConfig client_tls_;
  std::string job_;
  int runs_ = 0;
};

TEST_F(SlurmTest, TheJobServesAndRestartsADeadDaemonWhichRejoinsAndRefills) {
  ASSERT_NO_FATAL_FAILURE(MakeSecrets());
  ASSERT_NO_FATAL_FAILURE(Submit());
  ASSERT_NO_FATAL_FAILURE(WaitForOutput("serving on", 2, absl::Seconds(60)));
  // The job names the address to connect to, and its ports.
  const std::string output = JobOutput();
  const size_t named = output.find("connect to ");
  ASSERT_NE(named, std::string::npos) << output;
  const std::string address =
      output.substr(named + 11, output.find('\n', named) - (named + 11));
  EXPECT_TRUE(absl::StartsWith(address, absl::StrCat(hostname_, ":")))
      << address;
  EXPECT_THAT(output, HasSubstr("(gRPC 2+2L, data 3+2L)"));

  SetProcessTls(client_tls_);
  SetProcessToken(kAdminToken);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                       Client::Connect(address));
  ASSERT_EQ(client->world_size(), 2);
  // Each daemon's data plane is on the port the script gave it.
  for (int r = 0; r < 2; ++r) {
    const v1::WorkerAddress& worker = client->cluster().workers(r);
    int port = 0, data_port = 0;
    ASSERT_TRUE(absl::SimpleAtoi(
        worker.address().substr(worker.address().rfind(':') + 1), &port));
    ASSERT_TRUE(absl::SimpleAtoi(
        worker.data_address().substr(worker.data_address().rfind(':') + 1),
        &data_port));
    EXPECT_EQ(data_port, port + 1) << worker.ShortDebugString();
  }
  CreateOptions two_copies;
  two_copies.copies = 2;
  const std::vector<std::string> placements = {"rank:0/cpu", "rank:1/cpu"};
  ShardingSpec rows = *ChunkShardingSpec::Create(0, placements);
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client->Create("w", {8, 4}, rows, two_copies));
  ASSERT_OK(view.Write({0, 0}, tt::Iota(8, 4)));
  ASSERT_OK_AND_ASSIGN(Tensor values, view.Read());
  tt::ExpectIotaBox(values, 0, 0, 4);

  // Rank 1's daemon dies; the job starts it again, on the same ports.
  const std::string rank1 = client->cluster().workers(1).address();
  const std::string port1 = rank1.substr(rank1.rfind(':') + 1);
  ASSERT_EQ(DaemonsWith({dir_.path()}).size(), 2u);
  const std::vector<pid_t> pids =
      DaemonsWith({dir_.path(), absl::StrCat(" --port ", port1, " ")});
  ASSERT_EQ(pids.size(), 1u);
  ASSERT_EQ(::kill(pids[0], SIGKILL), 0);
  ASSERT_NO_FATAL_FAILURE(
      WaitForOutput("rank 1 exited with status 137; restarting it (1 of 3)", 1,
                    absl::Seconds(30)));
  ASSERT_NO_FATAL_FAILURE(
      WaitForOutput("rank 1/2 serving on", 2, absl::Seconds(60)));
  ASSERT_NO_FATAL_FAILURE(
      WaitForOutput("refilled tensor w", 1, absl::Seconds(60)));
  // Both serve again, and the values are whole.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    bool all = true;
    for (const absl::Status& health : client->Health()) all &= health.ok();
    if (all) break;
    ASSERT_LT(absl::Now(), deadline) << JobOutput();
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_OK_AND_ASSIGN(Tensor after, view.Read());
  tt::ExpectIotaBox(after, 0, 0, 4);
  ASSERT_OK_AND_ASSIGN(Tensor box, view.ReadRegion({4, 0}, {4, 4}));
  tt::ExpectIotaBox(box, 4, 0, 4);

  // scancel ends the job and every daemon with it.
  const Ran cancelled = Run("scancel", {job_});
  EXPECT_EQ(cancelled.exit_code, 0) << cancelled.output;
  WaitForJobGone(absl::Seconds(60));
  const absl::Time gone = absl::Now() + absl::Seconds(30);
  while (!DaemonsWith({dir_.path()}).empty() && absl::Now() < gone) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_THAT(DaemonsWith({dir_.path()}), ::testing::IsEmpty()) << JobOutput();
  job_.clear();
}

}  // namespace
}  // namespace tessera
