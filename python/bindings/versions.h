// tessera._tessera.VersionGroup and Snapshot: open versions (client/
// version_writer.h) and pinned ones (client/snapshot.h) for the package's
// tessera.Version, VersionGroup and Snapshot (docs/versions.md). Every
// call releases the GIL while it waits on the daemons; failures raise
// tessera.errors with the daemons' codes.
//
// Thread-safety: as the C++ classes: safe from several Python threads.
#ifndef TESSERA_PYTHON_BINDINGS_VERSIONS_H_
#define TESSERA_PYTHON_BINDINGS_VERSIONS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "client/snapshot.h"
#include "client/version_watcher.h"
#include "client/version_writer.h"
#include "python/bindings/tensor.h"

namespace tessera::python {

namespace py = pybind11;

// (name, number, view) of each version of a group.
using VersionTuple = std::tuple<std::string, int64_t, PyView>;

class PyVersionGroup {
 public:
  explicit PyVersionGroup(VersionWriter writer) : writer_(std::move(writer)) {}
  const std::string& id() const { return writer_.id(); }
  std::vector<VersionTuple> versions() const;
  // (name, number) of each version published.
  std::vector<std::pair<std::string, int64_t>> Publish() const;
  void Abort() const;

 private:
  VersionWriter writer_;
};

class PySnapshot {
 public:
  explicit PySnapshot(Snapshot snapshot) : snapshot_(std::move(snapshot)) {}
  const std::string& id() const { return snapshot_.id(); }
  std::vector<VersionTuple> versions() const;
  void Release() const;

 private:
  Snapshot snapshot_;
};

// Client.watch's source: the next version, waiting up to `timeout`
// seconds with the GIL released; None when none came in that time.
class PyWatcher {
 public:
  explicit PyWatcher(std::unique_ptr<VersionWatcher> watcher)
      : watcher_(std::move(watcher)) {}
  std::optional<int64_t> Next(double timeout) const;

 private:
  std::shared_ptr<VersionWatcher> watcher_;
};

}  // namespace tessera::python

#endif  // TESSERA_PYTHON_BINDINGS_VERSIONS_H_
