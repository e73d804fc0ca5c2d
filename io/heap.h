// The C library heap's policy for a process of our own (tessera-server,
// the tessera CLI): keep freed memory for the next allocation instead of
// giving it back to the kernel at every free.
//
// Why: glibc returns the free top of a heap to the kernel (MADV_DONTNEED
// for a thread's arena, sbrk for the main one) whenever it exceeds
// M_TRIM_THRESHOLD, 128 KiB by default. gRPC allocates the buffers it
// receives into on the thread that polls, a few MiB per message, and frees
// them once the message is consumed, so a bulk gRPC transfer gave its
// pages back and faulted them in again for every message. Where a page
// fault is expensive (a virtual machine whose guest faults trap to the
// hypervisor) that dominated: a 256 MiB gRPC write into a daemon took
// 1.27 s, 0.16 s with 32 MiB kept (docs/benchmarks.md, "The wire").
//
// Only for executables we own: a library must not change its host
// process's allocator (the client library leaves it alone; the user guide
// says how an application can choose the same).
//
// Thread-safety: call once, from main(), before other threads start.
#ifndef TESSERA_IO_HEAP_H_
#define TESSERA_IO_HEAP_H_

#include <cstddef>

namespace tessera {

// The free top each heap keeps before glibc trims it.
inline constexpr size_t kKeptFreeHeapBytes = size_t{32} << 20;

// Sets glibc's M_TRIM_THRESHOLD to kKeptFreeHeapBytes, unless the user
// chose one through GLIBC_TUNABLES (glibc.malloc.trim_threshold), which
// stays theirs. Like any trim threshold set explicitly, this also fixes
// M_MMAP_THRESHOLD at its default (128 KiB): glibc stops raising it after
// large frees. Returns whether it set the threshold (false: the user's
// choice kept, or not glibc's allocator, e.g. under a sanitizer).
bool KeepFreedHeapForReuse();

}  // namespace tessera

#endif  // TESSERA_IO_HEAP_H_
