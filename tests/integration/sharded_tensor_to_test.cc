// Ports of the reference's ShardedTensor conversion tests
// (test_sharded_tensor.py, TestShardedTensorEnumerable): to, cuda, cpu and
// device. Each test runs in 4 real rank processes on loopback. The "cuda"
// instantiation is the reference verbatim (with rank r on cuda:(r % device
// count), so one GPU is enough) and skips without a GPU; the
// "cpu" instantiation checks the same contract on host placements (identity,
// dtype conversion with values, process group rebinding, copies) and, on a
// machine without CUDA, that moving to CUDA fails cleanly.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sharded/sharded_tensor.h"
#include "tests/integration/device_ranks_test.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

class TestShardedTensorEnumerable : public DeviceRanksTest {
 protected:
  absl::StatusOr<std::shared_ptr<ProcessGroup>> GlooGroup() {
    NewGroupOptions options;
    options.backend = "gloo";
    return rank_runtime()->NewGroup({0, 1, 2, 3}, options);
  }
  absl::StatusOr<ShardingSpec> CpuChunk() {
    ASSIGN_OR_RETURN(
        ChunkShardingSpec spec,
        ChunkShardingSpec::Create(
            0, std::vector<std::string>{"rank:0/cpu", "rank:1/cpu",
                                        "rank:2/cpu", "rank:3/cpu"}));
    return ShardingSpec(spec);
  }
};

Device::Type LocalDeviceType(const ShardedTensor& st) {
  auto local = st.local_tensor();
  EXPECT_TRUE(local.ok()) << local.status();
  return local.ok() ? local->device().type() : Device::Type::kMeta;
}

// The spec and metadata of `after` are those of `before` with every
// shard's owner kept and its device type changed to `type`.
void ExpectMoved(const ShardedTensor& before, const ShardedTensor& after,
                 Device::Type type) {
  const auto* spec_before =
      std::get_if<ChunkShardingSpec>(&before.sharding_spec());
  const auto* spec_after =
      std::get_if<ChunkShardingSpec>(&after.sharding_spec());
  ASSERT_NE(nullptr, spec_before);
  ASSERT_NE(nullptr, spec_after);
  EXPECT_EQ(spec_before->dim(), spec_after->dim());
  ASSERT_EQ(spec_before->placements().size(), spec_after->placements().size());
  for (size_t i = 0; i < spec_after->placements().size(); ++i) {
    EXPECT_EQ(spec_before->placements()[i].rank(),
              spec_after->placements()[i].rank());
    EXPECT_EQ(type, spec_after->placements()[i].device().type());
  }
  const auto& shards_before = before.metadata().shards_metadata;
  const auto& shards_after = after.metadata().shards_metadata;
  ASSERT_EQ(shards_before.size(), shards_after.size());
  for (size_t i = 0; i < shards_after.size(); ++i) {
    EXPECT_EQ(type, shards_after[i].placement()->device().type());
    EXPECT_EQ(shards_before[i].placement()->rank(),
              shards_after[i].placement()->rank());
    EXPECT_EQ(shards_before[i].shard_offsets(),
              shards_after[i].shard_offsets());
    EXPECT_EQ(shards_before[i].shard_sizes(), shards_after[i].shard_sizes());
  }
  EXPECT_EQ(before.size(), after.size());
  EXPECT_NE(before.tensor_id(), after.tensor_id());
}

void ExpectCudaUnavailable(const ShardedTensor& st, int rank) {
  const auto no_cuda = StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("no CUDA device is visible"));
  EXPECT_THAT(st.Cuda(), no_cuda);
  EXPECT_THAT(st.To("cuda"), no_cuda);
  EXPECT_THAT(st.To(rank), no_cuda);
  EXPECT_THAT(st.To(Device::Cuda()), no_cuda);
}

