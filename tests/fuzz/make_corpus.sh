#!/usr/bin/env bash
# Writes the seed corpora of tests/fuzz/corpus/ (checked in; rerun after a
# protocol change): small valid inputs of every fuzz target, encoded with
# protoc from the text below. Needs protoc (protobuf-compiler) and python3.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
out=corpus
rm -rf "$out"
mkdir -p "$out"/{sharding_spec_text_fuzz,proto_convert_fuzz,chunk_codec_fuzz,npy_fuzz,checkpoint_manifest_fuzz,store_request_fuzz,data_plane_request_fuzz}

enc() {  # enc MESSAGE < text  -> wire bytes on stdout
  protoc -I "$root/proto" --encode="tessera.v1.$1" \
    tessera/v1/control.proto tessera/v1/shard.proto tessera/v1/store.proto \
    tessera/v1/checkpoint.proto
}
# A byte, then stdin.
with_byte() { printf "\\x$(printf %02x "$1")"; cat; }
# A data-plane frame: a little-endian u32 length, then stdin.
frame32() { local f; f=$(mktemp); cat >"$f"; python3 -c 'import struct, sys; sys.stdout.buffer.write(struct.pack("<I", int(sys.argv[1])))' "$(stat -c %s "$f")"; cat "$f"; rm -f "$f"; }
# A data-plane chunk prefix: offset, length, XXH3 (any: the server checks).
prefix() { python3 -c 'import struct, sys; sys.stdout.buffer.write(struct.pack("<qqQ", int(sys.argv[1]), int(sys.argv[2]), 42))' "$1" "$2"; }
# A length byte, then stdin (< 256 bytes).
framed() { local f; f=$(mktemp); cat >"$f"; printf "\\x$(printf %02x "$(stat -c %s "$f")")"; cat "$f"; rm -f "$f"; }

# --- Spec text and JSON.
d=$out/sharding_spec_text_fuzz
echo -n 'chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu' >"$d/chunk"
echo -n 'chunk:dim=-1:rank:0/cuda:0,worker1/cpu' >"$d/chunk_cuda"
echo -n 'enum:0,0:8,8@rank:0/cpu;0,8:8,8@rank:1/cpu;8,0:8,8@rank:2/cpu;8,8:8,8@rank:3/cpu' >"$d/enum"
echo -n '{"type": "chunk", "dim": 1, "placements": ["rank:0/cpu", "rank:1/cpu"]}' >"$d/json_chunk"
echo -n '[{"offsets": [0, 0], "sizes": [16, 16], "placement": "rank:0/cpu"}]' >"$d/json_shards"
echo -n '10,20' >"$d/sizes"

# --- Protobuf to model: a kind byte (proto_convert_fuzz.cc), then a message.
d=$out/proto_convert_fuzz
spec='chunk { dim_index: 0 placements { rank: 0 device { type: DEVICE_TYPE_CPU } } placements { rank: 1 device { type: DEVICE_TYPE_CPU } } }'
echo "$spec" | enc ShardingSpec | with_byte 0 >"$d/spec"
echo 'shards_metadata { shard_offsets: [0, 0] shard_sizes: [8, 4] placement { rank: 0 device { type: DEVICE_TYPE_CPU } } } shards_metadata { shard_offsets: [8, 0] shard_sizes: [8, 4] placement { worker_name: "worker1" device { type: DEVICE_TYPE_CPU } } } size: [16, 4] tensor_properties { dtype: DTYPE_FLOAT32 }' \
  | enc ShardedTensorMetadata | with_byte 1 >"$d/metadata"
echo 'size: [16, 4] tensor_properties { dtype: DTYPE_FLOAT32 layout: LAYOUT_STRIDED memory_format: MEMORY_FORMAT_CONTIGUOUS } shard_dims: [2, 2, 2] shard_offsets: [0, 0, 8, 0, 12, 0] shard_sizes: [8, 4, 4, 4, 4, 4] placements { rank: 0 device { type: DEVICE_TYPE_CPU } } placements { worker_name: "worker1" device { type: DEVICE_TYPE_CUDA index: 0 } } placement_index: [1, 2, 0]' \
  | enc PackedShardedTensorMetadata | with_byte 1 >"$d/packed_metadata"
echo 'shard_offsets: [0, 4] shard_sizes: [2, 2] placement { rank: 3 device { type: DEVICE_TYPE_CUDA index: 1 } }' \
  | enc ShardMetadata | with_byte 2 >"$d/shard"
echo 'worker_name: "trainer3" device { type: DEVICE_TYPE_CPU }' | enc RemoteDevice | with_byte 3 >"$d/device"
echo "name: \"w\" sizes: [16, 16] dtype: DTYPE_FLOAT32 spec { $spec }" | enc CreateTensorRequest | with_byte 4 >"$d/create"
echo 'name: "w" spec { enumerable { shards { shard_offsets: [0, 0, 0] shard_sizes: [7, 5, 3] placement { rank: 0 device { type: DEVICE_TYPE_CPU } } } } }' \
  | enc ReshardRequest | with_byte 5 >"$d/reshard"

