// VersionWatcher: the versions of one versioned tensor as they are
// published (Client::Watch, docs/versions.md), over a WatchVersions server
// stream of the connected daemon, not by polling.
//
//   auto watcher = client->Watch("w").value();
//   while (true) {
//     absl::StatusOr<int64_t> n = watcher->Next(absl::Seconds(30));
//     ...                                   // each new version, in order
//   }
//
// A thread of the watcher's keeps one stream open, each with a deadline
// (`stream_lifetime`): when it ends (deadline, a daemon restarting or
// unreachable) it opens the next one from the last number it received, so
// versions published meanwhile and still kept come through; one published
// and freed while no stream was open is skipped.
//
// Failure: Next returns DEADLINE_EXCEEDED when nothing was published within
// its timeout (the watcher goes on), NOT_FOUND once the tensor is deleted
// or if there is none, FAILED_PRECONDITION for an unversioned tensor
// (both final), or in a child forked after gRPC started
// (wire/fork_guard.h); a daemon that cannot be reached is retried.
//
// Thread-safety: Next may be called from one thread at a time; the
// destructor ends the stream and joins the thread (in a forked child, whose
// copy of the watcher has no thread, it leaves both alone).
#ifndef TESSERA_CLIENT_VERSION_WATCHER_H_
#define TESSERA_CLIENT_VERSION_WATCHER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "tessera/v1/control.grpc.pb.h"

namespace tessera {

class VersionWatcher {
 public:
  // Watches `name` through `stub` (kept alive by `keepalive`) from the
  // versions after `after` (0: those published from now on). `on_next`,
  // when set, is called with each number Next returns, on Next's thread
  // (the client records it: a later read returns that version or a newer
  // one).
  VersionWatcher(std::shared_ptr<v1::ControlService::Stub> stub,
                 std::shared_ptr<const void> keepalive, std::string name,
                 int64_t after, std::function<void(int64_t)> on_next = nullptr,
                 absl::Duration stream_lifetime = absl::Minutes(1));
  ~VersionWatcher();
  VersionWatcher(const VersionWatcher&) = delete;
  VersionWatcher& operator=(const VersionWatcher&) = delete;

  // The next version published, waiting up to `timeout`.
  absl::StatusOr<int64_t> Next(absl::Duration timeout);

 private:
  void Loop();

  const std::shared_ptr<v1::ControlService::Stub> stub_;
  const std::shared_ptr<const void> keepalive_;
  const std::string name_;
  const std::function<void(int64_t)> on_next_;
  const absl::Duration stream_lifetime_;
  absl::Mutex mu_;
  std::deque<int64_t> ready_ ABSL_GUARDED_BY(mu_);
  int64_t last_ ABSL_GUARDED_BY(mu_);
  // The final error (the tensor is gone), once there is one.
  absl::Status ended_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The stream's context while one is open, to cancel it.
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_VERSION_WATCHER_H_
