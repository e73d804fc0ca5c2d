#include "common/tensor/tensor.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// ---- Helpers that read tensors without going through the code under test.

// Element at `index` (any strides) as a double: the real part for complex
// dtypes, 0/1 for bool.
double At(const Tensor& t, absl::Span<const int64_t> index) {
  int64_t offset = 0;
  for (size_t d = 0; d < index.size(); ++d) offset += index[d] * t.strides()[d];
  return DispatchDType(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return ToDouble(t.data<T>()[offset]);
  });
}

// Imaginary part of a complex element.
double ImagAt(const Tensor& t, absl::Span<const int64_t> index) {
  int64_t offset = 0;
  for (size_t d = 0; d < index.size(); ++d) offset += index[d] * t.strides()[d];
  if (t.dtype() == DType::kComplex64) {
    return t.data<std::complex<float>>()[offset].imag();
  }
  return t.data<std::complex<double>>()[offset].imag();
}

// Advances a row-major index over `sizes`; false after the last one.
bool NextIndex(std::vector<int64_t>& index, absl::Span<const int64_t> sizes) {
  for (size_t d = index.size(); d-- > 0;) {
    if (++index[d] < sizes[d]) return true;
    index[d] = 0;
  }
  return false;
}

// Every element in row-major order, read by strides.
std::vector<double> Values(const Tensor& t) {
  std::vector<double> out;
  if (t.numel() == 0) return out;
  std::vector<int64_t> index(t.dim(), 0);
  do {
    out.push_back(At(t, index));
  } while (NextIndex(index, t.sizes()));
  return out;
}

// A CPU tensor holding 0, 1, 2, ... (mod `modulus`) in `dtype`.
absl::StatusOr<Tensor> Iota(std::vector<int64_t> sizes, DType dtype,
                            int64_t modulus = 1 << 20) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<double>(i % modulus);
  absl::StatusOr<Tensor> doubles = Tensor::FromVector<double>(values, sizes);
  if (!doubles.ok()) return doubles.status();
  return doubles->ToDType(dtype);
}

std::string DTypeTestName(const ::testing::TestParamInfo<DType>& info) {
  return std::string(DTypeName(info.param));
}

// ---- Storage ---------------------------------------------------------------

TEST(StorageTest, CpuAllocationIsAligned) {
  for (size_t n : {1u, 7u, 64u, 1000u, 1u << 20}) {
    ASSERT_OK_AND_ASSIGN(auto storage,
                         Storage::Allocate(n, Device::Cpu(), false));
    ASSERT_NE(storage->data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(storage->data()) % 64, 0u);
    EXPECT_EQ(storage->nbytes(), n);
    EXPECT_FALSE(storage->pinned());
    EXPECT_TRUE(storage->device().is_cpu());
    std::memset(storage->data(), 0xAB, n);  // Writable end to end.
  }
}

// With sharing on, large allocations are memory files unless they ask for
// private memory (fetched copies, staging, collective buffers), and the
// private ones are as usable. A new memory file is known zero (Zeros then
// writes nothing); heap memory, which may be reused, never is.
TEST(StorageTest, PrivateAllocationsAreNeverShared) {
  SetHostMemorySharing(4096);
  absl::Cleanup off = [] { DisableHostMemorySharing(); };
  const size_t bytes = size_t{4} << 20;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> shared,
                       Storage::Allocate(bytes, Device::Cpu(), false));
  EXPECT_GE(shared->shared_memory_fd(), 0);
  EXPECT_TRUE(shared->allocated_zeroed());
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Storage> mine,
      Storage::Allocate(bytes, Device::Cpu(), false, HostSharing::kPrivate));
  EXPECT_EQ(mine->shared_memory_fd(), -1);
  EXPECT_FALSE(mine->allocated_zeroed());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> small,
                       Storage::Allocate(64, Device::Cpu(), false));
  EXPECT_FALSE(small->allocated_zeroed());
  std::memset(mine->data(), 7, bytes);
  EXPECT_EQ(static_cast<const char*>(mine->data())[bytes - 1], 7);
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Tensor::Empty({1 << 20}, TensorOptions().Private()));
  EXPECT_EQ(t.storage()->shared_memory_fd(), -1);
  ASSERT_OK_AND_ASSIGN(Tensor u, Tensor::Empty({1 << 20}));
  EXPECT_GE(u.storage()->shared_memory_fd(), 0);
}

// A memory file's pages are freed with its storage, also while another
// process maps the file (a local-path client keeps its mapping of a lent
// file for the next lease): what a daemon's budget gave back is free.
TEST(StorageTest, FreeingSharedMemoryFreesPagesOthersStillMap) {
  SetHostMemorySharing(4096);
  absl::Cleanup off = [] { DisableHostMemorySharing(); };
  ASSERT_OK_AND_ASSIGN(Tensor shard, Tensor::Empty({1 << 20}));
  const size_t bytes = shard.nbytes();
  const int fd = shard.storage()->shared_memory_fd();
  ASSERT_GE(fd, 0);
  std::memset(shard.data_ptr(), 0x5a, bytes);
  // Another mapping of the file, as a client's through the descriptor it
  // was lent (reopened read-only, as the local path lends it).
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const int reader = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  void* view = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, reader, 0);
  close(reader);
  ASSERT_NE(view, MAP_FAILED);
  absl::Cleanup unmap = [&] { munmap(view, bytes); };
  ASSERT_EQ(static_cast<const char*>(view)[bytes - 1], 0x5a);
  const auto resident = [&] {
    std::vector<unsigned char> pages(bytes / 4096 + 1);
    EXPECT_EQ(mincore(view, bytes, pages.data()), 0);
    return std::count_if(pages.begin(), pages.end(),
                         [](unsigned char p) { return (p & 1) != 0; });
  };
  EXPECT_GT(resident(), 0);
  shard = Tensor();  // Its storage freed.
  EXPECT_EQ(resident(), 0);
}

// The read-only description the local path lends: opened once, kept and
// closed with the storage, one for concurrent first callers.
TEST(StorageTest, ReadOnlyMemoryFdIsOpenedOnceAndClosedWithTheStorage) {
  SetHostMemorySharing(4096);
  absl::Cleanup off = [] { DisableHostMemorySharing(); };
  ASSERT_OK_AND_ASSIGN(Tensor shard, Tensor::Empty({1 << 20}));
  std::vector<int> seen(4, -1);
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&, i] {
      absl::StatusOr<int> fd = shard.storage()->ReadOnlyMemoryFd();
      if (fd.ok()) seen[i] = *fd;
    });
  }
  for (std::thread& caller : callers) caller.join();
  ASSERT_GE(seen[0], 0);
  EXPECT_THAT(seen, ::testing::Each(seen[0]));
  ASSERT_OK_AND_ASSIGN(const int fd, shard.storage()->ReadOnlyMemoryFd());
  EXPECT_EQ(fd, seen[0]);
  EXPECT_NE(fd, shard.storage()->shared_memory_fd());
  EXPECT_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  std::memset(shard.data_ptr(), 0x3c, shard.nbytes());
  char byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, 12345), 1);
  EXPECT_EQ(byte, 0x3c);
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0),
            MAP_FAILED);
  // A writer's lease gets a description of its own, the caller's to close.
  ASSERT_OK_AND_ASSIGN(const int writable,
                       shard.storage()->ReopenMemoryFile(/*writable=*/true));
  EXPECT_NE(writable, fd);
  EXPECT_EQ(fcntl(writable, F_GETFL) & O_ACCMODE, O_RDWR);
  const char seven = 7;
  ASSERT_EQ(pwrite(writable, &seven, 1, 12345), 1);
  EXPECT_EQ(static_cast<const char*>(shard.data_ptr())[12345], 7);
  close(writable);
  shard = Tensor();
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);  // Closed with the storage.

  ASSERT_OK_AND_ASSIGN(Tensor private_memory,
                       Tensor::Empty({1 << 20}, TensorOptions().Private()));
  EXPECT_THAT(private_memory.storage()->ReadOnlyMemoryFd(),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  EXPECT_THAT(private_memory.storage()->ReopenMemoryFile(/*writable=*/true),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
}

// A lent storage's read-only descriptor counts against the descriptors
// shared storages may hold (half of RLIMIT_NOFILE): refused at the limit
// (the local path then lends nothing and the client uses a stream), given
// back with its storage.
TEST(StorageTest, ReadOnlyDescriptorsCountAgainstTheSharedLimit) {
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit low = saved;
  low.rlim_cur = 64;  // 32 for shared storages.
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  SetHostMemorySharing(4096);
  absl::Cleanup restore = [&] {
    DisableHostMemorySharing();
    setrlimit(RLIMIT_NOFILE, &saved);
  };
  std::vector<std::shared_ptr<Storage>> shared;
  for (int i = 0; i < 64; ++i) {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> storage,
                         Storage::Allocate(8192, Device::Cpu(), false));
    if (storage->shared_memory_fd() < 0) break;  // The heap: at the limit.
    shared.push_back(std::move(storage));
  }
  ASSERT_GE(shared.size(), 2u);
  ASSERT_LE(shared.size(), 32u);
  EXPECT_THAT(shared[0]->ReadOnlyMemoryFd(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("descriptors")));
  shared.pop_back();  // One descriptor free.
  ASSERT_OK(shared[0]->ReadOnlyMemoryFd().status());
  EXPECT_THAT(shared[1]->ReadOnlyMemoryFd(),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  shared.erase(shared.begin());  // Both of its descriptors free.
  ASSERT_OK(shared[0]->ReadOnlyMemoryFd().status());
  ASSERT_OK(shared[1]->ReadOnlyMemoryFd().status());
}

// Zeros is all zeros whether it wrote them (heap memory reused dirty) or
// the memory file came zero (StorageTest.PrivateAllocationsAreNeverShared).
TEST(StorageTest, ZerosIsZeroFromEveryKindOfHostMemory) {
  SetHostMemorySharing(4096);
  absl::Cleanup off = [] { DisableHostMemorySharing(); };
  for (const TensorOptions& options :
       {TensorOptions(), TensorOptions().Private()}) {
    for (int64_t n : {int64_t{16}, int64_t{1} << 20}) {
      for (int round = 0; round < 3; ++round) {
        ASSERT_OK_AND_ASSIGN(Tensor dirty, Tensor::Empty({n}, options));
        std::memset(dirty.data_ptr(), 0x5a, dirty.nbytes());
      }
      ASSERT_OK_AND_ASSIGN(Tensor zeros, Tensor::Zeros({n}, options));
      const auto* bytes_of =
          static_cast<const unsigned char*>(zeros.data_ptr());
      EXPECT_TRUE(std::all_of(bytes_of, bytes_of + zeros.nbytes(),
                              [](unsigned char b) { return b == 0; }))
          << n;
    }
  }
}

// Why the process's host buffer cache is not as the tests below expect
// (off, or sized by the environment), or "" when it is.
std::string HostCacheOff() {
#if defined(__SANITIZE_ADDRESS__)
  return "the cache is off under AddressSanitizer";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return "the cache is off under AddressSanitizer";
#endif
#endif
  if (std::getenv("TESSERA_HOST_CACHE_BYTES") != nullptr) {
    return "TESSERA_HOST_CACHE_BYTES is set";
  }
  return "";
}

// Large private buffers are kept when freed and handed to the next
// allocation of the same size (the process's host buffer cache); a live
// buffer never is, and Zeros still zeroes a reused one.
TEST(StorageTest, FreedLargeBuffersAreReusedForTheSameSize) {
  if (const std::string off = HostCacheOff(); !off.empty()) {
    GTEST_SKIP() << off;
  }
  const size_t bytes = size_t{6} << 20;
  void* first = nullptr;
  {
    ASSERT_OK_AND_ASSIGN(
        std::shared_ptr<Storage> storage,
        Storage::Allocate(bytes, Device::Cpu(), false, HostSharing::kPrivate));
    first = storage->data();
    std::memset(first, 0x5a, bytes);
  }
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Storage> again,
      Storage::Allocate(bytes, Device::Cpu(), false, HostSharing::kPrivate));
  EXPECT_EQ(again->data(), first);
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Storage> other,
      Storage::Allocate(bytes, Device::Cpu(), false, HostSharing::kPrivate));
  EXPECT_NE(other->data(), again->data());
  // Another size does not take it.
  void* held = again->data();
  again.reset();
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Storage> larger,
      Storage::Allocate(bytes + (size_t{2} << 20), Device::Cpu(), false,
                        HostSharing::kPrivate));
  EXPECT_NE(larger->data(), held);
  // Zeros on a reused buffer is all zeros.
  ASSERT_OK_AND_ASSIGN(
      Tensor zeros,
      Tensor::Zeros({static_cast<int64_t>(bytes)},
                    TensorOptions().WithDType(DType::kUInt8).Private()));
  EXPECT_EQ(zeros.storage()->data(), held);
  const auto* data = static_cast<const uint8_t*>(zeros.data_ptr());
  EXPECT_TRUE(
      std::all_of(data, data + bytes, [](uint8_t b) { return b == 0; }));
}

