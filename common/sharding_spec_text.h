// Text and JSON forms of sharding specs and shard lists, for command lines,
// spec files and machine-readable output. No file I/O here: callers read
// and write the bytes.
//
// Text grammar (whitespace around every piece is ignored):
//
//   sizes      := <int> ( ',' <int> )*            non-negative, e.g. "10,20"
//   spec       := chunk | enum
//   chunk      := 'chunk:dim=' <dim> ':' <placement> ( ',' <placement> )*
//   dim        := an integer, possibly negative ("0", "-1"), or a name
//                 ("H"; always rejected, see below)
//   enum       := ( 'enum:' | 'enumerable:' ) shard ( ';' shard )*
//   shard      := <offsets> ':' <sizes> [ '@' <placement> ]
//   placement  := a RemoteDevice ("rank:0/cpu", "rank:1/cuda:1",
//                 "worker0/cpu"; see device.h)
//
//   chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu
//   enum:0,0:5,5@rank:0/cpu;0,5:5,5@rank:1/cpu;5,0:5,5@rank:2/cpu;5,5:5,5@rank:3/cpu
//
// A shard without '@' has no placement. A shard of a 0-d tensor has empty
// offsets and sizes ("enum::@rank:0/cpu"). Placements cannot contain ',',
// ';' or '@' (no valid RemoteDevice does).
//
// JSON forms (objects; key order is irrelevant on input, unknown keys are
// rejected so that typos do not pass silently):
//
//   {"type": "chunk", "dim": 0, "placements": ["rank:0/cpu", ...]}
//   {"type": "enumerable",
//    "shards": [{"offsets": [0, 0], "sizes": [5, 5],
//                "placement": "rank:0/cpu"}, ...]}
//
// "type" may also be "enum". "dim" may be a string (a named dimension).
// A shard's "placement" may be null or absent (no placement). A bare JSON
// array of shard objects is accepted as an enumerable spec, so that the
// output of ShardsToJson (`tessera plan --json`) can be fed back as is.
//
// Failure: every function returning a status reports the user's mistake as
// INVALID_ARGUMENT with a one-line message naming the offending piece and
// the expected form, except that a named chunk dimension is UNIMPLEMENTED
// "ChunkShardingSpec does not support named dimension yet!" (as PyTorch,
// from ChunkShardingSpec::CreateNamed). Errors found by the model
// (RemoteDevice::Parse, ShardMetadata::Create, EnumerableShardingSpec::Create,
// e.g. "Shards ... overlap") keep their code and wording. Whether the spec
// fits a tensor (dim in range, shards covering it) is not checked here but
// by BuildMetadata (sharding_spec.h).
//
// All functions are pure and thread-safe; none throws.
#ifndef TESSERA_COMMON_SHARDING_SPEC_TEXT_H_
#define TESSERA_COMMON_SHARDING_SPEC_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/shard_metadata.h"
#include "common/sharding_spec.h"

namespace tessera {

// Parses a tensor size, "10,20" -> {10, 20}. At least one entry; each a
// non-negative decimal integer that fits in int64. INVALID_ARGUMENT
// "Invalid size '10,-2': sizes must be non-negative integers separated by
// commas" (naming the bad entry) otherwise.
absl::StatusOr<std::vector<int64_t>> ParseSizes(absl::string_view text);

// Parses the text form of a spec (grammar above).
absl::StatusOr<ShardingSpec> ParseShardingSpec(absl::string_view text);

// Parses the JSON form of a spec (above). Malformed JSON, missing fields
// and fields of the wrong type are INVALID_ARGUMENT naming the field
// ("shards[1].sizes[0]").
absl::StatusOr<ShardingSpec> ShardingSpecFromJson(absl::string_view json);

// The text form; ParseShardingSpec gives back an equal spec. Enumerable
// specs print with the "enum:" prefix.
std::string ShardingSpecToText(const ShardingSpec& spec);

// The JSON form, on one line; ShardingSpecFromJson gives back an equal spec.
std::string ShardingSpecToJson(const ShardingSpec& spec);

// A JSON array, on one line, of {"offsets": [...], "sizes": [...],
// "placement": "rank:0/cpu" or null}: the shard objects of the enumerable
// JSON form, in order.
std::string ShardsToJson(absl::Span<const ShardMetadata> shards);

}  // namespace tessera

#endif  // TESSERA_COMMON_SHARDING_SPEC_TEXT_H_
