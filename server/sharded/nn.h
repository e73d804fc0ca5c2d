// torch.nn.Linear and torch.nn.EmbeddingBag as Modules
// (server/sharded/module.h) whose forward calls the op through CallOp
// (server/sharded/sharded_ops.h): with a dense weight they run the dense
// kernel; once ShardParameter has replaced the weight by a ShardedTensor they
// run the sharded op (collective over its group), and ops registered for
// "linear" / "embedding_bag" take over, as in PyTorch.
//
//   ASSIGN_OR_RETURN(auto fc, MakeLinear(32, 16, &generator));
//   RETURN_IF_ERROR(ShardParameter(*fc, "weight", spec));
//   ASSIGN_OR_RETURN(Module::ForwardValue y, fc->Forward({x}));
//
// Ownership and thread-safety: as Module. Failure: negative sizes are
// INVALID_ARGUMENT; forward fails with CallOp's errors, and with
// INVALID_ARGUMENT for a number of inputs other than one.
#ifndef TESSERA_SERVER_SHARDED_NN_H_
#define TESSERA_SERVER_SHARDED_NN_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tensor/tensor.h"
#include "server/sharded/module.h"

namespace tessera {

// A "Linear": float32 attributes weight [out, in] and bias [out], drawn
// uniformly from [-1/sqrt(in), 1/sqrt(in)) as PyTorch initialises them,
// from `generator` (the default generator when null). Forward(x) is
// linear(x, weight, bias).
absl::StatusOr<std::shared_ptr<Module>> MakeLinear(
    int64_t in_features, int64_t out_features, Generator* generator = nullptr);

// An "EmbeddingBag": a float32 weight [num_embeddings, embedding_dim] drawn
// from the standard normal (PyTorch's init) and the attribute "mode".
// Forward(bags) is embedding_bag(bags, weight, mode=mode). Only "sum" is
// implemented by the ops; other modes fail at forward.
absl::StatusOr<std::shared_ptr<Module>> MakeEmbeddingBag(
    int64_t num_embeddings, int64_t embedding_dim, std::string mode = "sum",
    Generator* generator = nullptr);

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARDED_NN_H_
