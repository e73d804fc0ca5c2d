// ChunkSource: the staging pipeline over a recording host copier (order of
// copies and waits, overlap depth, buffer reuse only after release, errors,
// byte-exact output), host sources (views of the storage, strided regions
// made contiguous by PrepareFetch), and the CUDA copier when a device is
// visible.
#include "server/serve/chunk_source.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/serve/shard_registry.h"
#include "server/serve/shard_service.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::_;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---- A recording host copier ------------------------------------------------

// What a RecordingCopier did, shared with its buffers (which may outlive
// it): "A<id>" a buffer allocated, "E<ticket>" a copy enqueued, "W<ticket>"
// waited for, "F<id>" a buffer freed, "~" the copier destroyed.
class OpLog {
 public:
  void Add(std::string op) {
    absl::MutexLock lock(&mu_);
    ops_.push_back(std::move(op));
  }
  std::vector<std::string> ops() const {
    absl::MutexLock lock(&mu_);
    return ops_;
  }
  // The ops whose names start with one of `kinds`, space-separated.
  std::string Only(absl::string_view kinds) const {
    std::vector<std::string> picked;
    for (const std::string& op : ops()) {
      if (kinds.find(op[0]) != absl::string_view::npos) picked.push_back(op);
    }
    return absl::StrJoin(picked, " ");
  }
  int Count(char kind) const {
    int n = 0;
    for (const std::string& op : ops()) n += op[0] == kind;
    return n;
  }
  // Index of `op` in the log; -1 if absent.
  int IndexOf(absl::string_view op) const {
    const std::vector<std::string> all = ops();
    auto it = std::find(all.begin(), all.end(), op);
    return it == all.end() ? -1 : static_cast<int>(it - all.begin());
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> ops_ ABSL_GUARDED_BY(mu_);
};

class HeapBuffer final : public StagingBuffer {
 public:
  HeapBuffer(size_t size, int id, std::shared_ptr<OpLog> log)
      : bytes_(size, '\xEE'), id_(id), log_(std::move(log)) {
    log_->Add(absl::StrCat("A", id_));
  }
  ~HeapBuffer() override { log_->Add(absl::StrCat("F", id_)); }
  char* data() override { return bytes_.data(); }
  size_t size() const override { return bytes_.size(); }

 private:
  std::string bytes_;
  const int id_;
  const std::shared_ptr<OpLog> log_;
};

// Which allocation, enqueue or wait (counted from 0) of a RecordingCopier
// fails; -1: none.
struct Faults {
  int buffer = -1;
  int enqueue = -1;
  int wait = -1;

  static Faults Buffer(int n) { return Faults{n, -1, -1}; }
  static Faults Enqueue(int n) { return Faults{-1, n, -1}; }
  static Faults Wait(int n) { return Faults{-1, -1, n}; }
};

// Copies `source` only when a ticket is waited for, as an asynchronous
// engine may finish late: a chunk handed out before its wait, or a buffer
// reused while a chunk in it is still held, shows up as wrong bytes.
// Failures can be injected at the n-th allocation, enqueue or wait.
class RecordingCopier final : public StagingCopier {
 public:
  RecordingCopier(std::string source, std::shared_ptr<OpLog> log,
                  Faults faults = {})
      : source_(std::move(source)), log_(std::move(log)), faults_(faults) {}

  ~RecordingCopier() override {
    // The source waits for every copy it enqueued before letting go.
    EXPECT_TRUE(pending_.empty()) << pending_.size() << " copies not waited";
    log_->Add("~");
  }

  absl::StatusOr<std::unique_ptr<StagingBuffer>> NewBuffer(
      size_t bytes) override {
    if (buffers_++ == faults_.buffer) {
      return absl::ResourceExhaustedError("injected allocation failure");
    }
    return std::unique_ptr<StagingBuffer>(
        new HeapBuffer(bytes, buffers_ - 1, log_));
  }

  absl::StatusOr<Ticket> Enqueue(int64_t offset, size_t bytes,
                                 char* destination) override {
    if (enqueues_++ == faults_.enqueue) {
      return absl::InternalError("injected enqueue failure");
    }
    EXPECT_GE(offset, 0);
    EXPECT_LE(offset + bytes, source_.size());
    const Ticket ticket = next_ticket_++;
    pending_.emplace(ticket, Copy{offset, bytes, destination});
    log_->Add(absl::StrCat("E", ticket));
    return ticket;
  }