TEST_P(TestShardedTensorEnumerable, ShardedTensorToCuda) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  const Sizes hw = {10, 20};
  if (cuda()) {
    ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
    ASSERT_OK_AND_ASSIGN(ShardedTensor st_cuda, ShardedTensor::Zeros(spec, hw));
    ASSERT_OK_AND_ASSIGN(ShardedTensor new_st_cuda, st_cuda.Cuda());
    EXPECT_FALSE(st_cuda.is_same(new_st_cuda));
    ASSERT_OK_AND_ASSIGN(Tensor before, st_cuda.local_tensor());
    ASSERT_OK_AND_ASSIGN(Tensor after, new_st_cuda.local_tensor());
    EXPECT_EQ(before.storage(), after.storage());
    EXPECT_EQ(before.data_ptr(), after.data_ptr());
    // Any index but the rank's own device: ranks may share one GPU, so
    // the reference's (rank + 1) % 4 could name the rank's own device.
    EXPECT_THAT(st_cuda.Cuda(*DeviceOf(rank()).index() + 1),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("Only device without device id")));
  }

  ASSERT_OK_AND_ASSIGN(auto gloo_pg, GlooGroup());
  ASSERT_OK_AND_ASSIGN(ShardingSpec cpu_spec, CpuChunk());
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor st_cpu,
      ShardedTensor::Zeros(cpu_spec, hw,
                           ShardedTensorOptions().WithProcessGroup(gloo_pg)));
  ASSERT_OK_AND_ASSIGN(ShardedTensor same, st_cpu.Cpu());
  EXPECT_TRUE(same.is_same(st_cpu));
  if (!CudaAvailable()) {
    ExpectCudaUnavailable(st_cpu, rank());
    return;
  }
  ASSERT_OK_AND_ASSIGN(ShardedTensor new_st_gpu, st_cpu.Cuda());
  ExpectMoved(st_cpu, new_st_gpu, Device::Type::kCuda);
  EXPECT_EQ(gloo_pg, new_st_gpu.process_group());
  EXPECT_EQ(Device::Type::kCuda, LocalDeviceType(new_st_gpu));
  ASSERT_OK_AND_ASSIGN(Tensor full, new_st_gpu.GatherAll());
  ASSERT_OK_AND_ASSIGN(Tensor zeros, Tensor::Zeros(hw));
  EXPECT_TRUE(Equal(zeros, full));
  // And back: placements return to the CPU.
  ASSERT_OK_AND_ASSIGN(ShardedTensor back, new_st_gpu.Cpu());
  ExpectMoved(new_st_gpu, back, Device::Type::kCpu);
}

// The device-independent half of test_sharded_tensor_to_test, on `st`
// whose shards live on devices of type `home`.
void CheckToKeepsOrConverts(const ShardedTensor& st, const std::string& home,
                            const std::shared_ptr<ProcessGroup>& gloo_pg) {
  ShardedTensor::ToOptions keep;
  keep.dtype = st.dtype();
  keep.device = home;
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_self, st.To(keep));
  EXPECT_TRUE(st_self.is_same(st));
  ASSERT_OK_AND_ASSIGN(st_self, st.To(ShardedTensor::ToOptions()));
  EXPECT_TRUE(st_self.is_same(st));
  const Device::Type home_type = LocalDeviceType(st);

  ASSERT_OK_AND_ASSIGN(ShardedTensor st_16, st.To(DType::kFloat16));
  EXPECT_FALSE(st_16.is_same(st));
  EXPECT_EQ(DType::kFloat16, st_16.dtype());
  EXPECT_EQ(DType::kFloat16, st_16.local_shards()[0].tensor.dtype());
  EXPECT_EQ(home_type, LocalDeviceType(st_16));
  EXPECT_EQ(DType::kFloat16, st_16.metadata().tensor_properties.dtype);

  ASSERT_OK_AND_ASSIGN(
      Tensor like,
      Tensor::Randn(
          {3, 4},
          TensorOptions().WithDType(DType::kFloat64).WithDevice(st.device())));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_like, st.To(like));
  EXPECT_FALSE(st_like.is_same(st));
  EXPECT_EQ(DType::kFloat64, st_like.dtype());

  ASSERT_OK_AND_ASSIGN(ShardedTensor st_home_16, st.To(home, DType::kFloat16));
  EXPECT_EQ(DType::kFloat16, st_home_16.dtype());
  EXPECT_EQ(home_type, LocalDeviceType(st_home_16));

  // copy=True copies even when nothing changes.
  ShardedTensor::ToOptions copy;
  copy.copy = true;
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_copy, st.To(copy));
  EXPECT_FALSE(st_copy.is_same(st));
  EXPECT_NE(st.local_shards()[0].tensor.storage(),
            st_copy.local_shards()[0].tensor.storage());
  EXPECT_TRUE(
      Equal(st.local_shards()[0].tensor, st_copy.local_shards()[0].tensor));

  ShardedTensor::ToOptions to_gloo;
  to_gloo.device = "cpu";
  to_gloo.process_group = gloo_pg;
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_gloo, st.To(to_gloo));
  EXPECT_FALSE(st_gloo.is_same(st));
  EXPECT_EQ(Device::Type::kCpu, LocalDeviceType(st_gloo));
  EXPECT_EQ(gloo_pg, st_gloo.process_group());

  EXPECT_THAT(st.To("gpu"), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("Invalid device string")));
}

