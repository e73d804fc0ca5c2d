// VersionWatch: who watches which versioned tensor on this daemon
// (ControlService.WatchVersions, docs/versions.md). The version ops tell it
// each version this daemon publishes (after the daemons agreed, in log
// order) and each versioned tensor deleted; it tells every watcher of
// that tensor.
//
// Thread-safety: every method may be called from any thread. Listeners are
// called outside the watch's lock (a listener may start writes on its
// stream, which gRPC may complete on the same thread), in publish order
// per tensor (the version ops publish one at a time); a listener may still
// be called once just after Remove, so it must hold what it uses itself.
#ifndef TESSERA_SERVER_DAEMON_VERSION_WATCH_H_
#define TESSERA_SERVER_DAEMON_VERSION_WATCH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tessera::control_internal {

class VersionWatch {
 public:
  // Called with each version number published; with 0 once the tensor is
  // deleted (then never again).
  using Listener = std::function<void(int64_t number)>;

  // Starts telling `listener` about `name`; returns its id for Remove.
  uint64_t Add(const std::string& name, Listener listener);
  void Remove(uint64_t id);
  void Published(const std::string& name, int64_t number);
  void Deleted(const std::string& name);

 private:
  struct Watcher {
    std::string name;
    Listener listener;
  };
  void Tell(const std::string& name, int64_t number);

  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Watcher> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_VERSION_WATCH_H_