  absl::Status Wait(Ticket ticket) override {
    EXPECT_FALSE(pending_.empty());
    if (pending_.empty()) return absl::InternalError("nothing pending");
    EXPECT_EQ(ticket, pending_.begin()->first) << "waited out of order";
    auto it = pending_.find(ticket);
    if (it == pending_.end()) return absl::InternalError("unknown ticket");
    const Copy copy = it->second;
    pending_.erase(it);
    log_->Add(absl::StrCat("W", ticket));
    if (waits_++ == faults_.wait) {
      return absl::InternalError("injected copy failure");
    }
    std::memcpy(copy.destination, source_.data() + copy.offset, copy.bytes);
    return absl::OkStatus();
  }

 private:
  struct Copy {
    int64_t offset;
    size_t bytes;
    char* destination;
  };

  const std::string source_;
  const std::shared_ptr<OpLog> log_;
  const Faults faults_;
  int buffers_ = 0;
  int enqueues_ = 0;
  int waits_ = 0;
  Ticket next_ticket_ = 0;
  std::map<Ticket, Copy> pending_;
};

// `size` bytes that differ from position to position.
std::string Pattern(size_t size, uint32_t seed = 1) {
  std::string bytes(size, '\0');
  uint32_t state = seed * 2654435761u + 1;
  for (char& byte : bytes) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<char>(state >> 24);
  }
  return bytes;
}

std::string BytesOf(const HostChunk& chunk) {
  return std::string(chunk.data, chunk.size);
}

class StagedSourceTest : public ::testing::Test {
 protected:
  std::unique_ptr<ChunkSource> Source(const std::string& bytes,
                                      int64_t chunk_bytes, int depth,
                                      Faults faults = {}) {
    absl::StatusOr<std::unique_ptr<ChunkSource>> source = NewStagedChunkSource(
        std::make_unique<RecordingCopier>(bytes, log_, faults),
        static_cast<int64_t>(bytes.size()), chunk_bytes, depth);
    EXPECT_OK(source.status());
    return source.ok() ? *std::move(source) : nullptr;
  }

  // Takes every chunk, dropping each at once; returns their bytes.
  std::string Drain(ChunkSource& source, std::vector<int64_t>* sizes) {
    std::string out;
    while (!source.done()) {
      absl::StatusOr<HostChunk> chunk = source.Next();
      EXPECT_OK(chunk.status());
      if (!chunk.ok()) break;
      EXPECT_EQ(chunk->offset, static_cast<int64_t>(out.size()));
      out += BytesOf(*chunk);
      if (sizes != nullptr) sizes->push_back(chunk->size);
    }
    return out;
  }

  std::shared_ptr<OpLog> log_ = std::make_shared<OpLog>();
};

// ---- Pipeline order ---------------------------------------------------------

TEST_F(StagedSourceTest, EnqueuesDepthAheadBeforeWaiting) {
  const std::string bytes = Pattern(437);  // 4 chunks of 100 and one of 37.
  std::unique_ptr<ChunkSource> source = Source(bytes, 100, /*depth=*/2);
  EXPECT_EQ(source->num_chunks(), 5);
  std::vector<int64_t> sizes;
  EXPECT_EQ(Drain(*source, &sizes), bytes);
  EXPECT_THAT(sizes, ElementsAre(100, 100, 100, 100, 37));
  // Chunk k is waited for only once the copies of k+1 and k+2 are queued.
  EXPECT_EQ(log_->Only("EW"), "E0 E1 E2 W0 E3 W1 E4 W2 W3 W4");
  // Each chunk was dropped at once: depth + 1 buffers suffice.
  EXPECT_EQ(log_->Count('A'), 3);
}

TEST_F(StagedSourceTest, DepthOneOverlapsOneChunk) {
  const std::string bytes = Pattern(400);
  std::unique_ptr<ChunkSource> source = Source(bytes, 100, /*depth=*/1);
  EXPECT_EQ(Drain(*source, nullptr), bytes);
  EXPECT_EQ(log_->Only("EW"), "E0 E1 W0 E2 W1 E3 W2 W3");
  EXPECT_EQ(log_->Count('A'), 2);
}

