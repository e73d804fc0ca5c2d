// Polls one daemon's own description of the cluster (GetCluster on that
// daemon only, each call bounded by half a second, so that a stalled
// daemon elsewhere delays nothing) until `done` holds: the generation and
// state tests and benchmarks of failures wait for.
//
// Thread-compatible.
#ifndef TESSERA_TESTS_TESTING_DAEMON_STATE_H_
#define TESSERA_TESTS_TESTING_DAEMON_STATE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/control.grpc.pb.h"
#include "wire/auth.h"

namespace tessera::testing {

// The time from `since` until the daemon at `address` reported a state
// satisfying `done`; DEADLINE_EXCEEDED once `timeout` after `since` passed.
inline absl::StatusOr<absl::Duration> TimeUntilDaemonState(
    const std::string& address,
    const std::function<bool(const v1::ClusterInfo&)>& done, absl::Time since,
    absl::Duration timeout) {
  std::unique_ptr<v1::ControlService::Stub> stub =
      v1::ControlService::NewStub(CreateTesseraChannel(address));
  while (absl::Now() - since < timeout) {
    grpc::ClientContext context;
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    v1::ClusterInfo info;
    if (stub->GetCluster(&context, v1::GetClusterRequest(), &info).ok() &&
        done(info)) {
      return absl::Now() - since;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the daemon at ", address, " did not reach the state within ",
      absl::FormatDuration(timeout)));
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_DAEMON_STATE_H_
