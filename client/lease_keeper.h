// LeaseKeeper: renews the leases this process holds (docs/versions.md,
// "Leases"): the open versions it began or joined and the pins it took
// with `renewed`, on every daemon of the cluster, each at its own period,
// until the holder ends its Lease (published, aborted, released, or the
// last copy of its VersionWriter or Snapshot destroyed) or a daemon says
// it no longer holds it. A process that dies or stops renews nothing, so
// the daemons drop what it held once the lease ends.
//
// One thread per keeper, started by the first Keep. Each round renews
// every lease that is due in one RenewLeases call per daemon, all calls at
// once, each with a deadline of half the shortest period due (at least
// 100 ms, at most the client's timeout): a dead or stalled daemon costs the
// round that deadline, and the others are renewed meanwhile. A failed call is
// not retried before the next period: the lease is several periods long.
//
// Thread-safety: every method may be called from any thread. Ownership:
// the Cluster owns its keeper and stops it (Stop) before its connections
// go; a Lease refers to its keeper weakly and ends with it.
#ifndef TESSERA_CLIENT_LEASE_KEEPER_H_
#define TESSERA_CLIENT_LEASE_KEEPER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "tessera/v1/control.pb.h"

namespace tessera::internal_client {

struct Worker;

class LeaseKeeper : public std::enable_shared_from_this<LeaseKeeper> {
 public:
  // The daemons to renew on, asked at each round (so that a daemon that
  // restarted elsewhere is reached where it is now).
  using Daemons = std::function<std::vector<std::shared_ptr<const Worker>>()>;

  // What the holder of renewed leases keeps: ending it (End, or
  // destroying the last reference) stops their renewal.
  class Lease {
   public:
    Lease(std::weak_ptr<LeaseKeeper> keeper, int64_t id)
        : keeper_(std::move(keeper)), id_(id) {}
    ~Lease() { End(); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    // Stops renewing (idempotent).
    void End();

   private:
    const std::weak_ptr<LeaseKeeper> keeper_;
    const int64_t id_;
  };

  LeaseKeeper(Daemons daemons, absl::Duration call_timeout)
      : daemons_(std::move(daemons)), call_timeout_(call_timeout) {}
  // Calls Stop().
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Renews `versions` and `pin` (either may be empty) every `every` from
  // now on, on every daemon, until the returned Lease ends.
  std::shared_ptr<Lease> Keep(std::vector<v1::VersionHandle> versions,
                              std::string pin, absl::Duration every);
  // Ends the thread and every renewal; Keep returns leases renewed no
  // more after this.
  void Stop();
  // Leases renewed now (tests).
  int size() const;

 private:
  struct Entry {
    std::vector<v1::VersionHandle> versions;
    std::string pin;
    absl::Duration every;
    absl::Time due;
  };

  void End(int64_t id);
  void Loop();
  // Renews the due entries (taken out of the lock) once on every daemon;
  // drops what a daemon no longer holds.
  void Round(const std::vector<int64_t>& ids,
             const v1::RenewLeasesRequest& request, absl::Duration deadline);

  const Daemons daemons_;
  const absl::Duration call_timeout_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Bumped by Keep and End, to wake the thread.
  int64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // The calls of the round running now, cancelled by Stop.
  std::vector<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::internal_client

#endif  // TESSERA_CLIENT_LEASE_KEEPER_H_