TEST_F(StagedSourceTest, DepthIsClamped) {
  const std::string bytes = Pattern(300);
  std::unique_ptr<ChunkSource> shallow = Source(bytes, 100, /*depth=*/0);
  EXPECT_EQ(Drain(*shallow, nullptr), bytes);
  EXPECT_EQ(log_->Only("EW"), "E0 E1 W0 E2 W1 W2");

  auto deep_log = std::make_shared<OpLog>();
  const std::string many = Pattern(40 * 10);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<ChunkSource> deep,
      NewStagedChunkSource(std::make_unique<RecordingCopier>(many, deep_log),
                           static_cast<int64_t>(many.size()), 10, 1000));
  ASSERT_OK(deep->Next().status());
  // kMaxStagingDepth chunks ahead of the first.
  EXPECT_EQ(deep_log->Count('E'), kMaxStagingDepth + 1);
}

TEST_F(StagedSourceTest, ByteExactForManyShapes) {
  for (size_t total : {1u, 99u, 100u, 101u, 1000u, 4097u}) {
    for (int64_t chunk : {1, 7, 100, 4096}) {
      for (int depth : {1, 2, 5}) {
        SCOPED_TRACE(absl::StrCat(total, " bytes, chunks of ", chunk,
                                  ", depth ", depth));
        const std::string bytes = Pattern(total, total + chunk);
        std::unique_ptr<ChunkSource> source = Source(bytes, chunk, depth);
        std::vector<int64_t> sizes;
        EXPECT_EQ(Drain(*source, &sizes), bytes);
        EXPECT_EQ(static_cast<int64_t>(sizes.size()), source->num_chunks());
        for (size_t i = 0; i + 1 < sizes.size(); ++i) {
          EXPECT_EQ(sizes[i], chunk);
        }
        EXPECT_EQ(sizes.back(), (total - 1) % chunk + 1);
      }
    }
  }
}

TEST_F(StagedSourceTest, ZeroBytesHasNoChunksAndCopiesNothing) {
  std::unique_ptr<ChunkSource> source = Source("", 100, 2);
  EXPECT_EQ(source->num_chunks(), 0);
  EXPECT_TRUE(source->done());
  EXPECT_THAT(source->Next(), StatusIs(absl::StatusCode::kOutOfRange, _));
  source.reset();
  EXPECT_EQ(log_->Only("AEWF"), "");
}

TEST_F(StagedSourceTest, NextAfterTheLastChunkIsOutOfRange) {
  std::unique_ptr<ChunkSource> source = Source(Pattern(150), 100, 2);
  ASSERT_OK(source->Next().status());
  ASSERT_OK(source->Next().status());
  EXPECT_TRUE(source->done());
  EXPECT_THAT(source->Next(), StatusIs(absl::StatusCode::kOutOfRange,
                                       HasSubstr("every chunk")));
}

TEST_F(StagedSourceTest, SingleChunkBufferIsTheSizeOfTheBytes) {
  const std::string bytes = Pattern(37);
  std::unique_ptr<ChunkSource> source = Source(bytes, 4096, 2);
  ASSERT_OK_AND_ASSIGN(HostChunk chunk, source->Next());
  EXPECT_EQ(BytesOf(chunk), bytes);
  EXPECT_TRUE(source->done());
  EXPECT_EQ(log_->Only("EW"), "E0 W0");
}

// ---- Buffer reuse -----------------------------------------------------------

TEST_F(StagedSourceTest, HeldChunksKeepTheirBuffers) {
  // Nothing is released: the pool's depth + 2 buffers run out and every
  // later chunk gets a transient one; no held buffer is ever copied into
  // again (copies land at Wait, so a reused buffer would change a held
  // chunk's bytes).
  const std::string bytes = Pattern(20 * 64);
  std::unique_ptr<ChunkSource> source = Source(bytes, 64, 2);
  std::vector<HostChunk> held;
  while (!source->done()) {
    ASSERT_OK_AND_ASSIGN(HostChunk chunk, source->Next());
    held.push_back(std::move(chunk));
  }
  EXPECT_EQ(log_->Count('A'), 20);
  EXPECT_EQ(log_->Count('F'), 0);
  for (const HostChunk& chunk : held) {
    EXPECT_EQ(BytesOf(chunk), bytes.substr(chunk.offset, chunk.size));
  }
  // Transient buffers are freed on release, pooled ones kept by the pool.
  held.clear();
  EXPECT_EQ(log_->Count('F'), 20 - 4);
  source.reset();
  EXPECT_EQ(log_->Count('F'), 20);
}