# --- Shard streams: length-framed ShardChunks (header first), then the
# same as a data-plane header and prefixed payloads.
d=$out/chunk_codec_fuzz
header='metadata { shard_offsets: [0, 0] shard_sizes: [16, 16] placement { rank: 0 device { type: DEVICE_TYPE_CPU } } } dtype: DTYPE_FLOAT32 sizes: [16, 16] total_bytes: 1024'
{
  echo "header { $header } offset: 0 data: \"0123456789abcdef\" checksum: 42" | enc ShardChunk | framed
  echo 'offset: 16 data: "0123456789abcdef0123456789abcdef" checksum: 7' | enc ShardChunk | framed
} >"$d/grpc_stream"
{
  echo "$header" | enc ShardHeader | framed
  { printf '\0\0\0\0\0\0\0\0\x10\0\0\0\0\0\0\0\x2a\0\0\0\0\0\0\0'; printf '0123456789abcdef'; } | framed
} >"$d/data_plane"

# --- .npy: version 1.0, float32 (2, 3), and a 0-d bool.
d=$out/npy_fuzz
python3 - "$d" <<'PY'
import struct, sys
def npy(descr, shape, data):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data
open(sys.argv[1] + "/f4_2x3", "wb").write(npy("<f4", "(2, 3)", struct.pack("<6f", *range(6))))
open(sys.argv[1] + "/bool_scalar", "wb").write(npy("|b1", "()", b"\x01"))
open(sys.argv[1] + "/i8_empty", "wb").write(npy("<i8", "(0, 4)", b""))
PY

# --- Checkpoint manifests: a first byte (odd: the fuzz target appends the
# checksum), then a manifest whose dense entries point into the target's
# 4 KiB data file, and one with a sharded entry.
d=$out/checkpoint_manifest_fuzz
echo 'format_version: 2 entries { name: "bias" dense { dtype: DTYPE_FLOAT32 sizes: [4, 4] data { file: "dense.0000000000000001.bin" offset: 0 length: 64 block_bytes: 32 block_xxh3: [1, 2] } } }' \
  | enc CheckpointManifest | with_byte 1 >"$d/dense"
echo "format_version: 2 entries { name: \"w\" sharded { metadata { shards_metadata { shard_offsets: [0] shard_sizes: [4] placement { rank: 0 device { type: DEVICE_TYPE_CPU } } } size: [4] tensor_properties { dtype: DTYPE_FLOAT32 } } group_global_ranks: [0] world_size: 1 sharding_spec { chunk { dim_index: 0 placements { rank: 0 device { type: DEVICE_TYPE_CPU } } } } shards { owner_rank: 0 data { file: \"dense.0000000000000001.bin\" offset: 64 length: 16 block_bytes: 16 block_xxh3: [3] } } } }" \
  | enc CheckpointManifest | with_byte 3 >"$d/sharded"
echo 'format_version: 1 entries { name: "old" dense { dtype: DTYPE_INT64 sizes: [2] data { file: "dense.0000000000000001.bin" offset: 128 length: 16 block_bytes: 16 block_xxh3: [5] } } }' \
  | enc CheckpointManifest | with_byte 0 >"$d/version1"

# --- Store requests: kind byte, length byte, request (store_request_fuzz.cc).
d=$out/store_request_fuzz
{
  printf '\x00'; echo 'key: "control/seq" value: "41"' | enc StoreSetRequest | framed
  printf '\x02'; echo 'key: "control/seq" delta: 1' | enc StoreAddRequest | framed
  printf '\x03'; echo 'key: "k" expected: "" desired: "v"' | enc StoreCompareSetRequest | framed
  printf '\x06'; echo 'keys: ["k", "control/seq"]' | enc StoreCheckRequest | framed
  printf '\x01'; echo 'key: "k" timeout_ms: 0' | enc StoreGetRequest | framed
  printf '\x05'; echo 'keys: ["missing"] timeout_ms: 0' | enc StoreWaitRequest | framed
  printf '\x04'; echo 'key: "k"' | enc StoreDeleteRequest | framed
} >"$d/sequence"
# --- Data-plane connections (data_plane_request_fuzz.cc): a byte picking
# the magic (0: TSRBULK1 ... 3: TSRBULK4), then the connection's bytes.
d=$out/data_plane_request_fuzz
fetch='tensor_id: "t" shard_index: 0 region_offsets: [2, 0] region_sizes: [3, 16]'
write='tensor_id: "t" shard_index: 0 region_offsets: [4, 0] region_sizes: [1, 16] dtype: DTYPE_FLOAT32 total_bytes: 64 chunk_bytes: 4096'
{ printf '\x00'; echo "$fetch" | enc FetchShardRequest | frame32; } >"$d/fetch"
{
  printf '\x02'
  echo "fetch { $fetch }" | enc DataPlaneRequest | frame32
  echo "write { $write }" | enc DataPlaneRequest | frame32
  prefix 0 32; printf '0123456789abcdef0123456789abcdef'
  prefix 32 32; printf 'fedcba9876543210fedcba9876543210'
} >"$d/fetch_then_write"
{
  printf '\x03'; printf 'a-token' | frame32
  echo "write { $write replica: true }" | enc DataPlaneRequest | frame32
} >"$d/token_write"
{
  printf '\x02'
  echo 'describe_digest { name: "t" }' | enc DataPlaneRequest | frame32
  echo 'describe_digest { name: "missing" }' | enc DataPlaneRequest | frame32
  echo "fetch { $fetch }" | enc DataPlaneRequest | frame32
} >"$d/describe_digest"

# --- Regressions: inputs that once crashed a target (base64), kept as seeds.
# proto_convert_fuzz: a chunk spec over a dimension of ~2^63 entries
# (ChunkSplitSize overflowed).
echo 'BBD///////////8KEgiaGgYSFAoKEiIUChIIAFoGCAAaAggBGgYICRoCCAE=' \
  | base64 -d >"$out/proto_convert_fuzz/regression-chunk-split-overflow"

echo "seed corpora written to $(pwd)/$out"
