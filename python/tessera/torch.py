"""torch interop: CPU torch tensors in and out without a copy, sharding
specs to and from torch.distributed._shard's, and state dicts (the weight
sync pattern: a trainer puts, each inference rank gets only its slice).

Imported on demand (``import tessera.torch``); needs torch.
"""

from __future__ import annotations

import collections.abc
import itertools
import json
from typing import (TYPE_CHECKING, Any, Callable, Mapping, Optional,
                    Sequence, Tuple, Union)

import torch

from . import _tessera, errors
from ._tensor import _integer, _integers, _source, _write_many

if TYPE_CHECKING:
    from . import Client, ShardingSpec, Tensor

__all__ = ["spec_from_torch", "spec_to_torch", "read", "put_state_dict",
           "get_state_dict", "publish_state_dict", "plan_state_dict",
           "default_layout", "CHUNK_BYTES"]

# A layout for put_state_dict: (name, tensor) -> the spec to create it with.
Layout = Callable[[str, Any], "ShardingSpec"]

#: The default layout cuts tensors of at least this many bytes along dim 0
#: over every daemon; smaller ones stay whole on one daemon.
CHUNK_BYTES = 1 << 20

#: publish_state_dict creates missing tensors this many per call (the
#: daemons' limit of one CreateTensors call).
CREATE_BATCH = 4096


def _invalid(message: str) -> errors.InvalidArgumentError:
    return errors.InvalidArgumentError(3, message)


def _keys(prefix: Any, state_dict: Any, what: str) -> None:
    """TypeError unless ``prefix`` is a str and ``state_dict`` a mapping of
    str keys (a key 3 made "can only concatenate str (not "int") to str")."""
    if not isinstance(prefix, str):
        raise TypeError(f"{what}: prefix must be a str, not "
                        f"{type(prefix).__name__} {prefix!r:.40}")
    if not isinstance(state_dict, collections.abc.Mapping):
        raise TypeError(f"{what}: the state dict must be a mapping of names "
                        f"to tensors, not {type(state_dict).__name__}")
    for key in state_dict:
        if not isinstance(key, str):
            raise TypeError(f"{what}: state dict keys must be str, not "
                            f"{type(key).__name__} {key!r:.40}")


def _placement_text(placement: Any) -> str:
    # torch's _remote_device prints "rank:0/cpu" or "worker0/cuda:0".
    return str(placement)


def spec_from_torch(spec: Any) -> ShardingSpec:
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
            entry: dict[str, Any] = {"offsets": list(shard.shard_offsets),
                                     "sizes": list(shard.shard_sizes)}
            if shard.placement is not None:
                entry["placement"] = _placement_text(shard.placement)
            shards.append(entry)
        return _tessera.spec_from_json(
            json.dumps({"type": "enumerable", "shards": shards}))
    raise _invalid(f"no tessera spec for {type(spec).__name__}: only "
                   f"ChunkShardingSpec and EnumerableShardingSpec")


def spec_to_torch(spec: ShardingSpec) -> Any:
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


def read(tensor: Tensor, out: Optional[torch.Tensor] = None,
         offsets: Optional[Sequence[int]] = None,
         timeout: Optional[float] = None) -> torch.Tensor:
    """Reads a tessera tensor (or, with ``offsets``, the box of ``out``'s
    shape there) into the CPU torch tensor ``out`` in place, or a new
    one; bfloat16 as torch.bfloat16. (``tensor.read(out=t)`` and
    ``tensor.read_region(offsets, sizes, out=t)`` take a torch tensor the
    same way.)"""
    if out is None:
        if offsets is not None:
            raise _invalid("a box read needs out= (its shape is the box's)")
        if tensor.dtype_name != "bfloat16":
            return torch.from_numpy(tensor.read(timeout=timeout))
        out = torch.empty(tensor.shape, dtype=torch.bfloat16)
    elif offsets is None and tuple(out.shape) != tuple(tensor.shape):
        # Without offsets, out is the whole tensor: not a corner of it.
        raise _invalid(f"out has shape {tuple(out.shape)} but tensor "
                       f"{tensor.name} is {tuple(tensor.shape)}; give "
                       f"offsets= to read the box of out's shape there")
    return _read_box(tensor, out, offsets, timeout)


def _read_box(tensor: Tensor, out: torch.Tensor,
              offsets: Optional[Sequence[int]],
              timeout: Optional[float]) -> torch.Tensor:
    """Reads the box of ``out``'s shape at ``offsets`` (the origin when
    None) into ``out``."""
    origin = (0,) * tensor.ndim if offsets is None else tuple(offsets)
    tensor.read_region(origin, tuple(out.shape), out=out, timeout=timeout)
    return out


