// Prometheus metrics of real tessera-server daemons (--metrics-port):
// after known traffic over each transport, every daemon's counters moved by
// exactly the bytes it served, scraped from its HTTP endpoint.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_cluster_test.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonClusterOptions;
using ::testing::HasSubstr;

constexpr int kWorld = 2;
// float32 [512, 256] in two row shards: 256 KiB each, above the daemons'
// memory-file threshold, so the local path can lend them.
constexpr int64_t kShardBytes = 256 * 256 * 4;

// The body of GET http://<address>/metrics ("" when it cannot be had).
std::string Scrape(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return "";
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0) {
    const std::string request =
        "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, request.data(), request.size()) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) {
        response.append(buffer, static_cast<size_t>(n));
      }
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The sum of `name`'s series with (at least) these labels in a scrape; -1
// when there is none.
double Value(const std::string& scrape, const std::string& name,
             const std::map<std::string, std::string>& labels = {}) {
  double sum = -1;
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    if (!absl::ConsumePrefix(&line, name)) continue;
    absl::string_view found_labels;
    if (absl::ConsumePrefix(&line, "{")) {
      const size_t close = line.find('}');
      if (close == absl::string_view::npos) continue;
      found_labels = line.substr(0, close);
      line.remove_prefix(close + 1);
    } else if (line.empty() || line.front() != ' ') {
      continue;  // A longer name.
    }
    bool all = true;
    for (const auto& [label, value] : labels) {
      all = all && absl::StrContains(found_labels,
                                     absl::StrCat(label, "=\"", value, "\""));
    }
    double value = 0;
    if (all && absl::SimpleAtod(absl::StripAsciiWhitespace(line), &value)) {
      sum = std::max(sum, 0.0) + value;
    }
  }
  return sum;
}

double Series(const std::string& scrape, const std::string& name,
              const std::string& transport, const std::string& direction) {
  return Value(scrape, name,
               {{"transport", transport}, {"direction", direction}});
}

class MetricsTest : public ::tessera::testing::DaemonClusterTest {
 protected:
  static void SetUpTestSuite() {
    DaemonClusterOptions options;
    options.world_size = kWorld;
    // Every daemon serves its metrics on a free loopback port.
    options.extra_args = {"--timeout", "10", "--metrics-port", "0"};
    options.server_path = TESSERA_SERVER_PATH;
    StartSuiteCluster(std::move(options));
  }

  // Where `rank` serves its metrics, from its log line "metrics on
  // http://<address>/metrics".
  std::string MetricsAddress(int rank) {
    const std::string log = cluster_->Log(rank);
    const std::string start = "metrics on http://";
    const size_t at = log.find(start);
    if (at == std::string::npos) return "";
    const size_t from = at + start.size();
    return log.substr(from, log.find("/metrics", from) - from);
  }

  // Every daemon's scrape, once `ready(rank, scrape)` holds for each or
  // after 10 s. Some counts land just after the client's call returned: a
  // local-path transfer is counted when its "done" reaches the owner, an op
  // on the other daemons once they passed its last barrier.
  template <typename Ready>
  std::vector<std::string> ScrapeAllWhen(Ready ready) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    std::vector<std::string> scrapes(kWorld);
    while (true) {
      bool all = true;
      for (int r = 0; r < kWorld; ++r) {
        scrapes[r] = Scrape(MetricsAddress(r));
        all = all && ready(r, scrapes[r]);
      }
      if (all || absl::Now() > deadline) return scrapes;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  std::vector<std::string> ScrapeAll() {
    return ScrapeAllWhen([](int, const std::string&) { return true; });
  }

  // Per rank: the transfers, bytes and timed transfers of one transport
  // and direction in `scrapes`.
  static std::vector<std::array<double, 3>> Counts(
      const std::vector<std::string>& scrapes, const std::string& transport,
      const std::string& direction) {
    std::vector<std::array<double, 3>> counts;
    for (const std::string& scrape : scrapes) {
      counts.push_back(
          {Series(scrape, "tessera_transfers_total", transport, direction),
           Series(scrape, "tessera_transfer_bytes_total", transport, direction),
           Series(scrape, "tessera_transfer_seconds_count", transport,
                  direction)});
    }
    return counts;
  }

  // Runs `traffic` and checks that every daemon's counters of `transport`
  // and `direction` moved by one transfer of kShardBytes.
  template <typename Traffic>
  void ExpectOneShardEach(const std::string& transport,
                          const std::string& direction, Traffic traffic) {
    SCOPED_TRACE(absl::StrCat(transport, " ", direction));
    const auto before = Counts(ScrapeAll(), transport, direction);
    traffic();
    // All three series moved: a scrape is not a snapshot, so one taken
    // while the transfer was being counted may show some of them only.
    const auto after =
        Counts(ScrapeAllWhen([&](int r, const std::string& scrape) {
                 const auto now = Counts({scrape}, transport, direction)[0];
                 return now[0] > before[r][0] && now[1] > before[r][1] &&
                        now[2] > before[r][2];
               }),
               transport, direction);
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_GE(before[r][0], 0) << "rank " << r << " has no series";
      EXPECT_EQ(after[r][0] - before[r][0], 1) << "rank " << r;
      EXPECT_EQ(after[r][1] - before[r][1], kShardBytes) << "rank " << r;
      EXPECT_EQ(after[r][2] - before[r][2], 1) << "rank " << r;
    }
  }