TEST_F(StagedSourceTest, ReleasedBuffersAreReused) {
  // A consumer that holds the previous chunk while taking the next (as
  // gRPC may hold a slice after its write completed) needs depth + 2.
  const std::string bytes = Pattern(50 * 32);
  std::unique_ptr<ChunkSource> source = Source(bytes, 32, 2);
  std::string out;
  HostChunk previous;
  while (!source->done()) {
    ASSERT_OK_AND_ASSIGN(HostChunk chunk, source->Next());
    EXPECT_EQ(BytesOf(chunk), bytes.substr(chunk.offset, chunk.size));
    if (previous.owner != nullptr) {
      EXPECT_EQ(BytesOf(previous), bytes.substr(previous.offset, 32))
          << "buffer of a held chunk was reused";
      EXPECT_NE(previous.data, chunk.data);
    }
    out += BytesOf(chunk);
    previous = std::move(chunk);
  }
  EXPECT_EQ(out, bytes);
  EXPECT_EQ(log_->Count('A'), 4);
  EXPECT_EQ(log_->Count('F'), 0);
}

TEST_F(StagedSourceTest, ChunksReleasedOnOtherThreadsAreReusedOnlyAfter) {
  // Chunks go to a thread that checks their bytes after a random delay and
  // only then drops them; a buffer reused early would fail the check.
  const std::string bytes = Pattern(300 * 16, 5);
  std::unique_ptr<ChunkSource> source = Source(bytes, 16, 3);
  struct Handoff {
    bool Ready() const { return !queue.empty() || finished; }
    absl::Mutex mu;
    std::deque<HostChunk> queue ABSL_GUARDED_BY(mu);
    bool finished ABSL_GUARDED_BY(mu) = false;
  } handoff;
  int bad = 0;
  int checked = 0;
  std::thread releaser([&] {
    std::mt19937 random(7);
    while (true) {
      HostChunk chunk;
      {
        absl::MutexLock lock(&handoff.mu);
        handoff.mu.Await(absl::Condition(&handoff, &Handoff::Ready));
        if (handoff.queue.empty()) return;
        chunk = std::move(handoff.queue.front());
        handoff.queue.pop_front();
      }
      absl::SleepFor(absl::Microseconds(random() % 200));
      if (BytesOf(chunk) != bytes.substr(chunk.offset, chunk.size)) ++bad;
      ++checked;
    }
  });
  while (!source->done()) {
    absl::StatusOr<HostChunk> chunk = source->Next();
    if (!chunk.ok()) {
      ADD_FAILURE() << chunk.status();
      break;
    }
    absl::MutexLock lock(&handoff.mu);
    handoff.queue.push_back(*std::move(chunk));
  }
  {
    absl::MutexLock lock(&handoff.mu);
    handoff.finished = true;
  }
  releaser.join();
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(checked, 300);
}

// ---- Lifetime and cancellation ----------------------------------------------

TEST_F(StagedSourceTest, DestroyingMidStreamWaitsForCopiesInFlight) {
  const std::string bytes = Pattern(1000);
  std::unique_ptr<ChunkSource> source = Source(bytes, 100, 2);
  ASSERT_OK_AND_ASSIGN(HostChunk first, source->Next());
  source.reset();  // A client gone after one chunk.
  // The copies in flight were waited for, in order, before the copier went;
  // no buffer was freed while a copy could write into it.
  EXPECT_EQ(log_->Only("EW~"), "E0 E1 E2 W0 W1 W2 ~");
  EXPECT_EQ(log_->Count('F'), 0);
  // The chunk handed out outlives the source, and keeps the pool.
  EXPECT_EQ(BytesOf(first), bytes.substr(0, 100));
  first = HostChunk();
  EXPECT_EQ(log_->Count('F'), 3);
  EXPECT_GT(log_->IndexOf("F0"), log_->IndexOf("~"));
}

TEST_F(StagedSourceTest, DestroyingBeforeTheFirstChunkCopiesNothing) {
  std::unique_ptr<ChunkSource> source = Source(Pattern(1000), 100, 2);
  source.reset();
  EXPECT_EQ(log_->Only("AEWF~"), "~");
}

// ---- Errors -----------------------------------------------------------------

