// Version ids (docs/versions.md): version n of a versioned tensor is read
// and written by the id "<tensor id>@<n>", which both the daemons
// (server/serve/shard_registry.h) and the client library use. Tensor ids
// themselves ("<group>/<count>") never hold an "@".
//
// Thread-safety: pure functions.
#ifndef TESSERA_WIRE_VERSION_ID_H_
#define TESSERA_WIRE_VERSION_ID_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "tessera/v1/control.pb.h"

namespace tessera {

// "<tensor id>@<number>": the id version `number` of a versioned tensor is
// read and written by.
std::string VersionId(absl::string_view tensor_id, int64_t number);
// Whether `id` is VersionId(tensor_id, n) for some n >= 1.
bool IsVersionOf(absl::string_view id, absl::string_view tensor_id);
// The number of version id `id`; 0 for any other id.
int64_t VersionNumber(absl::string_view id);
// The tensor id a version id belongs to; any other id as it is.
absl::string_view VersionBase(absl::string_view id);
// The id version `number`'s shards are registered under on their daemons:
// version 1 (the tensor as created) under the tensor's own id, later ones
// under VersionId; 0 (an unversioned tensor) the tensor's own id.
std::string RegistrationId(absl::string_view tensor_id, int64_t number);
// "<tensor id>@>=<number>": what a read of a versioned tensor's latest
// published version asks for once the reader knows `number` is published
// (an earlier read returned it, or a watch reported it). A daemon serves
// its latest once that is `number` or newer, waiting a moment for a
// publish it has not yet applied (server/serve/shard_registry.h): a reader
// woken by a publish does not read the version before it from the daemons
// a moment behind, only to read those pieces again. Daemons that predate
// the form answer NOT_FOUND.
std::string AtLeastId(absl::string_view tensor_id, int64_t number);
struct AtLeast {
  // The id the latest version is read by.
  std::string latest_id;
  int64_t number = 0;
};
// The parts of an AtLeastId; nullopt for any other id.
std::optional<AtLeast> ParseAtLeast(absl::string_view id);
// Whether a tensor described as `info` is versioned (versions_kept >= 2;
// 0 and 1 are an unversioned tensor, written in place).
bool Versioned(const v1::TensorInfo& info);

}  // namespace tessera

#endif  // TESSERA_WIRE_VERSION_ID_H_
