// UntilServing: how a test finds out that a cluster which lost a daemon
// (or a host) serves again, as a careful user would: a logged call (a
// create) retried until it works.
//
// An attempt may end unsure: held while the daemons re-form, it ran out of
// its deadline and may still be applied (DEADLINE_EXCEEDED naming its
// request id; docs/control_log.md). A create applied that way makes the
// next attempt find its tensor made (ALREADY_EXISTS), which then counts as
// serving. After attempts that all said they were "not applied", though,
// ALREADY_EXISTS would be the daemons contradicting themselves, and is
// returned as the error.
//
// Thread-safety: a pure function of `attempt`'s outcomes.
#ifndef TESSERA_TESTS_TESTING_UNTIL_SERVING_H_
#define TESSERA_TESTS_TESTING_UNTIL_SERVING_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera::testing {

// Runs `attempt` every 100 ms until it works (or finds its tensor made
// after an unsure attempt) or `within` after `since` passed. OK, or the
// last attempt's error.
inline absl::Status UntilServing(const std::function<absl::Status()>& attempt,
                                 absl::Time since, absl::Duration within) {
  bool unsure = false;
  absl::Status status;
  while (absl::Now() - since < within) {
    status = attempt();
    if (status.ok()) return status;
    if (absl::IsAlreadyExists(status)) {
      if (unsure) return absl::OkStatus();
    } else if (!absl::StrContains(status.message(), "not applied")) {
      unsure = true;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return status;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_UNTIL_SERVING_H_