def default_layout(client: Client, chunk_bytes: int = CHUNK_BYTES) -> Layout:
    """The layout put_state_dict uses when given none, as a
    ``spec_fn(name, tensor)``: a tensor of at least ``chunk_bytes`` bytes
    whose dim 0 has a row for every daemon is cut along dim 0 into one chunk
    per daemon, in rank order (an inference rank then reads its rows from
    one or two owners); any other tensor (a bias, a norm's weight, a
    scalar) lives whole on one daemon, the next in turn for each such
    tensor (round-robin from rank 0, in the order the layout is asked), so
    that small tensors spread over the cluster instead of piling up on rank
    0. Every placement names its daemon's own device ("rank:1/cpu",
    "rank:1/cuda:1"). A fresh layout starts again at rank 0.
    ``chunk_bytes`` is a byte count (0: chunk every tensor that has the
    rows); anything else is refused here."""
    chunk_bytes = _integer(chunk_bytes, "chunk_bytes", 0, None)
    placements = [f"rank:{rank}/{device or 'cpu'}"
                  for rank, device in enumerate(client.devices)]
    turn = itertools.count()

    def layout(name: str, tensor: Any) -> ShardingSpec:
        array, _ = _source(tensor)
        if (array.ndim > 0 and array.shape[0] >= len(placements) and
                array.nbytes >= chunk_bytes):
            return _tessera.chunk(0, placements)
        placement = placements[next(turn) % len(placements)]
        if array.ndim > 0:
            return _tessera.chunk(0, [placement])
        # A 0-d tensor has no dim to chunk: one shard of no dims.
        return _tessera.parse_spec(f"enum::@{placement}")

    return layout


def put_state_dict(client: Client, prefix: str,
                   state_dict: Mapping[str, Any],
                   spec_fn: Optional[Layout] = None, replace: bool = True,
                   copies: int = 1,
                   timeout: Optional[float] = None) -> dict[str, Tensor]:
    """Creates (or, with ``replace``, re-creates) ``prefix + name`` for
    every tensor of ``state_dict`` (CPU torch tensors or numpy arrays),
    laid out by ``spec_fn(name, tensor)``, and writes it. Returns the
    tessera tensors by name.

    Without ``spec_fn``, the obvious layout (:func:`default_layout`): each
    tensor of at least 1 MiB (CHUNK_BYTES) with at least one row per daemon
    cut along dim 0 into one chunk per daemon, every smaller one whole on
    one daemon, round-robin over the ranks.

    The tensors are created together, CREATE_BATCH per call
    (``Client.create_many``: all of a batch or none), after those being
    replaced were deleted together (``Client.delete_many``); without ``replace``,
    a name already taken is AlreadyExistsError before anything is made. A
    failed write deletes the tensors this call created."""
    _keys(prefix, state_dict, "put_state_dict")
    if spec_fn is None:
        spec_fn = default_layout(client)
    if replace:
        # One logged call for all of them (all or none): one that someone
        # else deleted meanwhile refuses the call, which is then asked
        # again of those still there.
        for attempt in range(3):
            existing = {t.name for t in client.list()}
            old = [prefix + n for n in state_dict if prefix + n in existing]
            try:
                client.delete_many(old)
                break
            except errors.NotFoundError:
                if attempt == 2:
                    raise
    wanted = []
    for name, value in state_dict.items():
        full = prefix + name
        data, bits = _source(value)
        wanted.append({"name": full, "shape": data.shape,
                       "spec": spec_fn(name, value),
                       "dtype": "bfloat16" if bits else data.dtype.name,
                       "copies": copies})
    made: list = []
    try:
        for first in range(0, len(wanted), CREATE_BATCH):
            made += client.create_many(wanted[first:first + CREATE_BATCH])
        put = dict(zip(state_dict, made))
        _write_many([(tensor, (0,) * _source(value)[0].ndim, value)
                     for value, tensor in zip(state_dict.values(), made)],
                    timeout)
    except BaseException:
        for tensor in made:
            try:
                client.delete(tensor.name)
            except errors.Error:
                pass
        raise
    return put