  static ShardingSpec Rows() {
    const std::vector<std::string> placements = {"rank:0/cpu", "rank:1/cpu"};
    return *ChunkShardingSpec::Create(0, placements);
  }
};

TEST_F(MetricsTest, EveryDaemonServesItsMetricsOnLoopback) {
  for (int r = 0; r < kWorld; ++r) {
    const std::string address = MetricsAddress(r);
    ASSERT_THAT(address, ::testing::StartsWith("127.0.0.1:"))
        << cluster_->Log(r);
    const std::string scrape = Scrape(address);
    EXPECT_THAT(scrape, HasSubstr("# TYPE tessera_transfer_bytes_total "
                                  "counter"));
    // Every series exists from the start.
    for (const char* transport : {"grpc", "data_plane", "local_path"}) {
      for (const char* direction : {"read", "write"}) {
        EXPECT_GE(Series(scrape, "tessera_transfer_bytes_total", transport,
                         direction),
                  0)
            << transport << " " << direction;
      }
    }
  }
}

TEST_F(MetricsTest, EachTransportCountsTheBytesItServed) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView local,
                       client_->Create("metered", {512, 256}, Rows()));
  ASSERT_OK_AND_ASSIGN(Tensor data, Tensor::Full({512, 256}, 1.5));

  ClientOptions data_plane;
  data_plane.use_local_path = false;
  ASSERT_OK_AND_ASSIGN(auto dp_client,
                       Client::Connect(cluster_->address(0), data_plane));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView over_dp, dp_client->Open("metered"));
  ClientOptions grpc_only = data_plane;
  grpc_only.data_plane = false;
  ASSERT_OK_AND_ASSIGN(auto grpc_client,
                       Client::Connect(cluster_->address(0), grpc_only));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView over_grpc,
                       grpc_client->Open("metered"));

  ExpectOneShardEach("data_plane", "write", [&] {
    ASSERT_OK(over_dp.Write({0, 0}, data));
  });
  ExpectOneShardEach("local_path", "write", [&] {
    ASSERT_OK(local.Write({0, 0}, data));
  });
  ExpectOneShardEach("grpc", "write", [&] {
    ASSERT_OK(over_grpc.Write({0, 0}, data));
  });
  ExpectOneShardEach("data_plane", "read",
                     [&] { ASSERT_OK(over_dp.Read().status()); });
  ExpectOneShardEach("grpc", "read",
                     [&] { ASSERT_OK(over_grpc.Read().status()); });
  ExpectOneShardEach("local_path", "read",
                     [&] { ASSERT_OK(local.Read().status()); });
  ASSERT_OK(client_->Delete("metered"));
}

