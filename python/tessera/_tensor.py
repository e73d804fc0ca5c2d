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

    def to_here(self, timeout=None, cast=None):
        """(offsets, sizes, array): the shard's bytes, fetched now (as
        ``cast`` when given; a bfloat16 tensor needs one)."""
        offsets, sizes, array = self._tensor._native.to_here(
            self.shard.index, _seconds(timeout))
        return (tuple(offsets), tuple(sizes),
                self._tensor._values(array, cast))

    def __repr__(self):
        return (f"tessera.RemoteShard({self._tensor.name!r}, shard "
                f"{self.shard.index} on rank {self.shard.rank})")


def _seconds(timeout):
    return 0.0 if timeout is None else float(timeout)


def _source(data):
    """(numpy array, bfloat16 bits?) of ``data``: numpy, anything
    array-like, or a CPU torch tensor, whose memory the array shares (a
    torch.bfloat16 one as its bits, int16)."""
    if hasattr(data, "detach") and hasattr(data, "numpy"):  # torch
        if data.device.type != "cpu":
            raise _invalid("only CPU torch tensors: call .cpu()")
        data = data.detach()
        if str(data.dtype) == "torch.bfloat16":
            import torch

            return data.view(torch.int16).numpy(), True
        return data.numpy(), False
    return numpy.asarray(data), False


def _as_numpy(data):
    """A numpy array of ``data`` (see _source); torch.bfloat16 values come
    as float32."""
    array, bits = _source(data)
    return bf16_to_float32(array) if bits else array


def bf16_to_float32(bits):
    """bfloat16 bits (a 16-bit integer array) as float32 values (exact)."""
    return (bits.view(numpy.uint16).astype(numpy.uint32) << 16).view(
        numpy.float32)


def float_to_bf16(values):
    """Values as bfloat16 bits (uint16), rounded to the nearest even as
    torch does; NaNs stay NaNs."""
    f = numpy.ascontiguousarray(values, dtype=numpy.float32)
    u = f.view(numpy.uint32)
    bits = ((u + numpy.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(
        numpy.uint16)
    nan = numpy.isnan(f)
    if nan.any():
        bits[nan] = ((u[nan] >> 16) | 0x40).astype(numpy.uint16)
    return bits


def _is_bits(array):
    return array.dtype.itemsize == 2 and array.dtype.kind in "ui"


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
        self._bf16 = native.dtype == "bfloat16"

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
        lacks: see dtype_name; read with cast=, or with tessera.torch)."""
        if self._bf16:
            raise _invalid(f"tensor {self.name} is bfloat16, which numpy "
                           f"lacks (see dtype_name): read it with "
                           f"cast=\"float32\", or into a torch.bfloat16 "
                           f"tensor with tessera.torch.read")
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
                    progress=False, cast=None):
        """The box at ``offsets`` of ``sizes`` as a numpy array (into
        ``out`` when given, in place), converted to the dtype ``cast`` when
        given. Ctrl-C stops a long read promptly; ``progress=True`` shows a
        tqdm bar. A bfloat16 tensor (numpy has no such dtype) is read with
        ``cast``, or as its bits into a 16-bit integer ``out``."""
        offsets = [operator.index(o) for o in offsets]
        sizes = [operator.index(s) for s in sizes]
        if out is not None and not isinstance(out, numpy.ndarray):
            raise _invalid("out must be a numpy array")
        # Checked before any byte moves, whatever the layout of out (a
        # strided one is filled by assignment, which would broadcast or
        # convert silently).
        if out is not None and out.shape != tuple(sizes):
            raise _invalid(f"out has shape {out.shape} but the box is "
                           f"{tuple(sizes)}")
        if cast is not None:
            try:
                cast = numpy.dtype(cast)
            except TypeError as e:
                raise _invalid(f"cast: {e}") from None
            got = self._read(offsets, sizes, None, timeout, progress)
            values = self._values(got, cast)
            if out is None:
                return values
            out[...] = values
            return out
        if self._bf16 and (out is None or not _is_bits(out)):
            self.dtype  # raises, saying how to read it
        if out is not None and not self._bf16 and out.dtype != self.dtype:
            raise _invalid(f"out has dtype {out.dtype} but tensor {self.name} "
                           f"is {self.dtype_name}")
        if out is None or out.flags.c_contiguous:
            return self._read(offsets, sizes, out, timeout, progress)
        # A strided out: read into a dense array of its dtype (the same
        # bytes as out's, bits included), then assign.
        dense = self._read(offsets, sizes, numpy.empty(out.shape, out.dtype),
                           timeout, progress)
        out[...] = dense
        return out

    def _read(self, offsets, sizes, out, timeout, progress):
        if not progress:  # the common case, kept short for small boxes
            return self._native.read_region(offsets, sizes, out,
                                            _seconds(timeout), None)
        nbytes = (2 if self._bf16 else self.dtype.itemsize) * math.prod(sizes)
        with _Progress(progress, nbytes, f"read {self.name}") as bar:
            return self._native.read_region(offsets, sizes, out,
                                            _seconds(timeout), bar.callback)

    def _values(self, got, cast):
        """What the native layer read (bfloat16: its bits) as ``cast``."""
        if cast is None:
            if self._bf16:
                self.dtype  # raises, saying how to read it
            return got
        values = bf16_to_float32(got) if self._bf16 else got
        return values.astype(numpy.dtype(cast), copy=False)

    def read(self, out=None, timeout=None, progress=False, cast=None):
        """The whole tensor (into ``out`` when given; as ``cast`` when
        given)."""
        return self.read_region((0,) * self.ndim, self._shape, out=out,
                                timeout=timeout, progress=progress,
                                cast=cast)

    def write(self, offsets, data, timeout=None, progress=False):
        """Writes ``data`` (numpy array or CPU torch tensor, any layout) as
        the box at ``offsets``; each owner gets its part. A bfloat16 tensor
        takes numbers (rounded to bfloat16 as torch does) or a
        torch.bfloat16 tensor. Ctrl-C stops a long write promptly (owners
        may hold part of it, as after any failed write)."""
        array, bits = _source(data)
        if bits and not self._bf16:
            raise _invalid(f"data is bfloat16 but tensor {self.name} is "
                           f"{self.dtype_name}")
        if self._bf16 and not bits:
            array = float_to_bf16(array)
        array = numpy.ascontiguousarray(array)
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
        value = _as_numpy(value)
        dtype = numpy.float32 if self._bf16 else self.dtype
        data = numpy.broadcast_to(numpy.asarray(value, dtype=dtype),
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
