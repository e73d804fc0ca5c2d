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
// Whether a tensor described as `info` is versioned (versions_kept >= 2;
// 0 and 1 are an unversioned tensor, written in place).
bool Versioned(const v1::TensorInfo& info);

}  // namespace tessera

#endif  // TESSERA_WIRE_VERSION_ID_H_