// A buffer as large as the whole cache (256 MiB by default) is kept too:
// `x = shard.to_here()` in a loop allocates each result while the
// previous one lives, then frees that one, which the next result takes.
TEST(StorageTest, ABufferAsLargeAsTheCacheIsReused) {
  if (const std::string off = HostCacheOff(); !off.empty()) {
    GTEST_SKIP() << off;
  }
  const size_t bytes = size_t{256} << 20;
  const auto allocate = [&] {
    return Storage::Allocate(bytes, Device::Cpu(), false,
                             HostSharing::kPrivate);
  };
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> first, allocate());
  void* const freed = first->data();
  // A fresh mapping at the same address would read zeros, not this.
  std::memset(freed, 0x5a, 4096);
  // The next result, allocated while the previous one lives.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> second, allocate());
  first.reset();
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> third, allocate());
  EXPECT_EQ(third->data(), freed);
  EXPECT_EQ(static_cast<const uint8_t*>(third->data())[4095], 0x5a);
  EXPECT_NE(third->data(), second->data());
}

TEST(StorageTest, ZeroBytesAllocateNothing) {
  for (bool pinned : {false, true}) {
    ASSERT_OK_AND_ASSIGN(auto storage,
                         Storage::Allocate(0, Device::Cpu(), pinned));
    EXPECT_EQ(storage->nbytes(), 0u);
    EXPECT_EQ(storage->data(), nullptr);
    EXPECT_EQ(storage->pinned(), pinned);
  }
}

TEST(StorageTest, MetaAllocatesNothing) {
  ASSERT_OK_AND_ASSIGN(auto storage,
                       Storage::Allocate(1 << 30, Device::Meta(), false));
  EXPECT_EQ(storage->data(), nullptr);
  EXPECT_EQ(storage->nbytes(), size_t{1} << 30);
  EXPECT_TRUE(storage->device().is_meta());
}

TEST(StorageTest, PinnedSmallAllocationSucceeds) {
  ASSERT_OK_AND_ASSIGN(auto storage,
                       Storage::Allocate(1024, Device::Cpu(), true));
  ASSERT_NE(storage->data(), nullptr);
  EXPECT_TRUE(storage->pinned());
  EXPECT_EQ(storage->nbytes(), 1024u);
  std::memset(storage->data(), 1, 1024);
}

TEST(StorageTest, ManyPinnedAllocationsAreReleased) {
  // 64 x 1 MiB locked and freed one at a time stays under an 8 MiB
  // RLIMIT_MEMLOCK only if the destructor unlocks.
  for (int i = 0; i < 64; ++i) {
    ASSERT_OK_AND_ASSIGN(auto storage,
                         Storage::Allocate(1 << 20, Device::Cpu(), true));
    EXPECT_TRUE(storage->pinned());
  }
}

TEST(StorageTest, ImpossibleAllocationIsResourceExhausted) {
  const size_t huge = size_t{1} << 62;
  for (bool pinned : {false, true}) {
    EXPECT_THAT(Storage::Allocate(huge, Device::Cpu(), pinned),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("4611686018427387904 bytes")));
  }
}

TEST(StorageTest, PinningBeyondMemlockLimitIsResourceExhausted) {
  if (CudaAvailable()) GTEST_SKIP() << "pinned memory comes from CUDA here";
#ifdef TESSERA_TEST_UNDER_ASAN
  GTEST_SKIP() << "AddressSanitizer turns mlock into a no-op";
#endif
  struct rlimit limit;
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &limit), 0);
  constexpr size_t kBytes = 64 << 20;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= kBytes) {
    GTEST_SKIP() << "RLIMIT_MEMLOCK allows locking " << kBytes << " bytes";
  }
  // Root (CAP_IPC_LOCK) ignores RLIMIT_MEMLOCK, so the child gives up root
  // before asking.
  EXPECT_EXIT(
      {
        if (geteuid() == 0 && setuid(65534) != 0) std::_Exit(3);
        int code = 2;
        {  // Destroyed before _Exit, so leak checkers see no leak.
          auto storage = Storage::Allocate(kBytes, Device::Cpu(), true);
          if (!storage.ok()) {
            fprintf(stderr, "%s\n", storage.status().ToString().c_str());
            code =
                storage.status().code() == absl::StatusCode::kResourceExhausted
                    ? 0
                    : 1;
          }
        }
        std::_Exit(code);
      },
      ::testing::ExitedWithCode(0), "Cannot pin 67108864 bytes.*mlock");
}

TEST(StorageTest, PinnedOffTheCpuIsInvalid) {
  EXPECT_THAT(Storage::Allocate(16, Device::Meta(), true),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("meta")));
}

// Pinned buffers (cudaHostAlloc) are kept when freed too, by a cache of
// their own, and handed to the next pinned allocation of the same page
// count: staging a transfer to or from a GPU then pins nothing.
TEST(StorageTest, FreedPinnedBuffersAreReusedForTheSameSize) {
  if (!CudaAvailable()) GTEST_SKIP() << "pinned memory is mlock'ed here";
  if (std::getenv("TESSERA_PINNED_CACHE_BYTES") != nullptr) {
    GTEST_SKIP() << "TESSERA_PINNED_CACHE_BYTES is set";
  }
  const size_t bytes = (size_t{4} << 20) - 100;
  void* first = nullptr;
  {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> storage,
                         Storage::Allocate(bytes, Device::Cpu(), true));
    first = storage->data();
    std::memset(first, 0x5a, bytes);
  }
  // Within the same pages: the same buffer, still pinned.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> again,
                       Storage::Allocate(bytes + 50, Device::Cpu(), true));
  EXPECT_EQ(again->data(), first);
  EXPECT_TRUE(again->pinned());
  // Never one that is live; never an unpinned allocation.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> other,
                       Storage::Allocate(bytes, Device::Cpu(), true));
  EXPECT_NE(other->data(), again->data());
  void* held = again->data();
  again.reset();
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Storage> heap,
      Storage::Allocate(bytes, Device::Cpu(), false, HostSharing::kPrivate));
  EXPECT_NE(heap->data(), held);
  // A device copy through the reused buffer moves the right bytes.
  ASSERT_OK_AND_ASSIGN(
      Tensor pinned,
      Tensor::Full({1000}, 2.5, TensorOptions().WithPinMemory(true)));
  ASSERT_OK_AND_ASSIGN(Tensor on_device, pinned.To(Device::Cuda(0)));
  ASSERT_OK_AND_ASSIGN(Tensor back, on_device.To(Device::Cpu()));
  EXPECT_EQ(back.data<float>()[999], 2.5f);
}

TEST(StorageTest, CudaWithoutDeviceIsFailedPrecondition) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is visible";
  EXPECT_THAT(Storage::Allocate(16, Device::Cuda(), false),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("CUDA is not available")));
  EXPECT_THAT(Storage::Allocate(0, Device::Cuda(0), false),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("CUDA is not available")));
}

// ---- CUDA availability
// -------------------------------------------------------

TEST(CudaTest, AvailabilityIsConsistent) {
  // Must not crash or fail without a driver; both agree.
  EXPECT_EQ(CudaAvailable(), CudaDeviceCount() > 0);
  EXPECT_GE(CudaDeviceCount(), 0);
  EXPECT_EQ(CudaDeviceCount(), CudaDeviceCount());
}

TEST(CudaTest, FactoriesFailWithoutDevice) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is visible";
  const TensorOptions cuda = TensorOptions().WithDevice(Device::Cuda());
  for (DType dtype : kAllDTypes) {
    const TensorOptions options = TensorOptions(cuda).WithDType(dtype);
    EXPECT_THAT(Tensor::Empty({2, 3}, options),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("CUDA is not available")));
    EXPECT_THAT(Tensor::Zeros({2, 3}, options),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("CUDA is not available")));
    EXPECT_THAT(Tensor::Full({2, 3}, 1.0, options),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("CUDA is not available")));
  }
  EXPECT_THAT(Tensor::Rand({4}, cuda),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("CUDA is not available")));
  EXPECT_THAT(Tensor::Randn({4}, TensorOptions().WithDevice(Device::Cuda(1))),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("CUDA is not available")));
  ASSERT_OK_AND_ASSIGN(Tensor cpu, Tensor::Ones({3}));
  EXPECT_THAT(cpu.To(Device::Cuda()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("CUDA is not available")));
}

class CudaTensorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) {
      GTEST_SKIP() << "no CUDA device visible (or Tessera built without CUDA)";
    }
  }
};

TEST_F(CudaTensorTest, FactoriesAndRoundTrip) {
  for (DType dtype : kAllDTypes) {
    const TensorOptions options =
        TensorOptions().WithDType(dtype).WithDevice(Device::Cuda());
    ASSERT_OK_AND_ASSIGN(Tensor zeros, Tensor::Zeros({3, 5}, options));
    EXPECT_TRUE(zeros.device().is_cuda());
    EXPECT_TRUE(zeros.device().index().has_value());
    ASSERT_OK_AND_ASSIGN(
        Tensor host_zeros,
        Tensor::Zeros({3, 5}, TensorOptions().WithDType(dtype)));
    EXPECT_TRUE(Equal(zeros, host_zeros)) << DTypeName(dtype);
    ASSERT_OK_AND_ASSIGN(Tensor ones, Tensor::Ones({3, 5}, options));
    ASSERT_OK_AND_ASSIGN(Tensor back, ones.To(Device::Cpu()));
    EXPECT_THAT(Values(back), ::testing::Each(1.0)) << DTypeName(dtype);
  }
}

