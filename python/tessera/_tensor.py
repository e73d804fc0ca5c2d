"""A named tensor of the cluster, as numpy sees it: slicing reads and
writes only the bytes of the box."""

import dataclasses
import math
import operator

import numpy

from . import errors

__all__ = ["Tensor", "Shard", "RemoteShard"]


@dataclasses.dataclass(frozen=True)
class Shard:
    """Where one shard lives: its box in the tensor, its placement
    ("rank:1/cpu") and its owner's rank."""

    index: int
    offsets: tuple
    sizes: tuple
    placement: str
    rank: int


class RemoteShard:
    """One shard, fetched whole from its owner by :meth:`to_here`."""

    def __init__(self, tensor, shard):
        self._tensor = tensor
        self.shard = shard

    @property
    def rank(self):
        return self.shard.rank

    def to_here(self, timeout=None):
        """(offsets, sizes, array): the shard's bytes, fetched now."""
        offsets, sizes, array = self._tensor._native.to_here(
            self.shard.index, _seconds(timeout))
        return tuple(offsets), tuple(sizes), array

    def __repr__(self):
        return (f"tessera.RemoteShard({self._tensor.name!r}, shard "
                f"{self.shard.index} on rank {self.shard.rank})")


def _seconds(timeout):
    return 0.0 if timeout is None else float(timeout)


def _as_numpy(data):
    """A numpy array of ``data`` (numpy, anything array-like, or a CPU torch
    tensor, whose memory it shares)."""
    if hasattr(data, "detach") and hasattr(data, "numpy"):  # torch
        if data.device.type != "cpu":
            raise _invalid("only CPU torch tensors: call .cpu()")
        data = data.detach().numpy()
    return numpy.asarray(data)


class _Progress:
    """progress=True: a tqdm bar of the bytes moved (when python3-tqdm is
    installed; nothing otherwise), updated while the transfer runs."""

    def __init__(self, wanted, total, description):
        self.bar = None
        if not wanted:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, unit="B", unit_scale=True,
                        unit_divisor=1024, desc=description, leave=False)

    @property
    def callback(self):
        if self.bar is None:
            return None
        return lambda done, total: self.bar.update(done - self.bar.n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def _invalid(message):
    return errors.InvalidArgumentError(3, message)


class Tensor:
    """A view of a named sharded tensor: its metadata as the daemon
    described it. After a reshard or a delete its reads and writes fail
    instead of touching the new layout; ``Client.open`` gets a fresh one."""

    def __init__(self, client, native):
        self._client = client
        self._native = native
        self._shape = tuple(native.shape)

    # ---- Metadata.
    @property
    def name(self):
        return self._native.name

    @property
    def tensor_id(self):
        return self._native.tensor_id

    @property
    def shape(self):
        return self._shape

    @property
    def ndim(self):
        return len(self._shape)

    @property
    def size(self):
        n = 1
        for s in self._shape:
            n *= s
        return n

    @property
    def dtype_name(self):
        """The tessera dtype name ("float32", "bfloat16", ...)."""
        return self._native.dtype

    @property
    def dtype(self):
        """The numpy dtype (InvalidArgumentError for bfloat16, which numpy
        lacks: use dtype_name, or tessera.torch)."""
        if self.dtype_name == "bfloat16":
            raise _invalid("bfloat16 has no numpy dtype (see dtype_name; "
                           "tessera.torch reads it as torch.bfloat16)")
        return numpy.dtype(self.dtype_name)

    @property
    def degraded(self):
        """Whether shards were lost (their owners restarted, no copy left)."""
        return self._native.degraded

    @property
    def copies(self):
        """Copies of each shard (create's ``replicas``)."""
        return self._native.copies

    @property
    def shards(self):
        return [Shard(i, tuple(o), tuple(s), p, r)
                for i, (o, s, p, r) in enumerate(self._native.shards())]

    def remote_shards(self):
        return [RemoteShard(self, shard) for shard in self.shards]

    # ---- Bytes.
    def read_region(self, offsets, sizes, out=None, timeout=None,
                    progress=False):
        """The box at ``offsets`` of ``sizes`` as a numpy array (into
        ``out`` when given, in place). Ctrl-C stops a long read promptly;
        ``progress=True`` shows a tqdm bar."""
        offsets = [operator.index(o) for o in offsets]
        sizes = [operator.index(s) for s in sizes]
        if out is not None and not isinstance(out, numpy.ndarray):
            raise _invalid("out must be a numpy array")
        direct = out if out is None or out.flags.c_contiguous else None
        if not progress:  # the common case, kept short for small boxes
            got = self._native.read_region(offsets, sizes, direct,
                                           _seconds(timeout), None)
        else:
            nbytes = self.dtype.itemsize * math.prod(sizes)
            with _Progress(progress, nbytes, f"read {self.name}") as bar:
                got = self._native.read_region(offsets, sizes, direct,
                                               _seconds(timeout),
                                               bar.callback)
        if out is None or direct is not None:
            return got
        out[...] = got
        return out

    def read(self, out=None, timeout=None, progress=False):
        """The whole tensor (into ``out`` when given)."""
        return self.read_region((0,) * self.ndim, self._shape, out=out,
                                timeout=timeout, progress=progress)

    def write(self, offsets, data, timeout=None, progress=False):
        """Writes ``data`` (numpy array or CPU torch tensor, any layout) as
        the box at ``offsets``; each owner gets its part. Ctrl-C stops a
        long write promptly (owners may hold part of it, as after any
        failed write)."""
        array = numpy.ascontiguousarray(_as_numpy(data))
        offsets = [operator.index(o) for o in offsets]
        with _Progress(progress, array.nbytes, f"write {self.name}") as bar:
            self._native.write(offsets, array, _seconds(timeout),
                               bar.callback)

    # ---- numpy basic indexing (ints, slices of step 1, '...'; parsed by
    # the native view, so a small read is one call).
    def __getitem__(self, key):
        return self._native.getitem(key)

    def __setitem__(self, key, value):
        offsets, sizes, shape = self._native.box(key)
        if hasattr(value, "detach") and hasattr(value, "numpy"):
            value = value.detach().cpu().numpy()
        data = numpy.broadcast_to(numpy.asarray(value, dtype=self.dtype),
                                  shape).reshape(sizes)
        if 0 in sizes:
            return
        self.write(offsets, data)

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __array__(self, dtype=None):
        array = self.read()
        return array if dtype is None else array.astype(dtype)

    def __repr__(self):
        return (f"tessera.Tensor({self.name!r}, shape={self._shape}, "
                f"dtype={self.dtype_name}, shards={len(self.shards)}, "
                f"id={self.tensor_id!r})")
