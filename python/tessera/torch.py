"""torch interop: CPU torch tensors in and out without a copy, sharding
specs to and from torch.distributed._shard's, and state dicts (the weight
sync pattern: a trainer puts, each inference rank gets only its slice).

Imported on demand (``import tessera.torch``); needs torch.
"""

import json

import torch

from . import _tessera, errors
from ._tensor import _source

__all__ = ["spec_from_torch", "spec_to_torch", "read", "put_state_dict",
           "get_state_dict"]


def _invalid(message):
    return errors.InvalidArgumentError(3, message)


def _placement_text(placement):
    # torch's _remote_device prints "rank:0/cpu" or "worker0/cuda:0".
    return str(placement)


def spec_from_torch(spec):
    """The tessera spec of a torch ChunkShardingSpec or
    EnumerableShardingSpec (``st.sharding_spec()``)."""
    # By their names: torch.distributed._shard does not import everywhere
    # (torch 1.13 under Python 3.11, as Debian bookworm ships it).
    kind = type(spec).__name__
    if kind == "ChunkShardingSpec":
        if not isinstance(spec.dim, int):
            raise errors.Error(12, "ChunkShardingSpec does not support named "
                               "dimension yet!")
        return _tessera.chunk(spec.dim,
                              [_placement_text(p) for p in spec.placements])
    if kind == "EnumerableShardingSpec":
        shards = []
        for shard in spec.shards:
            entry = {"offsets": list(shard.shard_offsets),
                     "sizes": list(shard.shard_sizes)}
            if shard.placement is not None:
                entry["placement"] = _placement_text(shard.placement)
            shards.append(entry)
        return _tessera.spec_from_json(
            json.dumps({"type": "enumerable", "shards": shards}))
    raise _invalid(f"no tessera spec for {type(spec).__name__}: only "
                   f"ChunkShardingSpec and EnumerableShardingSpec")


def spec_to_torch(spec):
    """The torch ChunkShardingSpec or EnumerableShardingSpec of a tessera
    spec."""
    try:
        from torch.distributed._shard.metadata import ShardMetadata
        from torch.distributed._shard.sharding_spec import (
            ChunkShardingSpec, EnumerableShardingSpec)
    except Exception as e:  # torch 1.13 under Python 3.11: ValueError
        raise errors.FailedPreconditionError(
            9, f"torch.distributed._shard cannot be imported with this "
            f"torch ({torch.__version__}): {e}") from e

    form = json.loads(spec.to_json())
    if form["type"] == "chunk":
        return ChunkShardingSpec(dim=form["dim"],
                                 placements=list(form["placements"]))
    return EnumerableShardingSpec([
        ShardMetadata(shard_offsets=list(s["offsets"]),
                      shard_sizes=list(s["sizes"]),
                      placement=s.get("placement"))
        for s in form["shards"]])


def read(tensor, out=None, offsets=None, timeout=None):
    """Reads a tessera tensor (or, with ``offsets``, the box of ``out``'s
    shape there) into the CPU torch tensor ``out`` in place, or a new
    one; bfloat16 as torch.bfloat16."""
    if out is None:
        if offsets is not None:
            raise _invalid("a box read needs out= (its shape is the box's)")
        if tensor.dtype_name != "bfloat16":
            return torch.from_numpy(tensor.read(timeout=timeout))
        out = torch.empty(tensor.shape, dtype=torch.bfloat16)
    target, _ = _source(out)  # shares the memory (bfloat16: its bits)
    origin = (0,) * tensor.ndim if offsets is None else tuple(offsets)
    tensor.read_region(origin, target.shape, out=target, timeout=timeout)
    return out


def put_state_dict(client, prefix, state_dict, spec_fn, replace=True,
                   replicas=1, timeout=None):
    """Creates (or, with ``replace``, re-creates) ``prefix + name`` for
    every tensor of ``state_dict``, laid out by ``spec_fn(name, tensor)``,
    and writes it. Returns the tessera tensors by name."""
    put = {}
    for name, value in state_dict.items():
        full = prefix + name
        if replace:
            try:
                client.delete(full)
            except errors.NotFoundError:
                pass
        put[name] = client.put(full, value, spec_fn(name, value),
                               replicas=replicas, timeout=timeout)
    return put


def get_state_dict(client, prefix, like, timeout=None):
    """Fills the tensors of ``like`` in place from ``prefix + name``. A
    value may be a tensor (the whole tensor is read into it) or a pair
    (tensor, offsets): only the box of the tensor's shape at ``offsets``
    moves, which is how an inference rank gets its slice. Returns
    ``like``."""
    for name, value in like.items():
        tensor, offsets = (value if isinstance(value, tuple) else
                           (value, None))
        read(client.open(prefix + name), out=tensor, offsets=offsets,
             timeout=timeout)
    return like
