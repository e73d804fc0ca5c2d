// libFuzzer target: store requests (server/store/), which clients and
// peers send to rank 0's StoreService. The input is a sequence of requests
// (a kind byte, a length byte, then the request's wire bytes), applied to a
// HashStore with small limits through the same calls the service makes;
// the store must keep within its limits and answer Check and Delete
// consistently afterwards. Blocking calls (Get, Wait) run with a zero
// timeout.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/store/hash_store.h"
#include "tessera/v1/store.pb.h"

namespace {

using namespace tessera;  // NOLINT: a fuzz target's short names.

std::vector<std::string> KeysOf(
    const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  HashStoreLimits limits;
  limits.max_value_bytes = 64;
  limits.max_total_bytes = 512;
  HashStore store(limits);
  std::vector<std::string> keys;
  size_t at = 0;
  while (at + 2 <= size) {
    const uint8_t kind = data[at] % 7;
    const size_t length = std::min<size_t>(data[at + 1], size - at - 2);
    const std::string bytes(reinterpret_cast<const char*>(data + at + 2),
                            length);
    at += 2 + length;
    switch (kind) {
      case 0: {
        v1::StoreSetRequest request;
        if (!request.ParseFromString(bytes)) break;
        if (store.Set(request.key(), request.value()).ok()) {
          keys.push_back(request.key());
        }
        break;
      }
      case 1: {
        v1::StoreGetRequest request;
        if (request.ParseFromString(bytes)) {
          (void)store.Get(request.key(), absl::ZeroDuration());
        }
        break;
      }
      case 2: {
        v1::StoreAddRequest request;
        if (request.ParseFromString(bytes) &&
            store.Add(request.key(), request.delta()).ok()) {
          keys.push_back(request.key());
        }
        break;
      }
      case 3: {
        v1::StoreCompareSetRequest request;
        if (request.ParseFromString(bytes)) {
          (void)store.CompareSet(request.key(), request.expected(),
                                 request.desired());
        }
        break;
      }
      case 4: {
        v1::StoreDeleteRequest request;
        if (request.ParseFromString(bytes)) (void)store.Delete(request.key());
        break;
      }
      case 5: {
        v1::StoreWaitRequest request;
        if (request.ParseFromString(bytes)) {
          (void)store.Wait(KeysOf(request.keys()), absl::ZeroDuration());
        }
        break;
      }
      case 6: {
        v1::StoreCheckRequest request;
        if (request.ParseFromString(bytes)) {
          (void)store.Check(KeysOf(request.keys()));
        }
        break;
      }
    }
  }
  // Keys that were set answer Check alike and delete at most once.
  for (const std::string& key : keys) {
    absl::StatusOr<bool> set = store.Check({key});
    if (!set.ok()) std::abort();
    absl::StatusOr<bool> deleted = store.Delete(key);
    if (!deleted.ok()) std::abort();
    absl::StatusOr<bool> again = store.Check({key});
    if (!again.ok() || *again) std::abort();
  }
  return 0;
}