// Control operations by op and agreed code on every daemon, their wait on
// the coordinator only; gauges, store calls, collectives; and GetStats
// answers the same metrics as the endpoint.
TEST_F(MetricsTest, ControlOperationsAreCountedByCodeOnEveryDaemon) {
  const std::map<std::string, std::string> create_ok = {{"op", "CreateTensor"},
                                                        {"code", "OK"}};
  const std::map<std::string, std::string> create = {{"op", "CreateTensor"}};
  const std::vector<std::string> before = ScrapeAll();

  ASSERT_OK(client_->Create("counted", {64, 64}, Rows()).status());
  const absl::Status twice =
      client_->Create("counted", {64, 64}, Rows()).status();
  ASSERT_FALSE(twice.ok());
  const std::map<std::string, std::string> create_failed = {
      {"op", "CreateTensor"}, {"code", absl::StatusCodeToString(twice.code())}};
  const auto moved = [](const std::string& then, const std::string& now,
                        const std::string& name,
                        const std::map<std::string, std::string>& labels) {
    return std::max(Value(now, name, labels), 0.0) -
           std::max(Value(then, name, labels), 0.0);
  };
  // Once every daemon counted both creates, and then the delete. A scrape
  // reads one family after the other, so it may see an op's seconds but
  // not yet its count (or the reverse): it waits for both.
  const std::vector<std::string> during =
      ScrapeAllWhen([&](int r, const std::string& scrape) {
        return moved(before[r], scrape, "tessera_control_op_seconds_count",
                     create) >= 2 &&
               moved(before[r], scrape, "tessera_control_ops_total",
                     create_ok) >= 1 &&
               moved(before[r], scrape, "tessera_control_ops_total",
                     create_failed) >= 1 &&
               (r != 0 ||
                (moved(before[r], scrape, "tessera_rpc_seconds_count",
                       {{"method",
                         "tessera.v1.ControlService/CreateTensor"}}) >= 2 &&
                 moved(before[r], scrape,
                       "tessera_control_op_wait_seconds_count", create) >= 2));
      });
  ASSERT_OK(client_->Delete("counted"));
  const std::map<std::string, std::string> delete_ok = {{"op", "DeleteTensor"},
                                                        {"code", "OK"}};
  const std::vector<std::string> after =
      ScrapeAllWhen([&](int r, const std::string& scrape) {
        return moved(before[r], scrape, "tessera_control_ops_total",
                     delete_ok) >= 1;
      });
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(
        moved(before[r], during[r], "tessera_control_ops_total", create_ok), 1);
    EXPECT_EQ(
        moved(before[r], during[r], "tessera_control_ops_total", create_failed),
        1);
    EXPECT_EQ(
        moved(before[r], after[r], "tessera_control_ops_total", delete_ok), 1);
    EXPECT_EQ(
        moved(before[r], during[r], "tessera_control_op_seconds_count", create),
        2);
    // The client called rank 0: only there were the calls served, and did
    // the ops wait for their turn.
    EXPECT_EQ(moved(before[r], during[r], "tessera_rpcs_total",
                    {{"method", "tessera.v1.ControlService/CreateTensor"},
                     {"code", "OK"}}),
              r == 0 ? 1 : 0);
    EXPECT_EQ(moved(before[r], during[r], "tessera_rpc_seconds_count",
                    {{"method", "tessera.v1.ControlService/CreateTensor"}}),
              r == 0 ? 2 : 0);
    EXPECT_EQ(moved(before[r], during[r],
                    "tessera_control_op_wait_seconds_count", create),
              r == 0 ? 2 : 0);
    EXPECT_EQ(Value(during[r], "tessera_tensors"), 1);
    EXPECT_EQ(Value(after[r], "tessera_tensors"), 0);
    EXPECT_EQ(Value(during[r], "tessera_rank"), r);
    EXPECT_EQ(Value(during[r], "tessera_world_size"), kWorld);
    EXPECT_EQ(Value(during[r], "tessera_generation"), 1);
    for (int peer = 0; peer < kWorld; ++peer) {
      EXPECT_EQ(
          Value(during[r], "tessera_peer_up", {{"peer", absl::StrCat(peer)}}),
          1);
    }
    // Its shard: 32 rows of 64 float32.
    EXPECT_EQ(Value(during[r], "tessera_shard_bytes", {{"device", "cpu"}}),
              32 * 64 * 4);
    EXPECT_GT(Value(during[r], "tessera_memory_budget_bytes"), 0);
    // Ops agree through collectives and are logged through the store.
    EXPECT_GT(moved(before[r], during[r], "tessera_collective_seconds_count",
                    {{"backend", "gloo"}}),
              0);
    EXPECT_GT(
        Value(during[r], "tessera_store_op_seconds_count", {{"op", "get"}}), 0);
  }
  const std::vector<absl::StatusOr<v1::DaemonStats>> stats = client_->Stats();
  ASSERT_EQ(stats.size(), static_cast<size_t>(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_OK(stats[r].status());
    EXPECT_EQ(stats[r]->rank(), r);
    EXPECT_EQ(
        Value(stats[r]->metrics(), "tessera_control_ops_total", create_ok),
        Value(after[r], "tessera_control_ops_total", create_ok));
  }
}

}  // namespace
}  // namespace tessera