TEST_P(TestShardedTensorEnumerable, ShardedTensorToTest) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  const Sizes hw = {10, 20};
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Zeros(spec, hw));
  ASSERT_OK_AND_ASSIGN(auto gloo_pg, GlooGroup());
  CheckToKeepsOrConverts(st, cuda() ? "cuda" : "cpu", gloo_pg);
  if (!cuda()) {
    if (!CudaAvailable()) ExpectCudaUnavailable(st, rank());
    return;
  }

  ASSERT_OK_AND_ASSIGN(ShardedTensor st_cpu, st.To(Device::Cpu()));
  EXPECT_FALSE(st_cpu.is_same(st));
  EXPECT_EQ(Device::Type::kCpu, LocalDeviceType(st_cpu));
  ShardedTensor::ToOptions to_cuda;
  to_cuda.device = Device::Cuda();
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_cuda, st_cpu.To(to_cuda));
  EXPECT_EQ(Device::Type::kCuda, LocalDeviceType(st_cuda));
  ASSERT_OK_AND_ASSIGN(st_cuda, st_cpu.To(Device::Cuda()));
  EXPECT_EQ(Device::Type::kCuda, LocalDeviceType(st_cuda));
  ASSERT_OK_AND_ASSIGN(st_cpu, st_cuda.To(Device::Cpu()));
  EXPECT_EQ(Device::Type::kCpu, LocalDeviceType(st_cpu));
  ASSERT_OK_AND_ASSIGN(st_cpu, st_cuda.To("cpu"));
  EXPECT_EQ(Device::Type::kCpu, LocalDeviceType(st_cpu));
  ASSERT_OK_AND_ASSIGN(st_cuda, st_cpu.To("cuda"));
  EXPECT_EQ(Device::Type::kCuda, LocalDeviceType(st_cuda));
  ASSERT_OK_AND_ASSIGN(st_cpu, st_cuda.To("cpu"));
  EXPECT_EQ(Device::Type::kCpu, LocalDeviceType(st_cpu));
  ASSERT_OK_AND_ASSIGN(st_cuda, st_cpu.To(rank()));
  EXPECT_EQ(Device::Type::kCuda, LocalDeviceType(st_cuda));

  // Like PyTorch, a CUDA index is the rank's own device whatever it says
  // (here rank 2's device, another rank's when each rank has a GPU).
  ASSERT_OK_AND_ASSIGN(
      Tensor cuda_tensor,
      Tensor::Randn(
          {3, 4},
          TensorOptions().WithDType(DType::kFloat16).WithDevice(DeviceOf(2))));
  ASSERT_OK_AND_ASSIGN(st_cuda, st.To(cuda_tensor));
  EXPECT_FALSE(st_cuda.is_same(st));
  EXPECT_EQ(DType::kFloat16, st_cuda.dtype());
  EXPECT_EQ(DeviceOf(rank()), st_cuda.device());

  ASSERT_OK_AND_ASSIGN(ShardedTensor st_cpu_16, st.To("cpu", DType::kFloat16));
  EXPECT_EQ(DType::kFloat16, st_cpu_16.dtype());
  EXPECT_EQ(Device::Type::kCpu, LocalDeviceType(st_cpu_16));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_cuda_32,
                       st_cpu_16.To("cuda", DType::kFloat32));
  EXPECT_EQ(DType::kFloat32, st_cuda_32.dtype());
  EXPECT_EQ(Device::Type::kCuda, LocalDeviceType(st_cuda_32));
}

TEST_P(TestShardedTensorEnumerable, ShardedTensorDevice) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Zeros(spec, {10, 20}));
  EXPECT_EQ(DeviceOf(rank()), st.device());
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_cpu, st.To(Device::Cpu()));
  EXPECT_EQ(Device::Cpu(), st_cpu.device());
  EXPECT_EQ(!cuda(), st_cpu.is_same(st));
}