TEST_F(CudaTensorTest, RandMatchesHostWithSameSeed) {
  Generator a(11);
  Generator b(11);
  ASSERT_OK_AND_ASSIGN(
      Tensor on_device,
      Tensor::Rand({64, 3}, TensorOptions().WithDevice(Device::Cuda()), &a));
  ASSERT_OK_AND_ASSIGN(Tensor on_host, Tensor::Rand({64, 3}, {}, &b));
  EXPECT_TRUE(Equal(on_device, on_host));
}

TEST_F(CudaTensorTest, CopyBoxBetweenHostAndDeviceViews) {
  ASSERT_OK_AND_ASSIGN(Tensor host, Iota({6, 7}, DType::kFloat32));
  ASSERT_OK_AND_ASSIGN(Tensor device, host.To(Device::Cuda()));
  ASSERT_OK_AND_ASSIGN(Tensor device_t, device.T());  // 7 x 6, strided.
  ASSERT_OK_AND_ASSIGN(Tensor out, Tensor::Zeros({5, 4}));
  ASSERT_OK_AND_ASSIGN(Tensor out_t, out.T());  // 4 x 5, strided.
  ASSERT_OK(CopyBox(device_t, {1, 2}, out_t, {0, 1}, {3, 4}));
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(At(out_t, {i, 1 + j}), At(host, {2 + j, 1 + i}));
    }
  }
  // Device to device through a pinned buffer and back.
  ASSERT_OK_AND_ASSIGN(Tensor pinned, host.To(Device::Cpu(), true));
  EXPECT_TRUE(pinned.is_pinned());
  ASSERT_OK_AND_ASSIGN(Tensor device2, pinned.To(Device::Cuda(0)));
  EXPECT_TRUE(Equal(device2, device));
  ASSERT_OK_AND_ASSIGN(Tensor as_half, device2.ToDType(DType::kFloat16));
  EXPECT_TRUE(as_half.device().is_cuda());
  ASSERT_OK_AND_ASSIGN(Tensor expected_half, host.ToDType(DType::kFloat16));
  EXPECT_TRUE(Equal(as_half, expected_half));
}

// ---- Factories for every dtype
// -----------------------------------------------

class TensorDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(TensorDTypeTest, Empty) {
  const DType dtype = GetParam();
  ASSERT_OK_AND_ASSIGN(
      Tensor t, Tensor::Empty({2, 3, 4}, TensorOptions().WithDType(dtype)));
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.dtype(), dtype);
  EXPECT_THAT(t.sizes(), ElementsAre(2, 3, 4));
  EXPECT_THAT(t.strides(), ElementsAre(12, 4, 1));
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.element_size(), ElementSize(dtype));
  EXPECT_EQ(t.nbytes(), 24 * ElementSize(dtype));
  EXPECT_EQ(t.storage_offset(), 0);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_FALSE(t.is_pinned());
  EXPECT_TRUE(t.device().is_cpu());
  ASSERT_NE(t.data_ptr(), nullptr);
  EXPECT_EQ(t.storage()->nbytes(), t.nbytes());
}

TEST_P(TensorDTypeTest, Zeros) {
  const DType dtype = GetParam();
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Tensor::Zeros({5, 7}, TensorOptions().WithDType(dtype)));
  EXPECT_THAT(Values(t), ::testing::Each(0.0));
  const std::vector<char> bytes(t.nbytes(), 0);
  EXPECT_EQ(std::memcmp(t.data_ptr(), bytes.data(), t.nbytes()), 0);
}

TEST_P(TensorDTypeTest, Ones) {
  const DType dtype = GetParam();
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Tensor::Ones({4, 3}, TensorOptions().WithDType(dtype)));
  EXPECT_THAT(Values(t), ::testing::Each(1.0));
  if (IsComplex(dtype)) {
    EXPECT_EQ(ImagAt(t, {2, 1}), 0.0);
  }
}

TEST_P(TensorDTypeTest, Full) {
  const DType dtype = GetParam();
  const TensorOptions options = TensorOptions().WithDType(dtype);
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Full({3, 2}, 5.0, options));
  const double expected = dtype == DType::kBool ? 1.0 : 5.0;
  EXPECT_THAT(Values(t), ::testing::Each(expected));
  ASSERT_OK_AND_ASSIGN(Tensor zero_d, Tensor::Full({}, 3.0, options));
  EXPECT_EQ(zero_d.numel(), 1);
  EXPECT_EQ(At(zero_d, {}), dtype == DType::kBool ? 1.0 : 3.0);
  if (IsFloatingPoint(dtype) || IsComplex(dtype)) {
    ASSERT_OK_AND_ASSIGN(Tensor negative, Tensor::Full({2}, -2.5, options));
    EXPECT_THAT(Values(negative), ::testing::Each(-2.5));
  }
}

TEST(TensorFullTest, ValuesTheDTypeCannotHoldAreRefusedAsTorchFull) {
  const auto full = [](double value, DType dtype) {
    return Tensor::Full({2}, value, TensorOptions().WithDType(dtype));
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  // Past the range, NaN for integers, finite overflow for floats.
  for (const auto& [value, dtype] :
       std::vector<std::pair<double, DType>>{{300, DType::kInt8},
                                             {-129, DType::kInt8},
                                             {128, DType::kInt8},
                                             {256, DType::kUInt8},
                                             {-256, DType::kUInt8},
                                             {40000, DType::kInt16},
                                             {2147483648.0, DType::kInt32},
                                             {0x1p63, DType::kInt64},
                                             {-0x1p64, DType::kInt64},
                                             {nan, DType::kInt32},
                                             {inf, DType::kInt64},
                                             {1e39, DType::kFloat32},
                                             {-1e39, DType::kFloat32},
                                             {65520, DType::kFloat16},
                                             {1e39, DType::kBFloat16}}) {
    EXPECT_THAT(full(value, dtype), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("without overflow")))
        << value << " " << DTypeName(dtype);
    EXPECT_FALSE(Tensor::CheckFillValue(value, dtype).ok());
  }
  // The edges, truncation, wrapping into unsigned, and what floats and bool
  // take.
  const auto value_of = [&](double value, DType dtype) -> double {
    absl::StatusOr<Tensor> t = full(value, dtype);
    EXPECT_OK(t.status()) << value << " " << DTypeName(dtype);
    return t.ok() ? At(*t, {1}) : -12345;
  };
  EXPECT_EQ(value_of(127, DType::kInt8), 127);
  EXPECT_EQ(value_of(-128, DType::kInt8), -128);
  EXPECT_EQ(value_of(127.9, DType::kInt8), 127);
  EXPECT_EQ(value_of(-128.9, DType::kInt8), -128);
  EXPECT_EQ(value_of(1.5, DType::kInt32), 1);
  EXPECT_EQ(value_of(-1, DType::kUInt8), 255);
  EXPECT_EQ(value_of(-255, DType::kUInt8), 1);
  EXPECT_EQ(value_of(255, DType::kUInt8), 255);
  EXPECT_EQ(value_of(-0x1p63, DType::kInt64), -0x1p63);
  EXPECT_EQ(value_of(65504, DType::kFloat16), 65504);
  EXPECT_EQ(value_of(inf, DType::kFloat16), inf);
  EXPECT_TRUE(std::isnan(value_of(nan, DType::kFloat32)));
  EXPECT_EQ(value_of(-inf, DType::kBFloat16), -inf);
  EXPECT_EQ(value_of(1e300, DType::kFloat64), 1e300);
  EXPECT_EQ(value_of(1e300, DType::kBool), 1);
  EXPECT_EQ(value_of(nan, DType::kBool), 1);
}

TEST_P(TensorDTypeTest, Equal) {
  const DType dtype = GetParam();
  const TensorOptions options = TensorOptions().WithDType(dtype);
  ASSERT_OK_AND_ASSIGN(Tensor a, Iota({3, 4}, dtype, 100));
  ASSERT_OK_AND_ASSIGN(Tensor b, Iota({3, 4}, dtype, 100));
  EXPECT_TRUE(Equal(a, b));
  EXPECT_TRUE(Equal(a, a));
  // One element changed.
  ASSERT_OK_AND_ASSIGN(Tensor one, Tensor::Full({1, 1}, 0.0, options));
  ASSERT_OK(CopyBox(one, {0, 0}, b, {2, 3}, {1, 1}));
  EXPECT_FALSE(Equal(a, b));
  // Different sizes with the same elements, and different dtypes.
  ASSERT_OK_AND_ASSIGN(Tensor flat, a.View({12}));
  EXPECT_FALSE(Equal(a, flat));
  const DType other =
      dtype == DType::kFloat32 ? DType::kFloat64 : DType::kFloat32;
  ASSERT_OK_AND_ASSIGN(Tensor converted, a.ToDType(other));
  EXPECT_FALSE(Equal(a, converted));
  // Full tensors.
  ASSERT_OK_AND_ASSIGN(Tensor ones1, Tensor::Ones({2, 2}, options));
  ASSERT_OK_AND_ASSIGN(Tensor ones2, Tensor::Full({2, 2}, 1.0, options));
  ASSERT_OK_AND_ASSIGN(Tensor zeros, Tensor::Zeros({2, 2}, options));
  EXPECT_TRUE(Equal(ones1, ones2));
  EXPECT_FALSE(Equal(ones1, zeros));
  // Strided views compare by value.
  ASSERT_OK_AND_ASSIGN(Tensor at, a.T());
  ASSERT_OK_AND_ASSIGN(Tensor at_copy, at.Contiguous());
  EXPECT_TRUE(Equal(at, at_copy));
  EXPECT_FALSE(Equal(at, a));
}

TEST_P(TensorDTypeTest, ZeroSizeDimensions) {
  const DType dtype = GetParam();
  const TensorOptions options = TensorOptions().WithDType(dtype);
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Zeros({3, 0, 2}, options));
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_THAT(t.strides(), ElementsAre(2, 2, 1));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.data_ptr(), nullptr);
  ASSERT_OK_AND_ASSIGN(Tensor u, Tensor::Full({3, 0, 2}, 7.0, options));
  EXPECT_TRUE(Equal(t, u));
  ASSERT_OK_AND_ASSIGN(Tensor clone, t.Clone());
  EXPECT_TRUE(Equal(clone, t));
  ASSERT_OK(CopyInto(t, u));
  ASSERT_OK_AND_ASSIGN(Tensor tt, t.Transpose(0, 2));
  EXPECT_TRUE(tt.is_contiguous());  // numel 0 counts as contiguous.
  ASSERT_OK_AND_ASSIGN(Tensor other, tt.ToDType(DType::kFloat64));
  EXPECT_THAT(other.sizes(), ElementsAre(2, 0, 3));
  if (IsFloatingPoint(dtype) || IsComplex(dtype)) {
    ASSERT_OK_AND_ASSIGN(Tensor r, Tensor::Rand({0, 4}, options));
    EXPECT_EQ(r.numel(), 0);
    ASSERT_OK_AND_ASSIGN(Tensor n, Tensor::Randn({4, 0}, options));
    EXPECT_EQ(n.numel(), 0);
  }
}

