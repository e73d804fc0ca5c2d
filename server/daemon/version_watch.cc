#include "server/daemon/version_watch.h"

#include <utility>

namespace tessera::control_internal {

uint64_t VersionWatch::Add(const std::string& name, Listener listener) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  watchers_.emplace(id, Watcher{name, std::move(listener)});
  return id;
}

void VersionWatch::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(id);
}

void VersionWatch::Published(const std::string& name, int64_t number) {
  Tell(name, number);
}

void VersionWatch::Deleted(const std::string& name) { Tell(name, 0); }

void VersionWatch::Tell(const std::string& name, int64_t number) {
  std::vector<Listener> listeners;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, watcher] : watchers_) {
      if (watcher.name == name) listeners.push_back(watcher.listener);
    }
  }
  for (const Listener& listener : listeners) listener(number);
}

}  // namespace tessera::control_internal