// Global element (i, j) of the value tests, exact in float16.
double HalfExact(int64_t i, int64_t j) { return (i * 20 + j) * 0.25 - 50; }
// And one that needs all of float64's 53 bits but no more.
int64_t Wide(int64_t i, int64_t j) {
  return (int64_t{1} << 52) + (i * 20 + j) * 1000003;
}

// Rank r's rows of a 10x20 tensor chunked by rows over 4 ranks, holding
// value(i, j) as T, on `device`.
template <typename T, typename Value>
absl::StatusOr<Tensor> LocalRows(int rank, const Device& device, Value value) {
  const int64_t begin = rank * 3;
  const int64_t rows = rank == 3 ? 1 : 3;
  std::vector<T> values;
  for (int64_t i = begin; i < begin + rows; ++i) {
    for (int64_t j = 0; j < 20; ++j) {
      values.push_back(static_cast<T>(value(i, j)));
    }
  }
  ASSIGN_OR_RETURN(Tensor host, Tensor::FromVector<T>(values, Sizes{rows, 20}));
  return device.is_cpu() ? host : host.To(device);
}

// Every element of `full` (10x20, dtype T) equals value(i, j).
template <typename T, typename Value>
void ExpectValues(const Tensor& full, Value value) {
  ASSERT_EQ(DTypeOf<T>::value, full.dtype());
  ASSERT_EQ(Sizes({10, 20}), full.sizes());
  const T* data = full.data<T>();
  for (int64_t i = 0; i < 10; ++i) {
    for (int64_t j = 0; j < 20; ++j) {
      ASSERT_EQ(static_cast<double>(value(i, j)), ToDouble(data[i * 20 + j]))
          << "at (" << i << ", " << j << ")";
    }
  }
}

TEST_P(TestShardedTensorEnumerable, ShardedTensorToDTypeKeepsValues) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(Tensor local,
                       LocalRows<float>(rank(), DeviceOf(rank()), HalfExact));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::InitFromLocalTensor(
                                             local, spec, {10, 20}, Rrefs()));

  ASSERT_OK_AND_ASSIGN(ShardedTensor st_16, st.To(DType::kFloat16));
  ASSERT_OK_AND_ASSIGN(Tensor full_16, st_16.GatherAll());
  ExpectValues<Half>(full_16, HalfExact);
  // The converted shards are what the shard servers now serve.
  ASSERT_OK_AND_ASSIGN(RemoteShardMap remote, st_16.remote_shards());
  EXPECT_EQ(3u, remote.size());
  ForEachFetched(remote, [&](int owner, const Shard& shard) {
    EXPECT_EQ(DType::kFloat16, shard.tensor.dtype());
    auto expected = LocalRows<Half>(
        owner, Device::Cpu(),
        [](int64_t i, int64_t j) { return FromDouble<Half>(HalfExact(i, j)); });
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_OK_AND_ASSIGN(Tensor fetched, shard.tensor.To(Device::Cpu()));
    EXPECT_TRUE(Equal(*expected, fetched)) << "shard of rank " << owner;
  });

  ASSERT_OK_AND_ASSIGN(ShardedTensor st_32, st_16.To(DType::kFloat32));
  ASSERT_OK_AND_ASSIGN(Tensor full_32, st_32.GatherAll());
  ExpectValues<float>(full_32, HalfExact);
  ASSERT_OK_AND_ASSIGN(Tensor original, st.GatherAll());
  EXPECT_TRUE(Equal(original, full_32));

  ASSERT_OK_AND_ASSIGN(Tensor wide,
                       LocalRows<int64_t>(rank(), DeviceOf(rank()), Wide));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_64, ShardedTensor::InitFromLocalTensor(
                                                wide, spec, {10, 20}, Rrefs()));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_f64, st_64.To(DType::kFloat64));
  EXPECT_EQ(DType::kFloat64, st_f64.dtype());
  ASSERT_OK_AND_ASSIGN(Tensor full_f64, st_f64.GatherAll());
  ExpectValues<double>(full_f64, Wide);
}

TESSERA_INSTANTIATE_FOR_DEVICES(TestShardedTensorEnumerable);

}  // namespace
}  // namespace tessera