TEST_F(StagedSourceTest, FailedCopyEndsTheSource) {
  const std::string bytes = Pattern(500);
  std::unique_ptr<ChunkSource> source = Source(bytes, 100, 2, Faults::Wait(2));
  ASSERT_OK_AND_ASSIGN(HostChunk c0, source->Next());
  ASSERT_OK_AND_ASSIGN(HostChunk c1, source->Next());
  EXPECT_EQ(BytesOf(c0) + BytesOf(c1), bytes.substr(0, 200));
  EXPECT_THAT(source->Next(), StatusIs(absl::StatusCode::kInternal,
                                       HasSubstr("injected copy failure")));
  EXPECT_FALSE(source->done());
  // Sticky, and nothing more is enqueued or waited for.
  const std::string before = log_->Only("EW");
  EXPECT_THAT(source->Next(), StatusIs(absl::StatusCode::kInternal,
                                       HasSubstr("injected copy failure")));
  EXPECT_EQ(log_->Only("EW"), before);
  source.reset();
  EXPECT_EQ(log_->Only("EW~"), "E0 E1 E2 W0 E3 W1 E4 W2 W3 W4 ~");
}

TEST_F(StagedSourceTest, FailedEnqueueEndsTheSource) {
  std::unique_ptr<ChunkSource> source =
      Source(Pattern(500), 100, 2, Faults::Enqueue(3));
  ASSERT_OK(source->Next().status());
  EXPECT_THAT(source->Next(), StatusIs(absl::StatusCode::kInternal,
                                       HasSubstr("injected enqueue failure")));
  EXPECT_THAT(source->Next(), StatusIs(absl::StatusCode::kInternal, _));
  source.reset();
  // The copies enqueued before the failure were still waited for.
  EXPECT_EQ(log_->Only("EW~"), "E0 E1 E2 W0 W1 W2 ~");
  // The buffer taken for the failed copy went back to the pool.
  EXPECT_EQ(log_->Count('A'), log_->Count('F'));
}

TEST_F(StagedSourceTest, FailedAllocationEndsTheSource) {
  std::unique_ptr<ChunkSource> source =
      Source(Pattern(500), 100, 2, Faults::Buffer(1));
  EXPECT_THAT(source->Next(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("injected allocation failure")));
  source.reset();
  EXPECT_EQ(log_->Only("EW~"), "E0 W0 ~");
}

TEST(StagedSourceArgumentsTest, InvalidArguments) {
  auto log = std::make_shared<OpLog>();
  EXPECT_THAT(
      NewStagedChunkSource(nullptr, 10, 10),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("copier")));
  EXPECT_THAT(
      NewStagedChunkSource(std::make_unique<RecordingCopier>("", log), -1, 10),
      StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(
      NewStagedChunkSource(std::make_unique<RecordingCopier>("abc", log), 3, 0),
      StatusIs(absl::StatusCode::kInvalidArgument, _));
}

// ---- Host sources -----------------------------------------------------------

Tensor HostPattern(std::vector<int64_t> sizes, DType dtype, uint32_t seed = 3) {
  absl::StatusOr<Tensor> tensor =
      Tensor::Empty(sizes, TensorOptions().WithDType(dtype));
  EXPECT_OK(tensor.status());
  const std::string bytes = Pattern(tensor->nbytes(), seed);
  if (!bytes.empty())
    std::memcpy(tensor->data_ptr(), bytes.data(), bytes.size());
  return *tensor;
}

std::string RowMajor(const Tensor& tensor) {
  absl::StatusOr<Tensor> host =
      tensor.device().is_cpu() ? tensor.Contiguous() : tensor.To(Device::Cpu());
  EXPECT_OK(host.status());
  return std::string(static_cast<const char*>(host->data_ptr()),
                     host->nbytes());
}

// Every chunk of `source`, concatenated; checks offsets and sizes.
std::string AllChunks(ChunkSource& source, std::vector<HostChunk>* kept) {
  std::string out;
  while (!source.done()) {
    absl::StatusOr<HostChunk> chunk = source.Next();
    EXPECT_OK(chunk.status());
    if (!chunk.ok()) break;
    EXPECT_EQ(chunk->offset, static_cast<int64_t>(out.size()));
    EXPECT_LE(static_cast<int64_t>(chunk->size), source.chunk_bytes());
    out += BytesOf(*chunk);
    if (kept != nullptr) kept->push_back(*std::move(chunk));
  }
  return out;
}

