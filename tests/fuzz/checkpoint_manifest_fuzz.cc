// libFuzzer target: checkpoint manifests (server/checkpoint/), which a
// daemon reads from a directory a client names. The input is written as
// manifest.pb of a directory that also holds a small data file, then read
// (ReadCheckpointManifest) and loaded without a rank (LoadStateDict: dense
// entries load, sharded ones fail cleanly). When the first byte is odd the
// manifest's self-checksum is recomputed over the input, so that the
// fuzzer gets past it to the entries.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "server/checkpoint/checkpoint.h"
#include "xxhash.h"

namespace {

// A directory for this process, with a data file "dense.<id>.bin" of 4 KiB
// that fuzzed extents may point at.
const std::string& Directory() {
  static const std::string dir = [] {
    const char* tmp = getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") +
                          "/tessera_manifest_fuzz_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) abort();
    FILE* data = fopen((pattern + "/dense.0000000000000001.bin").c_str(), "wb");
    if (data == nullptr) abort();
    for (int i = 0; i < 4096; ++i) fputc(i * 7, data);
    fclose(data);
    return pattern;
  }();
  return dir;
}

void WriteManifest(const std::string& bytes) {
  const std::string path = Directory() + "/manifest.pb";
  FILE* out = fopen(path.c_str(), "wb");
  if (out == nullptr) abort();
  fwrite(bytes.data(), 1, bytes.size(), out);
  fclose(out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 1) {
    // The trailer a save writes: field 15 (fixed64), XXH3-64 little-endian.
    const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size());
    bytes.push_back(0x79);
    for (int i = 0; i < 8; ++i)
      bytes.push_back(static_cast<char>(sum >> (8 * i)));
  }
  WriteManifest(bytes);
  (void)tessera::ReadCheckpointManifest(Directory());
  (void)tessera::LoadStateDict(Directory());
  return 0;
}