def get_state_dict(
        client: Client, prefix: str,
        like: Mapping[str, Union[torch.Tensor,
                                 Tuple[torch.Tensor, Sequence[int]]]],
        timeout: Optional[float] = None) -> Mapping[str, Any]:
    """Fills the tensors of ``like`` in place from ``prefix + name``. A
    value may be a tensor (the whole tensor is read into it) or a pair
    (tensor, offsets): only the box of the tensor's shape at ``offsets``
    moves, which is how an inference rank gets its slice. A tensor of
    another floating dtype takes the values converted (as a read plan
    converts them: float32 into bfloat16, rounded as torch rounds).
    Versioned tensors (publish_state_dict's) are read at one point, as
    a read plan reads them: a publish that lands meanwhile is seen whole
    or not at all. A tensor given alone must have the stored tensor's
    shape (InvalidArgumentError "size mismatch for NAME", as torch's
    load_state_dict says). Returns ``like``."""
    _keys(prefix, like, "get_state_dict")
    if not like:
        return like
    dense, staged = {}, []
    for name, value in like.items():
        out, at = value if isinstance(value, tuple) else (value, None)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"get_state_dict: like[{name!r}] must be a "
                            f"torch tensor, not {type(out).__name__}")
        if not out.is_contiguous():  # Filled through a dense copy.
            target = torch.empty(out.shape, dtype=out.dtype,
                                 device=out.device)
            staged.append((out, target))
            out = target
        dense[name] = out if at is None else (out, at)
    # One plan: one metadata call, every piece checked to be of one
    # version (tensor by tensor, a publish between two reads mixed them).
    plan_state_dict(client, prefix, dense).run(timeout=timeout)
    for out, target in staged:
        out.copy_(target)
    return like


def _full_like(value: Any, shape: Optional[Sequence[int]]) -> Any:
    """A tensor of ``value``'s dtype and the full ``shape`` that holds no
    memory (for a layout function to look at), or ``value`` itself."""
    if shape is None or tuple(shape) == tuple(value.shape):
        return value
    if isinstance(value, torch.Tensor):
        return torch.empty((), dtype=value.dtype).expand(*shape)
    import numpy
    return numpy.broadcast_to(numpy.empty((), dtype=value.dtype), shape)


def _check_part(name: str, part: Sequence[int],
                shape: Optional[Sequence[int]],
                at: Optional[Sequence[int]]) -> None:
    """InvalidArgumentError unless the entry ``name`` (of sizes ``part``),
    placed at ``at`` (zeros by default), lies inside its full ``shape``
    (its own sizes by default): checked before anything is created or
    begun."""
    full = tuple(part) if shape is None else tuple(_integers(shape, "shape"))
    where = (0,) * len(part) if at is None else tuple(_integers(at, "at"))
    if (len(full) != len(part) or len(where) != len(part) or
            any(i < 0 for i in where) or
            any(i + p > f for i, p, f in zip(where, part, full))):
        raise _invalid(
            f"publishing {name}: its part of sizes {list(part)} at offsets "
            f"{list(where)} does not lie inside the full shape {list(full)}; "
            f"nothing was created or written")


def _check_existing(tensor: Any, name: str, shape: Sequence[int],
                    dtype: str) -> None:
    """InvalidArgumentError unless the tensor already there holds the
    state dict entry ``name``'s full shape and dtype."""
    if tuple(tensor.shape) == tuple(shape) and tensor.dtype_name == dtype:
        return
    raise _invalid(
        f"publishing {name}: tensor {tensor.name} holds "
        f"{tensor.dtype_name} {list(tensor.shape)}, the state dict's entry "
        f"is {dtype} {list(shape)}; nothing was written (publish under "
        f"another prefix, or delete the tensor first)")