TEST(HostChunkSourceTest, ChunksAreViewsOfTheStorage) {
  Tensor tensor = HostPattern({1001}, DType::kFloat32);
  const std::string expected = RowMajor(tensor);
  const char* base = static_cast<const char*>(tensor.data_ptr());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSource> source,
                       NewChunkSource(tensor, 1000));
  EXPECT_EQ(source->num_chunks(), 5);  // 4004 bytes.
  std::vector<HostChunk> chunks;
  EXPECT_EQ(AllChunks(*source, &chunks), expected);
  for (const HostChunk& chunk : chunks) {
    EXPECT_EQ(chunk.data, base + chunk.offset);  // No copy.
  }
  EXPECT_EQ(chunks.back().size, 4u);
  // The chunks keep the storage alive on their own.
  source.reset();
  tensor = Tensor();
  std::string again;
  for (const HostChunk& chunk : chunks) again += BytesOf(chunk);
  EXPECT_EQ(again, expected);
}

TEST(HostChunkSourceTest, EmptyAndInvalidTensors) {
  ASSERT_OK_AND_ASSIGN(Tensor empty, Tensor::Empty({0, 5}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSource> source,
                       NewChunkSource(empty, 4096));
  EXPECT_TRUE(source->done());
  EXPECT_EQ(source->num_chunks(), 0);
  EXPECT_THAT(source->Next(), StatusIs(absl::StatusCode::kOutOfRange, _));

  EXPECT_THAT(
      NewChunkSource(Tensor(), 4096),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("undefined")));
  ASSERT_OK_AND_ASSIGN(
      Tensor meta,
      Tensor::Empty({4}, TensorOptions().WithDevice(Device::Meta())));
  EXPECT_THAT(
      NewChunkSource(meta, 4096),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("meta")));
  EXPECT_THAT(NewChunkSource(HostPattern({4}, DType::kInt32), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
}

// `tensor` as the only local shard (index 1 of 3, cut along dim 0) of "t".
std::shared_ptr<ShardRegistry> RegistryWith(const Tensor& tensor) {
  std::shared_ptr<RegisteredTensor> registered =
      testing::AsLocalShard(tensor, 1, 3);
  auto registry = std::make_shared<ShardRegistry>();
  EXPECT_OK(registry->Register("t", registered));
  return registry;
}

v1::FetchShardRequest RegionRequest(std::vector<int64_t> offsets,
                                    std::vector<int64_t> sizes) {
  v1::FetchShardRequest request;
  request.set_tensor_id("t");
  request.set_shard_index(1);
  request.mutable_region_offsets()->Add(offsets.begin(), offsets.end());
  request.mutable_region_sizes()->Add(sizes.begin(), sizes.end());
  return request;
}

TEST(HostChunkSourceTest, StridedRegionOfAHostShard) {
  const Tensor shard = HostPattern({30, 40}, DType::kInt16);
  std::shared_ptr<ShardRegistry> registry = RegistryWith(shard);
  ASSERT_OK_AND_ASSIGN(
      PreparedFetch prepared,
      PrepareFetch(*registry, RegionRequest({3, 5}, {20, 17})));
  // The box is sent from the shard's own memory: no copy of it is made
  // before its first chunk.
  EXPECT_TRUE(prepared.bytes.device().is_cpu());
  EXPECT_FALSE(prepared.bytes.is_contiguous());
  EXPECT_EQ(prepared.bytes.storage(), shard.storage());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSource> source,
                       NewChunkSource(prepared.bytes, 64));
  ASSERT_OK_AND_ASSIGN(Tensor expected, RegionView(shard, {3, 5}, {20, 17}));
  std::vector<HostChunk> kept;
  EXPECT_EQ(AllChunks(*source, &kept), RowMajor(expected));
  EXPECT_EQ(source->total_bytes(), prepared.header.total_bytes());
  // Chunks held after the source is gone keep their bytes (a transport
  // may still be writing them).
  source.reset();
  std::string again;
  for (const HostChunk& chunk : kept) again += BytesOf(chunk);
  EXPECT_EQ(again, RowMajor(expected));
}

