// StateDict: a module's tensors by dotted name ("fc1.weight"), in
// registration order — PyTorch's OrderedDict returned by state_dict().
// Values are handles: a dense Tensor is a view (it shares its storage) and a
// ShardedTensor shares its shards, so a StateDict never copies bytes.
//
// Plain value types; thread-compatible.
#ifndef TESSERA_SERVER_SHARDED_STATE_DICT_H_
#define TESSERA_SERVER_SHARDED_STATE_DICT_H_

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/tensor/tensor.h"
#include "server/sharded/sharded_tensor.h"

namespace tessera {

using StateValue = std::variant<Tensor, ShardedTensor>;
using StateDict = std::vector<std::pair<std::string, StateValue>>;

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARDED_STATE_DICT_H_