def publish_state_dict(client: Client, prefix: str,
                       state_dict: Mapping[str, Any],
                       spec_fn: Optional[Layout] = None, *,
                       shapes: Optional[Mapping[str, Sequence[int]]] = None,
                       offsets: Optional[Mapping[str, Sequence[int]]] = None,
                       join: Optional[str] = None, publish: bool = True,
                       empty: Optional[bool] = None,
                       skip_zeroing: Optional[bool] = None,
                       versions: int = 2, copies: int = 1,
                       timeout: Optional[float] = None) -> Any:
    """Publishes ``state_dict`` as one version of the versioned tensors
    ``prefix + name`` (docs/weight_sync.md): readers (a read plan, or
    ``get_state_dict``) see all of it or none of it.

    The tensors are created on first use, keeping ``versions`` published
    versions (``copies`` of each shard), laid out by ``spec_fn(name,
    tensor)`` or :func:`default_layout`. A rank that holds only its part of
    each parameter (row chunks, as FSDP keeps them) gives the full
    ``shapes`` and its part's ``offsets`` by name; it writes only its part.

    One process: ``publish_state_dict(c, "model/", sd)`` begins a version of
    every tensor, writes, publishes and returns the version number. Several
    ranks: rank 0 calls it with ``publish=False`` and gets the open
    tessera.VersionGroup; the others call it with ``join=group.id`` (sent
    them as the caller likes, e.g. torch.distributed.broadcast_object_list)
    and ``publish=False``; once every rank has written (a barrier), rank 0
    calls ``group.publish()``. The new version starts as a copy of the
    latest unless ``empty`` (by default: when the call writes whole
    tensors; ranks that together write every row pass ``empty=True``).
    An empty version reads as zeros where nobody writes, unless
    ``skip_zeroing`` (by default: when the call writes whole tensors,
    every element; ranks that together write every element pass it with
    ``empty=True``): then the daemons do not zero memory they reuse (a
    freed version's, docs/versions.md), and an element nobody writes holds
    an older version's value. A write that fails aborts the version this
    call began.
    The tensors of one call are begun and
    published together, so their version numbers stay alike and a read
    plan reads them with no metadata call."""
    _keys(prefix, state_dict, "publish_state_dict")
    if not state_dict:
        raise _invalid("publish_state_dict: the state dict is empty: there "
                       "is nothing to publish")
    names = [prefix + name for name in state_dict]
    for name, value in state_dict.items():
        shape = None if shapes is None else shapes.get(name)
        # A joining rank that names no full shape writes into tensors it
        # has not listed: the daemons check its boxes.
        if join is None or shape is not None:
            _check_part(name, _source(value)[0].shape, shape,
                        None if offsets is None else offsets.get(name))
    if join is None:
        layout = spec_fn if spec_fn is not None else default_layout(client)
        # One control call for the names already there (every call after
        # the first): only missing tensors are created.
        existing = {t.name: t for t in client.list()}
        missing = []
        for name, value in state_dict.items():
            shape = None if shapes is None else shapes.get(name)
            data, bits = _source(value)
            if prefix + name in existing:
                # Checked before a version begins: a model whose parameter
                # changed shape or dtype is refused whole, not half written.
                _check_existing(existing[prefix + name], name, data.shape
                                if shape is None else tuple(shape),
                                "bfloat16" if bits else data.dtype.name)
                continue
            full = _full_like(value, shape)
            missing.append({
                "name": prefix + name,
                "shape": tuple(shape) if shape is not None else data.shape,
                "spec": layout(name, full),
                "dtype": "bfloat16" if bits else data.dtype.name,
                "copies": copies, "versions": versions})
        # One logged call per CREATE_BATCH of them. Another process may
        # have made some meanwhile: those are left out and the rest made.
        for first in range(0, len(missing), CREATE_BATCH):
            batch = missing[first:first + CREATE_BATCH]
            try:
                client.create_many(batch)
            except errors.AlreadyExistsError:
                there = {t.name for t in client.list()}
                rest = [t for t in batch if t["name"] not in there]
                if rest:
                    client.create_many(rest)
        whole = offsets is None and shapes is None
        if empty is None:
            empty = whole
        if skip_zeroing is None:
            skip_zeroing = whole and bool(empty)
        group = client.begin(names, empty=empty, skip_zeroing=skip_zeroing)
    else:
        group = client.join(join)
    try:
        writes = []
        for name, value in state_dict.items():
            data, _ = _source(value)
            at = ((0,) * data.ndim if offsets is None or name not in offsets
                  else tuple(offsets[name]))
            writes.append((prefix + name, at, value))
        group.write_many(writes, timeout=timeout)
    except BaseException:
        if join is None:
            group.abort()
        raise
    if not publish:
        return group
    numbers = group.publish()
    return max(numbers.values()) if numbers else 0


def plan_state_dict(client: Client, prefix: str,
                    like: Mapping[str, Union[torch.Tensor,
                                             Tuple[torch.Tensor,
                                                   Sequence[int]]]]) -> Any:
    """A read plan (tessera.ReadPlan) that fills the tensors of ``like`` in
    place from ``prefix + name`` on every ``run()``: a value is a tensor
    (the whole tensor is read into it) or a pair (tensor, offsets): only
    the box of its shape at ``offsets``. Its dtype may be another floating
    one (converted as torch rounds). A tensor given alone of another shape
    than the stored one is refused ("size mismatch for NAME")."""
    _keys(prefix, like, "plan_state_dict")
    items = []
    for name, value in like.items():
        tensor, at = value if isinstance(value, tuple) else (value, None)
        if not isinstance(tensor, torch.Tensor) or not tensor.is_contiguous():
            raise _invalid(f"plan_state_dict: like[{name!r}] must be a "
                           f"contiguous torch tensor: a plan fills it in "
                           f"place on every run (get_state_dict takes any "
                           f"strides)")
        origin = (0,) * tensor.dim() if at is None else tuple(at)
        items.append((prefix + name, origin, tuple(tensor.shape), tensor))
    plan = client.plan_reads(items)
    # A tensor given alone means the whole tensor: one of another shape is
    # a mistake (a model of another size), refused as torch's
    # load_state_dict refuses it, not filled from a corner of the tensor.
    shapes = dict(zip(plan.names, plan.shapes))
    for name, value in like.items():
        if isinstance(value, tuple):
            continue
        stored = shapes[prefix + name]
        if tuple(value.shape) != stored:
            raise _invalid(
                f"size mismatch for {name}: {prefix + name} has shape "
                f"{list(stored)}, like[{name!r}] has {list(value.shape)} "
                f"(give (tensor, offsets) to read a box of it)")
    return plan