TEST_P(TensorDTypeTest, FromVectorRoundTripsThroughToDType) {
  const DType dtype = GetParam();
  ASSERT_OK_AND_ASSIGN(Tensor t, Iota({2, 5}, dtype, 2));
  EXPECT_THAT(Values(t), ElementsAre(0, 1, 0, 1, 0, 1, 0, 1, 0, 1));
  ASSERT_OK_AND_ASSIGN(Tensor as_int, t.ToDType(DType::kInt64));
  EXPECT_THAT(Values(as_int), ElementsAre(0, 1, 0, 1, 0, 1, 0, 1, 0, 1));
  ASSERT_OK_AND_ASSIGN(Tensor same, t.ToDType(dtype));
  EXPECT_TRUE(Equal(same, t));
  EXPECT_NE(same.storage(), t.storage());
}

TEST_P(TensorDTypeTest, CopyBoxTransposed) {
  const DType dtype = GetParam();
  ASSERT_OK_AND_ASSIGN(Tensor src, Iota({9, 11}, dtype, 97));
  ASSERT_OK_AND_ASSIGN(Tensor src_t, src.T());
  ASSERT_OK_AND_ASSIGN(
      Tensor dst, Tensor::Zeros({11, 9}, TensorOptions().WithDType(dtype)));
  ASSERT_OK(CopyInto(src_t, dst));
  for (int64_t i = 0; i < 11; ++i) {
    for (int64_t j = 0; j < 9; ++j) {
      ASSERT_EQ(At(dst, {i, j}), At(src, {j, i})) << i << "," << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, TensorDTypeTest,
                         ::testing::ValuesIn(kAllDTypes), DTypeTestName);

// ---- Tensor basics
// --------------------------------------------------------------

TEST(TensorTest, UndefinedTensor) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.data_ptr(), nullptr);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_FALSE(t.is_pinned());
  EXPECT_EQ(t.DebugString(), "Tensor(undefined)");
  EXPECT_THAT(t.Clone(), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("undefined")));
  EXPECT_TRUE(Equal(Tensor(), Tensor()));
  ASSERT_OK_AND_ASSIGN(Tensor defined, Tensor::Zeros({1}));
  EXPECT_FALSE(Equal(t, defined));
  EXPECT_THAT(CopyInto(t, defined), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("undefined")));
}

