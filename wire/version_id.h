// Version ids (docs/versions.md): version n of a versioned tensor is read
// and written by the id "<tensor id>@<n>", which both the daemons
// (server/serve/shard_registry.h) and the client library use. Tensor ids
// themselves ("<group>/<count>") never hold an "@".
//
// Thread-safety: pure functions.
#ifndef TESSERA_WIRE_VERSION_ID_H_
#define TESSERA_WIRE_VERSION_ID_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

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

}  // namespace tessera

#endif  // TESSERA_WIRE_VERSION_ID_H_
