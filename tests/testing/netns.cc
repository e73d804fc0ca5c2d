#include "tests/testing/netns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "io/subprocess.h"

namespace tessera::testing {
namespace {

constexpr absl::Duration kCommandTimeout = absl::Seconds(20);

// Whether an executable `ip` is on PATH (as execvpe looks for it).
bool IpOnPath() {
  const char* path = getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/ip");
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(int hosts) {
  if (!IpOnPath()) {
    return absl::FailedPreconditionError(
        "no `ip` command on PATH: install iproute2 (apt-get install "
        "iproute2, or deploy/install-deps.sh)");
  }
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "network namespaces need root (CAP_NET_ADMIN); not root here");
  }
  std::unique_ptr<NetnsHosts> made(new NetnsHosts());
  char dir_template[] = "/tmp/tessera-netns-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  made->dir_ = dir_template;
  const int id = static_cast<int>(getpid());
  const std::string subnet = absl::StrCat("10.213.", id % 250, ".");
  made->bridge_ = absl::StrCat("ts", id, "br");
  made->bridge_address_ = absl::StrCat(subnet, "254");
  // Bridged frames skip iptables (a host's FORWARD policy must not matter).
  if (absl::Status added = made->Ip({"link", "add", made->bridge_, "type",
                                     "bridge", "nf_call_iptables", "0"});
      !added.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create a bridge (no CAP_NET_ADMIN?): ", added.message()));
  }
  RETURN_IF_ERROR(made->Ip(
      {"addr", "add", made->bridge_address_ + "/24", "dev", made->bridge_}));
  RETURN_IF_ERROR(made->Ip({"link", "set", made->bridge_, "up"}));
  for (int h = 0; h < hosts; ++h) {
    const std::string ns = absl::StrCat("tessera-", id, "-h", h);
    const std::string outside = absl::StrCat("ts", id, "v", h);
    const std::string inside = absl::StrCat("ts", id, "p", h);
    const std::string address = absl::StrCat(subnet, h + 1);
    RETURN_IF_ERROR(made->Ip({"netns", "add", ns}));
    made->netns_.push_back(ns);
    made->addresses_.push_back(address);
    RETURN_IF_ERROR(made->Ip(
        {"link", "add", outside, "type", "veth", "peer", "name", inside}));
    RETURN_IF_ERROR(made->Ip({"link", "set", inside, "netns", ns}));
    RETURN_IF_ERROR(
        made->Ip({"-n", ns, "link", "set", inside, "name", "eth0"}));
    RETURN_IF_ERROR(
        made->Ip({"-n", ns, "addr", "add", address + "/24", "dev", "eth0"}));
    RETURN_IF_ERROR(made->Ip({"-n", ns, "link", "set", "eth0", "up"}));
    RETURN_IF_ERROR(made->Ip({"-n", ns, "link", "set", "lo", "up"}));
    RETURN_IF_ERROR(
        made->Ip({"link", "set", outside, "master", made->bridge_}));
    RETURN_IF_ERROR(made->Ip({"link", "set", outside, "up"}));
  }
  // A loaded machine (a parallel ctest) can take seconds to bring new
  // links up: a host is given up on (and the tests skipped) only after
  // several probes.
  for (int h = 0; h < hosts; ++h) {
    absl::Status reached;
    for (int attempt = 1; attempt <= 4; ++attempt) {
      reached = made->Probe(h);
      if (reached.ok()) break;
      absl::SleepFor(absl::Milliseconds(500));
    }
    if (!reached.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "host ", h, " cannot reach the bridge: ", reached.message()));
    }
  }
  return made;
}

NetnsHosts::~NetnsHosts() {
  // Deleting a namespace deletes its end of the veth pair, and with it the
  // other end.
  for (const std::string& ns : netns_) Ip({"netns", "del", ns}).IgnoreError();
  if (!bridge_.empty()) Ip({"link", "del", bridge_}).IgnoreError();
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

absl::Status NetnsHosts::SetLink(int host, bool up) {
  return Ip({"-n", netns_[host], "link", "set", "eth0", up ? "up" : "down"});
}

absl::Status NetnsHosts::Ip(const std::vector<std::string>& args) {
  SpawnOptions spawn;
  spawn.program = "ip";
  spawn.search_path = true;
  spawn.args = args;
  spawn.log_path = absl::StrCat(dir_, "/ip.log");
  spawn.stdin_null = true;
  absl::StatusOr<Subprocess> ip = Subprocess::Spawn(std::move(spawn));
  if (!ip.ok()) return ip.status();
  std::optional<int> status = ip->WaitFor(kCommandTimeout);
  if (!status.has_value()) {
    ip->Kill();
    return absl::InternalError(
        absl::StrCat("ip ", absl::StrJoin(args, " "), " hung"));
  }
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(
        absl::StrCat("ip ", absl::StrJoin(args, " "), ": ", ip->LogTail(512)));
  }
  return absl::OkStatus();
}

absl::Status NetnsHosts::Probe(int host) {
  // A listener on the bridge's address, dialled from inside the host by
  // bash's /dev/tcp.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, bridge_address_.c_str(), &addr.sin_addr);
  socklen_t length = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 1) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    const int error = errno;
    close(fd);
    return absl::InternalError(strerror(error));
  }
  const absl::Status dialled =
      Ip({"netns", "exec", netns_[host], "timeout", "5", "bash", "-c",
          absl::StrCat("exec 3<>/dev/tcp/", bridge_address_, "/",
                       ntohs(addr.sin_port))});
  close(fd);
  return dialled;
}

}  // namespace tessera::testing