// A strided box is gathered one chunk at a time, each just before it is
// handed out, into at most two reused buffers while chunks are released
// after they are sent.
TEST(HostChunkSourceTest, StridedBoxesAreGatheredChunkByChunk) {
  const Tensor shard = HostPattern({64, 48}, DType::kFloat32);
  ASSERT_OK_AND_ASSIGN(Tensor box, RegionView(shard, {1, 3}, {60, 37}));
  const std::string expected = RowMajor(box);
  // Chunk sizes that cut rows and elements anywhere.
  for (int64_t chunk_bytes : {int64_t{1}, int64_t{7}, int64_t{148},
                              int64_t{1000}, int64_t{8880}, int64_t{1} << 20}) {
    SCOPED_TRACE(chunk_bytes);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSource> source,
                         NewChunkSource(box, chunk_bytes));
    std::string got;
    std::set<const char*> buffers;
    while (!source->done()) {
      ASSERT_OK_AND_ASSIGN(HostChunk chunk, source->Next());
      EXPECT_EQ(chunk.offset, static_cast<int64_t>(got.size()));
      got += BytesOf(chunk);
      buffers.insert(chunk.data);
    }
    EXPECT_EQ(got, expected);
    EXPECT_LE(buffers.size(), 2u);
  }
  // A transposed view (no contiguous run longer than one element).
  ASSERT_OK_AND_ASSIGN(Tensor transposed, box.Transpose(0, 1));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSource> source,
                       NewChunkSource(transposed, 100));
  EXPECT_EQ(AllChunks(*source, nullptr), RowMajor(transposed));
}

TEST(HostChunkSourceTest, TransposedHostShard) {
  ASSERT_OK_AND_ASSIGN(Tensor shard,
                       HostPattern({9, 7}, DType::kFloat64).Transpose(0, 1));
  std::shared_ptr<ShardRegistry> registry = RegistryWith(shard);
  v1::FetchShardRequest request;
  request.set_tensor_id("t");
  request.set_shard_index(1);
  ASSERT_OK_AND_ASSIGN(PreparedFetch prepared,
                       PrepareFetch(*registry, request));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSource> source,
                       NewChunkSource(prepared.bytes, 100));
  EXPECT_EQ(AllChunks(*source, nullptr), RowMajor(shard));
}

// ---- The CUDA copier --------------------------------------------------------

class CudaChunkSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaChunkSourceTest, StagesEveryChunkByteExact) {
  const Tensor host = HostPattern({1000, 33}, DType::kFloat32);
  ASSERT_OK_AND_ASSIGN(Tensor device, host.To(Device::Cuda(0)));
  for (int depth : {1, 2, 4}) {
    for (int64_t chunk : {int64_t{4096}, int64_t{1} << 20}) {
      SCOPED_TRACE(absl::StrCat("depth ", depth, ", chunks of ", chunk));
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSource> source,
                           NewChunkSource(device, chunk, depth));
      std::vector<HostChunk> held;
      EXPECT_EQ(AllChunks(*source, &held), RowMajor(host));
      // Held chunks (pooled and transient buffers) keep their bytes.
      std::string again;
      for (const HostChunk& c : held) again += BytesOf(c);
      EXPECT_EQ(again, RowMajor(host));
    }
  }
}

TEST_F(CudaChunkSourceTest, StridedCudaRegionStaysOnTheDevice) {
  const Tensor host = HostPattern({64, 48}, DType::kInt32);
  ASSERT_OK_AND_ASSIGN(Tensor device, host.To(Device::Cuda(0)));
  std::shared_ptr<ShardRegistry> registry = RegistryWith(device);
  ASSERT_OK_AND_ASSIGN(
      PreparedFetch prepared,
      PrepareFetch(*registry, RegionRequest({5, 7}, {50, 30})));
  // Made contiguous on the device, not copied to the host whole.
  EXPECT_TRUE(prepared.bytes.device().is_cuda());
  EXPECT_TRUE(prepared.bytes.is_contiguous());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSource> source,
                       NewChunkSource(prepared.bytes, 4096));
  ASSERT_OK_AND_ASSIGN(Tensor expected, RegionView(host, {5, 7}, {50, 30}));
  EXPECT_EQ(AllChunks(*source, nullptr), RowMajor(expected));
}

TEST_F(CudaChunkSourceTest, DestroyedMidStreamAndChunksOutliveIt) {
  const Tensor host = HostPattern({1 << 20}, DType::kUInt8);
  ASSERT_OK_AND_ASSIGN(Tensor device, host.To(Device::Cuda(0)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkSource> source,
                       NewChunkSource(device, 4096, 4));
  ASSERT_OK_AND_ASSIGN(HostChunk first, source->Next());
  source.reset();  // Copies in flight are waited for.
  device = Tensor();
  EXPECT_EQ(BytesOf(first), RowMajor(host).substr(0, 4096));
}

}  // namespace
}  // namespace tessera