TEST(TensorTest, ZeroDimensional) {
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Full({}, 4.0));
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.nbytes(), 4u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(*t.data<float>(), 4.0f);
  EXPECT_THAT(t.size(0), StatusIs(absl::StatusCode::kOutOfRange,
                                  HasSubstr("tensor has no dimensions")));
  ASSERT_OK_AND_ASSIGN(Tensor tt, t.T());
  EXPECT_EQ(tt.dim(), 0);
  ASSERT_OK_AND_ASSIGN(Tensor tr, t.Transpose(0, -1));
  EXPECT_EQ(tr.dim(), 0);
  EXPECT_THAT(t.Narrow(0, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0-dim")));
  ASSERT_OK_AND_ASSIGN(Tensor u, Tensor::Zeros({}));
  ASSERT_OK(CopyInto(t, u));
  EXPECT_TRUE(Equal(t, u));
  ASSERT_OK_AND_ASSIGN(Tensor v, t.View({1, 1}));
  EXPECT_THAT(v.sizes(), ElementsAre(1, 1));
  ASSERT_OK_AND_ASSIGN(Tensor w, v.View({}));
  EXPECT_EQ(w.dim(), 0);
  EXPECT_EQ(t.DebugString(), "Tensor(float32, [], cpu)");
}

TEST(TensorTest, NegativeSizesAreInvalid) {
  EXPECT_THAT(Tensor::Empty({2, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative dimension -1: [2, -1]")));
  EXPECT_THAT(Tensor::Zeros({-3}), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("negative dimension")));
  EXPECT_THAT(Tensor::Full({-3}, 1.0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative dimension")));
  EXPECT_THAT(Tensor::Rand({4, -3}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative dimension")));
  EXPECT_THAT(Tensor::Empty({-1}, TensorOptions().WithDevice(Device::Meta())),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative dimension")));
}

TEST(TensorTest, OverflowingSizesAreInvalid) {
  EXPECT_THAT(
      Tensor::Empty({int64_t{1} << 40, int64_t{1} << 40}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too many")));
  EXPECT_THAT(
      Tensor::Empty({int64_t{1} << 62},
                    TensorOptions().WithDType(DType::kComplex128)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too many")));
}

TEST(TensorTest, PinMemoryOffTheCpuIsInvalid) {
  for (Device device : {Device::Meta(), Device::Cuda(), Device::Cuda(0)}) {
    const TensorOptions options =
        TensorOptions().WithDevice(device).WithPinMemory(true);
    EXPECT_THAT(
        Tensor::Empty({2}, options),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pin_memory")))
        << device;
    EXPECT_THAT(
        Tensor::Ones({2}, options),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pin_memory")))
        << device;
  }
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Ones({2}));
  EXPECT_THAT(
      t.To(Device::Meta(), /*pin_memory=*/true),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pin_memory")));
}

TEST(TensorTest, PinnedTensor) {
  ASSERT_OK_AND_ASSIGN(
      Tensor t, Tensor::Ones({256}, TensorOptions().WithPinMemory(true)));
  EXPECT_TRUE(t.is_pinned());
  EXPECT_EQ(t.nbytes(), 1024u);
  EXPECT_THAT(Values(t), ::testing::Each(1.0));
  ASSERT_OK_AND_ASSIGN(Tensor clone, t.Clone());
  EXPECT_TRUE(clone.is_pinned());
  ASSERT_OK_AND_ASSIGN(Tensor pageable, t.To(Device::Cpu()));
  EXPECT_FALSE(pageable.is_pinned());
  ASSERT_OK_AND_ASSIGN(Tensor pinned_again, pageable.To(Device::Cpu(), true));
  EXPECT_TRUE(pinned_again.is_pinned());
  EXPECT_TRUE(Equal(pinned_again, t));
  ASSERT_OK_AND_ASSIGN(Tensor view, t.Narrow(0, 10, 5));
  EXPECT_TRUE(view.is_pinned());
}

TEST(TensorTest, SizeWrapsNegativeDimensions) {
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Empty({2, 3}));
  ASSERT_OK_AND_ASSIGN(int64_t s0, t.size(0));
  ASSERT_OK_AND_ASSIGN(int64_t s1, t.size(1));
  ASSERT_OK_AND_ASSIGN(int64_t sm1, t.size(-1));
  ASSERT_OK_AND_ASSIGN(int64_t sm2, t.size(-2));
  EXPECT_EQ(s0, 2);
  EXPECT_EQ(s1, 3);
  EXPECT_EQ(sm1, 3);
  EXPECT_EQ(sm2, 2);
  EXPECT_THAT(t.size(2),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "Dimension out of range (expected to be in range of "
                       "[-2, 1], but got 2)"));
  EXPECT_THAT(t.size(-3),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "Dimension out of range (expected to be in range of "
                       "[-2, 1], but got -3)"));
}

TEST(TensorTest, RequiresGradIsMetadata) {
  ASSERT_OK_AND_ASSIGN(
      Tensor t, Tensor::Zeros({2}, TensorOptions().WithRequiresGrad(true)));
  EXPECT_TRUE(t.requires_grad());
  t.set_requires_grad(false);
  EXPECT_FALSE(t.requires_grad());
}

TEST(TensorTest, DebugString) {
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Empty({3, 20}));
  EXPECT_EQ(t.DebugString(), "Tensor(float32, [3, 20], cpu)");
  ASSERT_OK_AND_ASSIGN(Tensor m,
                       Tensor::Empty({4}, TensorOptions()
                                              .WithDType(DType::kBFloat16)
                                              .WithDevice(Device::Meta())));
  EXPECT_EQ(m.DebugString(), "Tensor(bfloat16, [4], meta)");
}

TEST(TensorTest, FromVector) {
  const std::vector<int32_t> values = {1, 2, 3, 4, 5, 6};
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::FromVector<int32_t>(values, {2, 3}));
  EXPECT_EQ(t.dtype(), DType::kInt32);
  EXPECT_THAT(t.sizes(), ElementsAre(2, 3));
  EXPECT_EQ(At(t, {1, 2}), 6);
  EXPECT_EQ(t.data<int32_t>()[3], 4);
  EXPECT_THAT(Tensor::FromVector<int32_t>(values, {4, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("6 values"), HasSubstr("[4, 2]"))));
  EXPECT_THAT(
      Tensor::FromVector<int32_t>(values, {-6}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  const bool flags[] = {true, false, true};
  ASSERT_OK_AND_ASSIGN(Tensor b, Tensor::FromVector<bool>(flags, {3}));
  EXPECT_EQ(b.dtype(), DType::kBool);
  EXPECT_THAT(Values(b), ElementsAre(1, 0, 1));
  const Half halves[] = {Half{0x3C00}, Half{0xC000}};
  ASSERT_OK_AND_ASSIGN(Tensor h, Tensor::FromVector<Half>(halves, {2}));
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_THAT(Values(h), ElementsAre(1.0, -2.0));
  const std::vector<std::complex<double>> complexes = {{1, 2}};
  ASSERT_OK_AND_ASSIGN(Tensor c,
                       Tensor::FromVector(absl::MakeConstSpan(complexes), {}));
  EXPECT_EQ(c.dtype(), DType::kComplex128);
  EXPECT_EQ(ImagAt(c, {}), 2.0);
  ASSERT_OK_AND_ASSIGN(Tensor empty, Tensor::FromVector<float>({}, {0, 3}));
  EXPECT_EQ(empty.numel(), 0);
}

// ---- Views
// -------------------------------------------------------------------

TEST(TensorTest, TransposeOfSquareIsNotContiguous) {
  ASSERT_OK_AND_ASSIGN(Tensor a, Iota({10, 10}, DType::kFloat32));
  EXPECT_TRUE(a.is_contiguous());
  ASSERT_OK_AND_ASSIGN(Tensor at, a.T());
  EXPECT_FALSE(at.is_contiguous());
  EXPECT_EQ(at.storage(), a.storage());
  EXPECT_THAT(at.strides(), ElementsAre(1, 10));
  ASSERT_OK_AND_ASSIGN(Tensor c, at.Contiguous());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), a.storage());
  for (int64_t i = 0; i < 10; ++i) {
    for (int64_t j = 0; j < 10; ++j) {
      EXPECT_EQ(c.data<float>()[i * 10 + j], static_cast<float>(j * 10 + i));
    }
  }
  // Contiguous() of a contiguous tensor is the same view.
  ASSERT_OK_AND_ASSIGN(Tensor same, a.Contiguous());
  EXPECT_EQ(same.storage(), a.storage());
}

TEST(TensorTest, TOnMoreThanTwoDimensionsIsInvalid) {
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Empty({2, 3, 4}));
  EXPECT_THAT(t.T(), StatusIs(absl::StatusCode::kInvalidArgument,
                              "t() expects a tensor with <= 2 dimensions, but "
                              "self is 3D"));
  ASSERT_OK_AND_ASSIGN(Tensor v, Tensor::Empty({5}));
  ASSERT_OK_AND_ASSIGN(Tensor vt, v.T());
  EXPECT_THAT(vt.sizes(), ElementsAre(5));
}

TEST(TensorTest, Transpose) {
  ASSERT_OK_AND_ASSIGN(Tensor t, Iota({2, 3, 4}, DType::kInt64));
  ASSERT_OK_AND_ASSIGN(Tensor u, t.Transpose(0, -1));
  EXPECT_THAT(u.sizes(), ElementsAre(4, 3, 2));
  EXPECT_THAT(u.strides(), ElementsAre(1, 4, 12));
  EXPECT_EQ(At(u, {3, 2, 1}), At(t, {1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(Tensor same, t.Transpose(1, 1));
  EXPECT_TRUE(same.is_contiguous());
  EXPECT_THAT(t.Transpose(0, 3),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("expected to be in range of [-3, 2], but "
                                 "got 3")));
}

TEST(TensorTest, ContiguityIgnoresSizeOneStrides) {
  ASSERT_OK_AND_ASSIGN(Tensor row, Tensor::Empty({1, 5}));
  ASSERT_OK_AND_ASSIGN(Tensor column, row.T());  // [5, 1], strides [1, 5].
  EXPECT_TRUE(column.is_contiguous());
  ASSERT_OK_AND_ASSIGN(Tensor square, Tensor::Empty({10, 10}));
  ASSERT_OK_AND_ASSIGN(Tensor one_column, square.Narrow(1, 3, 1));
  EXPECT_FALSE(one_column.is_contiguous());  // [10, 1] with strides [10, 1].
  ASSERT_OK_AND_ASSIGN(Tensor one_row, square.Narrow(0, 3, 1));
  EXPECT_TRUE(one_row.is_contiguous());
  ASSERT_OK_AND_ASSIGN(Tensor rows, square.Narrow(0, 2, 5));
  EXPECT_TRUE(rows.is_contiguous());
  ASSERT_OK_AND_ASSIGN(Tensor columns, square.Narrow(1, 2, 5));
  EXPECT_FALSE(columns.is_contiguous());
  ASSERT_OK_AND_ASSIGN(Tensor element, columns.Narrow(0, 4, 1));
  ASSERT_OK_AND_ASSIGN(Tensor single, element.Narrow(1, 1, 1));
  EXPECT_TRUE(single.is_contiguous());
  ASSERT_OK_AND_ASSIGN(Tensor nothing, columns.Narrow(0, 4, 0));
  EXPECT_TRUE(nothing.is_contiguous());
}

TEST(TensorTest, Narrow) {
  ASSERT_OK_AND_ASSIGN(Tensor t, Iota({10, 6}, DType::kInt32));
  ASSERT_OK_AND_ASSIGN(Tensor rows, t.Narrow(0, 2, 3));
  EXPECT_THAT(rows.sizes(), ElementsAre(3, 6));
  EXPECT_EQ(rows.storage_offset(), 12);
  EXPECT_EQ(rows.data<int32_t>()[0], 12);
  ASSERT_OK_AND_ASSIGN(Tensor cols, t.Narrow(-1, -2, 2));
  EXPECT_THAT(cols.sizes(), ElementsAre(10, 2));
  EXPECT_EQ(At(cols, {1, 0}), 10);
  EXPECT_EQ(At(cols, {1, 1}), 11);
  ASSERT_OK_AND_ASSIGN(Tensor end, t.Narrow(0, 10, 0));
  EXPECT_EQ(end.numel(), 0);
  EXPECT_THAT(t.Narrow(0, 8, 5),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "start (8) + length (5) exceeds dimension size (10)."));
  EXPECT_THAT(t.Narrow(0, 11, 0),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "start out of range (expected to be in range of [-10, "
                       "10], but got 11)"));
  EXPECT_THAT(t.Narrow(0, -11, 1), StatusIs(absl::StatusCode::kOutOfRange,
                                            HasSubstr("start out of range")));
  EXPECT_THAT(t.Narrow(0, 0, -1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("length must be non-negative")));
  EXPECT_THAT(t.Narrow(2, 0, 1), StatusIs(absl::StatusCode::kOutOfRange,
                                          HasSubstr("Dimension out of range")));
}

TEST(TensorTest, View) {
  ASSERT_OK_AND_ASSIGN(Tensor t, Iota({4, 6}, DType::kFloat64));
  ASSERT_OK_AND_ASSIGN(Tensor v, t.View({2, 3, 4}));
  EXPECT_THAT(v.strides(), ElementsAre(12, 4, 1));
  EXPECT_EQ(v.storage(), t.storage());
  EXPECT_EQ(At(v, {1, 2, 3}), 23);
  ASSERT_OK_AND_ASSIGN(Tensor inferred, t.View({-1, 8}));
  EXPECT_THAT(inferred.sizes(), ElementsAre(3, 8));
  EXPECT_THAT(t.View({5, 5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "shape '[5, 5]' is invalid for input of size 24"));
  EXPECT_THAT(t.View({-1, 5}), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("is invalid")));
  EXPECT_THAT(t.View({-1, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("only one dimension can be inferred")));
  EXPECT_THAT(t.View({-2, -12}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid shape dimension -2")));
  ASSERT_OK_AND_ASSIGN(Tensor tt, t.T());
  EXPECT_THAT(tt.View({24}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("view size is not compatible")));
  // A contiguous narrow keeps its offset.
  ASSERT_OK_AND_ASSIGN(Tensor rows, t.Narrow(0, 1, 2));
  ASSERT_OK_AND_ASSIGN(Tensor flat, rows.View({12}));
  EXPECT_EQ(flat.storage_offset(), 6);
  EXPECT_EQ(At(flat, {0}), 6);
  ASSERT_OK_AND_ASSIGN(Tensor empty, Tensor::Empty({0, 4}));
  EXPECT_THAT(empty.View({-1, 2}), IsOk());
}

// ---- Copies -----------------------------------------------------------------

TEST(TensorTest, CloneHasItsOwnStorage) {
  ASSERT_OK_AND_ASSIGN(Tensor t, Iota({3, 3}, DType::kFloat32));
  ASSERT_OK_AND_ASSIGN(Tensor c, t.Clone());
  EXPECT_NE(c.storage(), t.storage());
  EXPECT_TRUE(Equal(c, t));
  c.data<float>()[0] = 42;
  EXPECT_EQ(t.data<float>()[0], 0);
  EXPECT_FALSE(Equal(c, t));
  // Clone of a view holds just the view.
  ASSERT_OK_AND_ASSIGN(Tensor col, t.Narrow(1, 1, 1));
  ASSERT_OK_AND_ASSIGN(Tensor col_clone, col.Clone());
  EXPECT_EQ(col_clone.storage()->nbytes(), 3 * sizeof(float));
  EXPECT_THAT(Values(col_clone), ElementsAre(1, 4, 7));
  EXPECT_EQ(col_clone.storage_offset(), 0);
}

TEST(TensorTest, ToDTypeConversions) {
  ASSERT_OK_AND_ASSIGN(Tensor f, Tensor::FromVector<float>(
                                     {2.7f, -2.7f, 0.0f, 0.5f, 300.0f}, {5}));
  ASSERT_OK_AND_ASSIGN(Tensor i, f.ToDType(DType::kInt32));
  EXPECT_THAT(Values(i), ElementsAre(2, -2, 0, 0, 300));
  ASSERT_OK_AND_ASSIGN(Tensor b, f.ToDType(DType::kBool));
  EXPECT_THAT(Values(b), ElementsAre(1, 1, 0, 1, 1));
  ASSERT_OK_AND_ASSIGN(Tensor h, f.ToDType(DType::kFloat16));
  EXPECT_EQ(h.data<Half>()[0].bits, FloatToHalf(2.7f).bits);
  ASSERT_OK_AND_ASSIGN(Tensor c, f.ToDType(DType::kComplex64));
  EXPECT_EQ(c.data<std::complex<float>>()[1], std::complex<float>(-2.7f, 0));
  // Large int64 values convert exactly between integer types.
  const int64_t big = (int64_t{1} << 53) + 1;
  ASSERT_OK_AND_ASSIGN(Tensor l, Tensor::FromVector<int64_t>({big, -big}, {2}));
  ASSERT_OK_AND_ASSIGN(Tensor l2, l.ToDType(DType::kInt64));
  EXPECT_EQ(l2.data<int64_t>()[0], big);
  ASSERT_OK_AND_ASSIGN(Tensor i8, Tensor::FromVector<int64_t>({257, -1}, {2}));
  ASSERT_OK_AND_ASSIGN(Tensor u8, i8.ToDType(DType::kUInt8));
  EXPECT_THAT(Values(u8), ElementsAre(1, 255));  // Wraps like a C cast.
  // Complex to real keeps the real part; to bool looks at both parts.
  ASSERT_OK_AND_ASSIGN(Tensor z, Tensor::FromVector<std::complex<double>>(
                                     {{1.5, 2.0}, {0.0, 3.0}}, {2}));
  ASSERT_OK_AND_ASSIGN(Tensor zr, z.ToDType(DType::kFloat32));
  EXPECT_THAT(Values(zr), ElementsAre(1.5, 0.0));
  ASSERT_OK_AND_ASSIGN(Tensor zb, z.ToDType(DType::kBool));
  EXPECT_THAT(Values(zb), ElementsAre(1, 1));
  ASSERT_OK_AND_ASSIGN(Tensor zc, z.ToDType(DType::kComplex64));
  EXPECT_EQ(zc.data<std::complex<float>>()[1], std::complex<float>(0, 3));
  // NaN and out-of-range floats give defined integers.
  ASSERT_OK_AND_ASSIGN(
      Tensor odd,
      Tensor::FromVector<double>(
          {std::numeric_limits<double>::quiet_NaN(), 1e300, -1e300}, {3}));
  ASSERT_OK_AND_ASSIGN(Tensor odd_int, odd.ToDType(DType::kInt64));
  EXPECT_EQ(odd_int.data<int64_t>()[0], 0);
  EXPECT_EQ(odd_int.data<int64_t>()[1], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(odd_int.data<int64_t>()[2], std::numeric_limits<int64_t>::min());
  // Strided sources convert in row-major order of the view.
  ASSERT_OK_AND_ASSIGN(Tensor m, Iota({2, 3}, DType::kInt16));
  ASSERT_OK_AND_ASSIGN(Tensor mt, m.T());
  ASSERT_OK_AND_ASSIGN(Tensor mtd, mt.ToDType(DType::kFloat64));
  EXPECT_TRUE(mtd.is_contiguous());
  EXPECT_THAT(Values(mtd), ElementsAre(0, 3, 1, 4, 2, 5));
}

TEST(TensorTest, MetaTensors) {
  const TensorOptions meta = TensorOptions().WithDevice(Device::Meta());
  ASSERT_OK_AND_ASSIGN(Tensor m, Tensor::Full({1000, 1000}, 3.0, meta));
  EXPECT_TRUE(m.device().is_meta());
  EXPECT_EQ(m.data_ptr(), nullptr);
  EXPECT_EQ(m.numel(), 1000000);
  ASSERT_OK_AND_ASSIGN(Tensor r, Tensor::Rand({3}, meta));
  ASSERT_OK_AND_ASSIGN(Tensor z, Tensor::Zeros({3}, meta));
  EXPECT_TRUE(Equal(r, z));
  ASSERT_OK_AND_ASSIGN(Tensor z2, Tensor::Zeros({4}, meta));
  EXPECT_FALSE(Equal(r, z2));
  ASSERT_OK_AND_ASSIGN(Tensor cpu, Tensor::Zeros({3}));
  EXPECT_FALSE(Equal(r, cpu));
  ASSERT_OK_AND_ASSIGN(Tensor mt, m.T());
  ASSERT_OK_AND_ASSIGN(Tensor mc, mt.Contiguous());
  EXPECT_TRUE(mc.device().is_meta());
  ASSERT_OK_AND_ASSIGN(Tensor mh, m.ToDType(DType::kFloat16));
  EXPECT_EQ(mh.dtype(), DType::kFloat16);
  EXPECT_TRUE(mh.device().is_meta());
  ASSERT_OK_AND_ASSIGN(Tensor to_meta, cpu.To(Device::Meta()));
  EXPECT_TRUE(to_meta.device().is_meta());
  EXPECT_THAT(r.To(Device::Cpu()), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("meta tensor")));
}

// ---- Generator
// ---------------------------------------------------------------

TEST(GeneratorTest, IsTheStandardMersenneTwister) {
  Generator g(5489);  // std::mt19937_64's default seed.
  EXPECT_EQ(g.NextU64(), 14514284786278117030ull);
  std::mt19937_64 reference(1234);
  Generator h(1234);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(h.NextU64(), reference());
}

TEST(GeneratorTest, SameSeedSameSequence) {
  Generator a(42);
  Generator b(42);
  Generator c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.NextU64();
    EXPECT_EQ(x, b.NextU64());
    differs |= x != c.NextU64();
  }
  EXPECT_TRUE(differs);
  a.ManualSeed(7);
  b.ManualSeed(7);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(a.NextNormal(), b.NextNormal());
    EXPECT_EQ(a.NextUniform(), b.NextUniform());
  }
}

TEST(GeneratorTest, ManualSeedRestartsTheSequence) {
  Generator g(99);
  const double first = g.NextNormal();
  const double second = g.NextNormal();  // Possibly cached.
  g.NextNormal();
  g.ManualSeed(99);
  EXPECT_EQ(g.NextNormal(), first);
  EXPECT_EQ(g.NextNormal(), second);
  Generator fresh(99);
  g.ManualSeed(99);
  EXPECT_EQ(g.NextU64(), fresh.NextU64());
}

TEST(GeneratorTest, UniformUsesTheTopBits) {
  Generator g(3);
  Generator raw(3);
  for (int bits : {1, 8, 11, 24, 53}) {
    const double u = g.NextUniform(bits);
    const uint64_t top = raw.NextU64() >> (64 - bits);
    EXPECT_EQ(u, std::ldexp(static_cast<double>(top), -bits)) << bits;
  }
  for (int i = 0; i < 10000; ++i) {
    const double u = g.NextUniform(11);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_EQ(u * 2048, std::floor(u * 2048));
  }
}

TEST(GeneratorTest, DefaultGeneratorIsThreadSafe) {
  constexpr uint64_t kSeed = 2024;
  constexpr int kThreads = 4;
  constexpr int kDraws = 20000;
  ManualSeed(kSeed);
  std::vector<std::vector<uint64_t>> drawn(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&drawn, t] {
      for (int i = 0; i < kDraws; ++i) {
        drawn[t].push_back(DefaultGenerator().NextU64());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  // Every value of the sequence was handed out exactly once.
  std::vector<uint64_t> all;
  for (const auto& d : drawn) all.insert(all.end(), d.begin(), d.end());
  std::sort(all.begin(), all.end());
  Generator reference(kSeed);
  std::vector<uint64_t> expected;
  for (int i = 0; i < kThreads * kDraws; ++i) {
    expected.push_back(reference.NextU64());
  }
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(all, expected);
}

// ---- Rand / Randn
// ---------------------------------------------------------------

class RandomDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(RandomDTypeTest, SameSeedGivesEqualTensors) {
  const TensorOptions options = TensorOptions().WithDType(GetParam());
  for (bool normal : {false, true}) {
    auto draw = [&](Generator* g) {
      return normal ? Tensor::Randn({17, 5}, options, g)
                    : Tensor::Rand({17, 5}, options, g);
    };
    Generator a(123);
    Generator b(123);
    Generator c(124);
    ASSERT_OK_AND_ASSIGN(Tensor ta, draw(&a));
    ASSERT_OK_AND_ASSIGN(Tensor tb, draw(&b));
    ASSERT_OK_AND_ASSIGN(Tensor tc, draw(&c));
    EXPECT_EQ(ta.dtype(), GetParam());
    EXPECT_TRUE(Equal(ta, tb));
    EXPECT_FALSE(Equal(ta, tc));
    // The generator advanced: the next draw differs.
    ASSERT_OK_AND_ASSIGN(Tensor ta2, draw(&a));
    EXPECT_FALSE(Equal(ta, ta2));
  }
}

TEST_P(RandomDTypeTest, DefaultGeneratorFollowsManualSeed) {
  const TensorOptions options = TensorOptions().WithDType(GetParam());
  ManualSeed(5);
  ASSERT_OK_AND_ASSIGN(Tensor a, Tensor::Rand({8}, options));
  ASSERT_OK_AND_ASSIGN(Tensor an, Tensor::Randn({8}, options));
  ManualSeed(5);
  ASSERT_OK_AND_ASSIGN(Tensor b, Tensor::Rand({8}, options));
  ASSERT_OK_AND_ASSIGN(Tensor bn, Tensor::Randn({8}, options));
  EXPECT_TRUE(Equal(a, b));
  EXPECT_TRUE(Equal(an, bn));
}

TEST_P(RandomDTypeTest, RandIsInUnitIntervalAndOnTheGrid) {
  const DType dtype = GetParam();
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Tensor::Rand({4096}, TensorOptions().WithDType(dtype)));
  int bits = 53;
  if (dtype == DType::kFloat32 || dtype == DType::kComplex64) bits = 24;
  if (dtype == DType::kFloat16) bits = 11;
  if (dtype == DType::kBFloat16) bits = 8;
  const double scale = std::ldexp(1.0, bits);
  for (int64_t i = 0; i < t.numel(); ++i) {
    std::vector<double> parts = {At(t, {i})};
    if (IsComplex(dtype)) parts.push_back(ImagAt(t, {i}));
    for (double v : parts) {
      ASSERT_GE(v, 0.0);
      ASSERT_LT(v, 1.0);
      ASSERT_EQ(v * scale, std::floor(v * scale)) << v;
    }
  }
}

TEST_P(RandomDTypeTest, RandDrawsInRowMajorOrder) {
  const DType dtype = GetParam();
  Generator g(77);
  Generator reference(77);
  ASSERT_OK_AND_ASSIGN(
      Tensor t, Tensor::Rand({3, 4}, TensorOptions().WithDType(dtype), &g));
  int bits = 53;
  if (dtype == DType::kFloat32 || dtype == DType::kComplex64) bits = 24;
  if (dtype == DType::kFloat16) bits = 11;
  if (dtype == DType::kBFloat16) bits = 8;
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(At(t, {i, j}), reference.NextUniform(bits));
      if (IsComplex(dtype)) {
        EXPECT_EQ(ImagAt(t, {i, j}), reference.NextUniform(bits));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FloatingAndComplex, RandomDTypeTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat64,
                                           DType::kComplex64,
                                           DType::kComplex128, DType::kFloat16,
                                           DType::kBFloat16),
                         DTypeTestName);

TEST(RandomTest, IntegerAndBoolDTypesAreInvalid) {
  EXPECT_THAT(
      Tensor::Rand({3}, TensorOptions().WithDType(DType::kInt32)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "rand is only supported for floating point and complex dtypes, "
               "got int32"));
  EXPECT_THAT(Tensor::Randn({3}, TensorOptions().WithDType(DType::kBool)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "randn is only supported for floating point and complex "
                       "dtypes, got bool"));
  for (DType dtype :
       {DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt64}) {
    EXPECT_THAT(Tensor::Rand({3}, TensorOptions().WithDType(dtype)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(std::string(DTypeName(dtype)))));
  }
}

TEST(RandomTest, RandnMomentsFloat64) {
  Generator g(2718);
  ASSERT_OK_AND_ASSIGN(
      Tensor t,
      Tensor::Randn({100000}, TensorOptions().WithDType(DType::kFloat64), &g));
  const double* data = t.data<double>();
  double sum = 0;
  double sum_sq = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(data[i]));
    sum += data[i];
    sum_sq += data[i] * data[i];
  }
  const double mean = sum / t.numel();
  const double stddev = std::sqrt(sum_sq / t.numel() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(stddev, 1.0, 0.02);
}

TEST(RandomTest, RandMomentsFloat32) {
  Generator g(31);
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Rand({100000}, {}, &g));
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sum += t.data<float>()[i];
  EXPECT_NEAR(sum / t.numel(), 0.5, 0.01);
}

TEST(RandomTest, RandnComplexHasUnitVariance) {
  Generator g(1);
  ASSERT_OK_AND_ASSIGN(
      Tensor t,
      Tensor::Randn({100000}, TensorOptions().WithDType(DType::kComplex128),
                    &g));
  const std::complex<double>* data = t.data<std::complex<double>>();
  double abs_sq = 0;
  double real_sq = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    abs_sq += std::norm(data[i]);
    real_sq += data[i].real() * data[i].real();
  }
  EXPECT_NEAR(abs_sq / t.numel(), 1.0, 0.03);
  EXPECT_NEAR(real_sq / t.numel(), 0.5, 0.02);
}

TEST(RandomTest, RandnHalfIsFinite) {
  Generator g(8);
  ASSERT_OK_AND_ASSIGN(
      Tensor t,
      Tensor::Randn({10000}, TensorOptions().WithDType(DType::kFloat16), &g));
  double sum = 0;
  for (double v : Values(t)) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
  }
  EXPECT_NEAR(sum / t.numel(), 0.0, 0.05);
}

TEST(RandomTest, PinnedRand) {
  Generator a(9);
  Generator b(9);
  ASSERT_OK_AND_ASSIGN(
      Tensor pinned,
      Tensor::Rand({16}, TensorOptions().WithPinMemory(true), &a));
  EXPECT_TRUE(pinned.is_pinned());
  ASSERT_OK_AND_ASSIGN(Tensor plain, Tensor::Rand({16}, {}, &b));
  EXPECT_TRUE(Equal(pinned, plain));
}

// ---- Equal edge cases
// -------------------------------------------------------------

TEST(EqualTest, NaNAndSignedZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ASSERT_OK_AND_ASSIGN(Tensor a, Tensor::FromVector<float>({nan}, {1}));
  EXPECT_FALSE(Equal(a, a));
  ASSERT_OK_AND_ASSIGN(Tensor pz, Tensor::FromVector<float>({0.0f}, {1}));
  ASSERT_OK_AND_ASSIGN(Tensor nz, Tensor::FromVector<float>({-0.0f}, {1}));
  EXPECT_TRUE(Equal(pz, nz));
  // Half and bfloat16 compare as numbers, not bits.
  ASSERT_OK_AND_ASSIGN(Tensor hp,
                       Tensor::FromVector<Half>({Half{0x0000}}, {1}));
  ASSERT_OK_AND_ASSIGN(Tensor hn,
                       Tensor::FromVector<Half>({Half{0x8000}}, {1}));
  EXPECT_TRUE(Equal(hp, hn));
  ASSERT_OK_AND_ASSIGN(Tensor hnan,
                       Tensor::FromVector<Half>({Half{0x7E00}}, {1}));
  EXPECT_FALSE(Equal(hnan, hnan));
  ASSERT_OK_AND_ASSIGN(Tensor bp,
                       Tensor::FromVector<BFloat16>({BFloat16{0x0000}}, {1}));
  ASSERT_OK_AND_ASSIGN(Tensor bn,
                       Tensor::FromVector<BFloat16>({BFloat16{0x8000}}, {1}));
  EXPECT_TRUE(Equal(bp, bn));
  ASSERT_OK_AND_ASSIGN(Tensor bnan,
                       Tensor::FromVector<BFloat16>({BFloat16{0x7FC0}}, {1}));
  EXPECT_FALSE(Equal(bnan, bnan));
}

TEST(EqualTest, ComplexComparesBothParts) {
  using C = std::complex<float>;
  ASSERT_OK_AND_ASSIGN(Tensor a, Tensor::FromVector<C>({C(1, 2)}, {1}));
  ASSERT_OK_AND_ASSIGN(Tensor b, Tensor::FromVector<C>({C(1, 3)}, {1}));
  ASSERT_OK_AND_ASSIGN(Tensor c, Tensor::FromVector<C>({C(1, 2)}, {1}));
  EXPECT_FALSE(Equal(a, b));
  EXPECT_TRUE(Equal(a, c));
  ASSERT_OK_AND_ASSIGN(
      Tensor n, Tensor::FromVector<C>(
                    {C(1, std::numeric_limits<float>::quiet_NaN())}, {1}));
  EXPECT_FALSE(Equal(n, n));
}

// ---- CopyRowMajorBytes
// -----------------------------------------------------------------------

// Every byte range of a view's row-major bytes, at every start and length
// class (inside one element, across runs, the whole), equals the same
// bytes of its contiguous copy.
TEST(CopyRowMajorBytesTest, EveryRangeOfEveryViewMatchesTheContiguousCopy) {
  ASSERT_OK_AND_ASSIGN(Tensor base, Iota({6, 8, 10}, DType::kFloat32));
  ASSERT_OK_AND_ASSIGN(Tensor rows, base.Narrow(0, 1, 4));
  ASSERT_OK_AND_ASSIGN(Tensor columns, base.Narrow(2, 3, 5));
  ASSERT_OK_AND_ASSIGN(Tensor box, columns.Narrow(1, 2, 5));
  ASSERT_OK_AND_ASSIGN(Tensor transposed, box.Transpose(0, 2));
  ASSERT_OK_AND_ASSIGN(Tensor single, base.Narrow(1, 7, 1));  // 6 x 1 x 10.
  ASSERT_OK_AND_ASSIGN(Tensor one, Iota({1}, DType::kInt64));
  for (const Tensor& view :
       {base, rows, columns, box, transposed, single, one}) {
    SCOPED_TRACE(view.DebugString());
    ASSERT_OK_AND_ASSIGN(Tensor packed, view.Contiguous());
    const char* want = static_cast<const char*>(packed.data_ptr());
    const int64_t total = static_cast<int64_t>(view.nbytes());
    for (int64_t offset :
         {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{4}, int64_t{19},
          int64_t{20}, int64_t{41}, total / 2, total - 1, total}) {
      if (offset > total) continue;
      for (int64_t bytes :
           {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{20},
            int64_t{63}, int64_t{200}, total - offset}) {
        if (bytes < 0 || offset + bytes > total) continue;
        std::string got(static_cast<size_t>(bytes), '\x55');
        ASSERT_OK(CopyRowMajorBytes(view, offset, static_cast<size_t>(bytes),
                                    got.data()));
        ASSERT_EQ(got, std::string(want + offset, static_cast<size_t>(bytes)))
            << "bytes [" << offset << ", +" << bytes << ")";
      }
    }
  }
}

// ForEachRowMajorRun hands out the runs of the same bytes in place: each
// inside the view's storage, at most RowMajorRunBytes long, joined equal
// to the copy.
TEST(CopyRowMajorBytesTest, RunsAreTheSameBytesInPlace) {
  ASSERT_OK_AND_ASSIGN(Tensor base, Iota({6, 8, 10}, DType::kFloat32));
  ASSERT_OK_AND_ASSIGN(Tensor columns, base.Narrow(2, 3, 5));
  EXPECT_EQ(RowMajorRunBytes(columns), 20);
  EXPECT_EQ(RowMajorRunBytes(base), static_cast<int64_t>(base.nbytes()));
  EXPECT_EQ(RowMajorRunBytes(Tensor()), 0);
  const char* begin = static_cast<const char*>(base.data_ptr());
  const char* end = begin + base.nbytes();
  std::string joined;
  int runs = 0;
  ASSERT_OK(ForEachRowMajorRun(columns, 7, 100, [&](const char* run, size_t n) {
    EXPECT_TRUE(run >= begin && run + n <= end);
    EXPECT_LE(static_cast<int64_t>(n), RowMajorRunBytes(columns));
    joined.append(run, n);
    ++runs;
  }));
  std::string copied(100, '\0');
  ASSERT_OK(CopyRowMajorBytes(columns, 7, 100, copied.data()));
  EXPECT_EQ(joined, copied);
  EXPECT_EQ(runs, 6);  // 13, 20, 20, 20, 20 and 7 bytes.
  EXPECT_THAT(ForEachRowMajorRun(columns, 1, 1000, [](const char*, size_t) {}),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
}

TEST(CopyRowMajorBytesTest, RangesOutsideTheTensorAndOtherDevicesAreRefused) {
  ASSERT_OK_AND_ASSIGN(Tensor t, Iota({4, 4}, DType::kFloat32));
  char out[128];
  EXPECT_THAT(CopyRowMajorBytes(t, 60, 5, out),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_THAT(CopyRowMajorBytes(t, -1, 1, out),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_THAT(CopyRowMajorBytes(t, 65, 0, out),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_OK(CopyRowMajorBytes(t, 64, 0, out));
  EXPECT_THAT(CopyRowMajorBytes(Tensor(), 0, 0, out),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  ASSERT_OK_AND_ASSIGN(
      Tensor meta,
      Tensor::Empty({4}, TensorOptions().WithDevice(Device::Meta())));
  EXPECT_THAT(CopyRowMajorBytes(meta, 0, 4, out),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

// ---- CopyBox
// -----------------------------------------------------------------------

TEST(CopyBoxTest, TwoDimensionalBox) {
  ASSERT_OK_AND_ASSIGN(Tensor src, Iota({4, 5}, DType::kFloat32));
  ASSERT_OK_AND_ASSIGN(Tensor dst, Tensor::Full({6, 7}, -1.0));
  ASSERT_OK(CopyBox(src, {1, 1}, dst, {3, 2}, {2, 3}));
  for (int64_t i = 0; i < 6; ++i) {
    for (int64_t j = 0; j < 7; ++j) {
      const bool inside = i >= 3 && i < 5 && j >= 2 && j < 5;
      const double expected = inside ? At(src, {i - 3 + 1, j - 2 + 1}) : -1.0;
      EXPECT_EQ(At(dst, {i, j}), expected) << i << "," << j;
    }
  }
}

TEST(CopyBoxTest, ThreeDimensionalBox) {
  ASSERT_OK_AND_ASSIGN(Tensor src, Iota({4, 5, 6}, DType::kInt64));
  ASSERT_OK_AND_ASSIGN(
      Tensor dst,
      Tensor::Full({3, 4, 5}, -1.0, TensorOptions().WithDType(DType::kInt64)));
  ASSERT_OK(CopyBox(src, {2, 1, 2}, dst, {1, 0, 1}, {2, 3, 4}));
  std::vector<int64_t> index(3, 0);
  do {
    const bool inside = index[0] >= 1 && index[0] < 3 && index[1] < 3 &&
                        index[2] >= 1 && index[2] < 5;
    const double expected =
        inside ? At(src, {index[0] + 1, index[1] + 1, index[2] + 1}) : -1.0;
    ASSERT_EQ(At(dst, index), expected)
        << index[0] << "," << index[1] << "," << index[2];
  } while (NextIndex(index, dst.sizes()));
}

TEST(CopyBoxTest, NonContiguousSourceAndDestination) {
  ASSERT_OK_AND_ASSIGN(Tensor base_src, Iota({8, 8}, DType::kFloat64));
  ASSERT_OK_AND_ASSIGN(Tensor src_cols, base_src.Narrow(1, 2, 4));  // 8 x 4.
  ASSERT_OK_AND_ASSIGN(Tensor src, src_cols.T());                   // 4 x 8.
  ASSERT_OK_AND_ASSIGN(
      Tensor base_dst,
      Tensor::Zeros({10, 10}, TensorOptions().WithDType(DType::kFloat64)));
  ASSERT_OK_AND_ASSIGN(Tensor dst_rows, base_dst.Narrow(0, 3, 5));  // 5 x 10.
  ASSERT_OK_AND_ASSIGN(Tensor dst, dst_rows.Narrow(1, 1, 6));       // 5 x 6.
  EXPECT_FALSE(src.is_contiguous());
  EXPECT_FALSE(dst.is_contiguous());
  ASSERT_OK(CopyBox(src, {1, 2}, dst, {0, 1}, {3, 5}));
  for (int64_t i = 0; i < 10; ++i) {
    for (int64_t j = 0; j < 10; ++j) {
      // dst(i', j') = base_dst(i' + 3, j' + 1) for the box i' in [0, 3),
      // j' in [1, 6); it holds src(i' + 1, j' + 1) = base_src(j' + 1, i' + 3).
      const int64_t di = i - 3;
      const int64_t dj = j - 1;
      const bool inside = di >= 0 && di < 3 && dj >= 1 && dj < 6;
      const double expected = inside ? At(base_src, {dj + 1, di + 3}) : 0.0;
      EXPECT_EQ(At(base_dst, {i, j}), expected) << i << "," << j;
    }
  }
}

TEST(CopyBoxTest, RandomizedAgainstElementwiseCopy) {
  std::mt19937 rng(12345);
  auto uniform = [&rng](int64_t lo, int64_t hi) {  // Inclusive.
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 300; ++trial) {
    const DType dtype = kAllDTypes[trial % 12];
    const int64_t rank = uniform(1, 4);
    // Tensors bigger than the box, viewed through random transposes and
    // narrows so that every stride pattern shows up.
    auto make_view = [&](bool zeros, std::vector<int64_t> box) -> Tensor {
      std::vector<int64_t> sizes(rank);
      for (int64_t d = 0; d < rank; ++d) sizes[d] = box[d] + uniform(0, 3);
      std::vector<int64_t> padded = sizes;
      for (int64_t& s : padded) s += uniform(0, 2);
      Tensor t =
          zeros ? *Tensor::Full(padded, 3.0, TensorOptions().WithDType(dtype))
                : *Iota(padded, dtype, 89);
      for (int64_t d = 0; d < rank; ++d) {
        t = *t.Narrow(d, uniform(0, padded[d] - sizes[d]), sizes[d]);
      }
      if (rank >= 2 && uniform(0, 1) == 1) {
        // Transpose the storage layout but keep the logical sizes by
        // transposing a tensor created with swapped sizes.
        const int64_t a = uniform(0, rank - 1);
        const int64_t b = uniform(0, rank - 1);
        std::vector<int64_t> swapped = sizes;
        std::swap(swapped[a], swapped[b]);
        Tensor s = zeros ? *Tensor::Full(swapped, 3.0,
                                         TensorOptions().WithDType(dtype))
                         : *Iota(swapped, dtype, 89);
        t = *s.Transpose(a, b);
      }
      return t;
    };
    std::vector<int64_t> box(rank);
    for (int64_t& b : box) b = uniform(0, 4);
    Tensor src = make_view(false, box);
    Tensor dst = make_view(true, box);
    std::vector<int64_t> src_off(rank);
    std::vector<int64_t> dst_off(rank);
    for (int64_t d = 0; d < rank; ++d) {
      src_off[d] = uniform(0, src.sizes()[d] - box[d]);
      dst_off[d] = uniform(0, dst.sizes()[d] - box[d]);
    }
    ASSERT_OK_AND_ASSIGN(Tensor before, dst.Clone());
    ASSERT_OK(CopyBox(src, src_off, dst, dst_off, box)) << "trial " << trial;
    if (dst.numel() == 0) continue;
    std::vector<int64_t> index(rank, 0);
    do {
      bool inside = true;
      std::vector<int64_t> src_index(rank);
      for (int64_t d = 0; d < rank; ++d) {
        inside &= index[d] >= dst_off[d] && index[d] < dst_off[d] + box[d];
        src_index[d] = index[d] - dst_off[d] + src_off[d];
      }
      const double expected = inside ? At(src, src_index) : At(before, index);
      ASSERT_EQ(At(dst, index), expected) << "trial " << trial;
      if (inside && IsComplex(dtype)) {
        ASSERT_EQ(ImagAt(dst, index), ImagAt(src, src_index));
      }
    } while (NextIndex(index, dst.sizes()));
  }
}

TEST(CopyBoxTest, LargeContiguousCopy) {
  Generator g(4);
  ASSERT_OK_AND_ASSIGN(Tensor src, Tensor::Rand({256, 1024}, {}, &g));
  ASSERT_OK_AND_ASSIGN(Tensor dst, Tensor::Empty({256, 1024}));
  ASSERT_OK(CopyInto(src, dst));
  EXPECT_TRUE(Equal(src, dst));
  EXPECT_EQ(std::memcmp(src.data_ptr(), dst.data_ptr(), src.nbytes()), 0);
}

TEST(CopyBoxTest, OutOfRangeBoxes) {
  ASSERT_OK_AND_ASSIGN(Tensor src, Tensor::Zeros({10}));
  ASSERT_OK_AND_ASSIGN(Tensor dst, Tensor::Zeros({20}));
  EXPECT_THAT(CopyBox(src, {8}, dst, {0}, {4}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("box [8, 12) of dim 0 leaves tensor of size "
                                 "10")));
  EXPECT_THAT(CopyBox(src, {0}, dst, {18}, {4}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       AllOf(HasSubstr("dst"),
                             HasSubstr("box [18, 22) of dim 0 leaves tensor of "
                                       "size 20"))));
  ASSERT_OK_AND_ASSIGN(Tensor src2, Tensor::Zeros({3, 4}));
  ASSERT_OK_AND_ASSIGN(Tensor dst2, Tensor::Zeros({3, 4}));
  EXPECT_THAT(
      CopyBox(src2, {0, 1}, dst2, {0, 0}, {3, 4}),
      StatusIs(absl::StatusCode::kOutOfRange,
               HasSubstr("box [1, 5) of dim 1 leaves tensor of size 4")));
  EXPECT_THAT(CopyBox(src2, {0, 11}, dst2, {0, 0}, {0, 0}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("box [11, 11) of dim 1")));
  EXPECT_THAT(CopyBox(src2, {0, std::numeric_limits<int64_t>::max()}, dst2,
                      {0, 0}, {1, 1}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("dim 1")));
}

TEST(CopyBoxTest, InvalidArguments) {
  ASSERT_OK_AND_ASSIGN(Tensor f, Tensor::Zeros({3, 4}));
  ASSERT_OK_AND_ASSIGN(Tensor g, Tensor::Zeros({3, 4}));
  ASSERT_OK_AND_ASSIGN(
      Tensor i,
      Tensor::Zeros({3, 4}, TensorOptions().WithDType(DType::kInt32)));
  ASSERT_OK_AND_ASSIGN(Tensor v, Tensor::Zeros({12}));
  EXPECT_THAT(CopyBox(f, {0, 0}, i, {0, 0}, {1, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("dtype"), HasSubstr("float32"),
                             HasSubstr("int32"))));
  EXPECT_THAT(CopyBox(f, {0, 0}, v, {0}, {1, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
  EXPECT_THAT(CopyBox(f, {0}, g, {0, 0}, {1, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
  EXPECT_THAT(CopyBox(f, {0, 0}, g, {0, 0}, {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
  EXPECT_THAT(
      CopyBox(f, {0, -1}, g, {0, 0}, {1, 1}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(
      CopyBox(f, {0, 0}, g, {-2, 0}, {1, 1}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(
      CopyBox(f, {0, 0}, g, {0, 0}, {1, -1}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(CopyInto(f, v), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("size mismatch")));
  EXPECT_THAT(CopyInto(f, i),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
}

// A zero dimension beside huge ones (a crafted .npy shape, found by the
// npy fuzzer): no elements, and strides that saturate instead of
// overflowing.
TEST(TensorTest, EmptyTensorsWithHugeDimensionsDoNotOverflowTheirStrides) {
  constexpr int64_t kHuge = int64_t{1} << 40;
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Empty({0, kHuge, kHuge}));
  EXPECT_EQ(t.numel(), 0);
  EXPECT_THAT(t.strides(),
              ElementsAre(std::numeric_limits<int64_t>::max(), kHuge, 1));
}

TEST(CopyBoxTest, ZeroSizeBoxesCopyNothing) {
  ASSERT_OK_AND_ASSIGN(Tensor src, Iota({3, 4}, DType::kFloat32));
  ASSERT_OK_AND_ASSIGN(Tensor dst, Tensor::Full({3, 4}, 9.0));
  ASSERT_OK(CopyBox(src, {0, 0}, dst, {0, 0}, {0, 4}));
  ASSERT_OK(CopyBox(src, {3, 4}, dst, {3, 4}, {0, 0}));  // At the very end.
  ASSERT_OK(CopyBox(src, {1, 4}, dst, {1, 0}, {2, 0}));
  // Empty boxes are still checked against their tensors.
  EXPECT_THAT(CopyBox(src, {1, 4}, dst, {2, 0}, {2, 0}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("dst box [2, 4) of dim 0")));
  EXPECT_THAT(Values(dst), ::testing::Each(9.0));
  ASSERT_OK_AND_ASSIGN(Tensor empty_src, Tensor::Empty({0, 4}));
  ASSERT_OK_AND_ASSIGN(Tensor empty_dst, Tensor::Empty({0, 4}));
  ASSERT_OK(CopyInto(empty_src, empty_dst));
  ASSERT_OK(CopyBox(empty_src, {0, 1}, dst, {1, 1}, {0, 3}));
}

TEST(CopyBoxTest, SingleElementsAndZeroDim) {
  ASSERT_OK_AND_ASSIGN(Tensor src, Iota({5, 5}, DType::kInt8));
  ASSERT_OK_AND_ASSIGN(
      Tensor dst, Tensor::Zeros({2}, TensorOptions().WithDType(DType::kInt8)));
  ASSERT_OK_AND_ASSIGN(Tensor src_row, src.Narrow(0, 4, 1));
  ASSERT_OK_AND_ASSIGN(Tensor src_flat, src_row.View({5}));
  ASSERT_OK(CopyBox(src_flat, {3}, dst, {1}, {1}));
  EXPECT_THAT(Values(dst), ElementsAre(0, 23));
  ASSERT_OK_AND_ASSIGN(Tensor a, Tensor::Full({}, 2.0));
  ASSERT_OK_AND_ASSIGN(Tensor b, Tensor::Full({}, 0.0));
  ASSERT_OK(CopyBox(a, {}, b, {}, {}));
  EXPECT_EQ(*b.data<float>(), 2.0f);
}

TEST(CopyBoxTest, MetaTensors) {
  const TensorOptions meta = TensorOptions().WithDevice(Device::Meta());
  ASSERT_OK_AND_ASSIGN(Tensor m1, Tensor::Empty({4, 4}, meta));
  ASSERT_OK_AND_ASSIGN(Tensor m2, Tensor::Empty({4, 4}, meta));
  ASSERT_OK_AND_ASSIGN(Tensor cpu, Tensor::Zeros({4, 4}));
  EXPECT_OK(CopyBox(m1, {0, 0}, m2, {1, 1}, {3, 3}));
  EXPECT_OK(CopyBox(cpu, {0, 0}, m2, {1, 1}, {3, 3}));
  EXPECT_THAT(
      CopyBox(m1, {0, 0}, cpu, {1, 1}, {3, 3}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("meta tensor")));
  // Boxes are still checked.
  EXPECT_THAT(CopyBox(m1, {2, 0}, m2, {0, 0}, {3, 3}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("box [2, 5) of dim 0")));
}

}  // namespace
}  // namespace tessera
