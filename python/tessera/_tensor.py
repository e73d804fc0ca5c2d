"""A named tensor of the cluster, as numpy sees it: slicing reads and
writes only the bytes of the box."""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import (TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence,
                    Tuple, Union)

import numpy

from . import _tessera, errors

if TYPE_CHECKING:
    from types import EllipsisType

    import numpy.typing

    from . import Client

    NDArray = numpy.typing.NDArray[Any]

__all__ = ["Tensor", "Shard", "RemoteShard"]

# What a read takes as ``out=`` (see _target) and a write as data: a numpy
# array, a CPU torch tensor, a writable buffer or a __dlpack__ object.
ArrayLike = Any
# numpy's spellings of a dtype ("float32", numpy.float32, numpy.dtype).
DTypeLike = Any
# A numpy basic index: an int, a slice of step 1, ``...``, or a tuple.
Index = Union[int, slice, "EllipsisType",
              Tuple[Union[int, slice, "EllipsisType"], ...]]


@dataclasses.dataclass(frozen=True)
class Shard:
    """Where one shard lives: its box in the tensor, its placement
    ("rank:1/cpu") and its owner's rank."""

    index: int
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    placement: str
    rank: int


class RemoteShard:
    """One shard, fetched whole from its owner by :meth:`to_here`."""

    def __init__(self, tensor: Tensor, shard: Shard) -> None:
        self._tensor = tensor
        self.shard = shard

    @property
    def rank(self) -> int:
        return self.shard.rank

    def to_here(self, timeout: Optional[float] = None,
                cast: DTypeLike = None
                ) -> tuple[tuple[int, ...], tuple[int, ...], NDArray]:
        """(offsets, sizes, array): the shard's bytes, fetched now (as
        ``cast`` when given; a bfloat16 tensor needs one)."""
        offsets, sizes, array = self._tensor._native.to_here(
            self.shard.index, _seconds(timeout))
        return (tuple(offsets), tuple(sizes),
                self._tensor._values(array, cast))

    def __repr__(self) -> str:
        return (f"tessera.RemoteShard({self._tensor.name!r}, shard "
                f"{self.shard.index} on rank {self.shard.rank})")


def _seconds(timeout: Optional[float], what: str = "timeout") -> float:
    """Seconds for the native calls, where 0.0 stands for None (the
    default). InvalidArgumentError (a ValueError) for anything but a number
    above 0 and at most _MAX_SECONDS: a deadline of 0, below 0 or NaN would
    otherwise read as the default, and an infinite one could wait
    forever."""
    if timeout is None:
        return 0.0
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        raise _invalid(f"{what} must be a number of seconds or None, not "
                       f"{timeout!r:.40}") from None
    if not math.isfinite(seconds) or seconds <= 0 or seconds > _MAX_SECONDS:
        raise _invalid(f"{what} must be a number of seconds above 0 and at "
                       f"most {_MAX_SECONDS:.0f} (or None for the default), "
                       f"not {timeout!r:.40}")
    return seconds


# The longest timeout or lease taken (about 115 days, as the CLI's
# --timeout): a longer one would stand for no deadline at all.
_MAX_SECONDS = 1e7


def _is_torch(data: Any) -> bool:
    return hasattr(data, "detach") and hasattr(data, "numpy")


def _source(data: ArrayLike) -> tuple[NDArray, bool]:
    """(numpy array, bfloat16 bits?) of ``data``: numpy, anything
    array-like, or a CPU torch tensor, whose memory the array shares (a
    torch.bfloat16 one as its bits, int16). TypeError for data that is not
    numbers (a str, objects)."""
    if _is_torch(data):
        if data.device.type != "cpu":
            raise _invalid("only CPU torch tensors: call .cpu()")
        data = data.detach()
        if str(data.dtype) == "torch.bfloat16":
            import torch

            return data.view(torch.int16).numpy(), True
        return data.numpy(), False
    array = numpy.asarray(data)
    if array.dtype.kind not in "biufc":
        # Strings, bytes, objects: numpy makes an array of anything.
        raise TypeError(f"expected numbers (a numpy array, a CPU torch "
                        f"tensor or nested sequences of numbers), not "
                        f"{type(data).__name__} {data!r:.40} (numpy makes "
                        f"dtype {array.dtype} of it)")
    return array, False


def _target(out: ArrayLike) -> tuple[NDArray, bool]:
    """(numpy array sharing ``out``'s memory, bfloat16 bits?) for a read's
    ``out=``: a numpy array; a CPU torch tensor (torch.bfloat16 as its
    bits); any writable buffer (memoryview, bytearray, array.array...); a
    __dlpack__ object in CPU memory. TypeError for anything else;
    InvalidArgumentError (a ValueError) for memory off the CPU, read-only
    memory, or elements sharing memory. Nothing is written here."""
    bits = False
    if isinstance(out, numpy.ndarray):
        array = out
    elif _is_torch(out):
        if out.device.type != "cpu":
            raise _invalid(f"out is a torch tensor on {out.device}: read "
                           f"into a CPU tensor, then copy it there")
        array, bits = _source(out)
    else:
        try:
            view: Optional[memoryview] = memoryview(out)
        except TypeError:
            view = None
        if view is not None:
            if view.readonly:
                raise _invalid("out is not writeable")
            try:
                array = numpy.asarray(view)
            except (TypeError, ValueError) as e:
                raise _invalid(f"out: numpy cannot view its buffer: {e}"
                               ) from None
        elif hasattr(out, "__dlpack__"):
            array, bits = _tessera.dlpack_array(out)
        else:
            raise TypeError(
                f"out must be a numpy array, a CPU torch tensor, a writable "
                f"buffer or a __dlpack__ object, not {type(out).__name__}")
    if not array.flags.writeable:
        raise _invalid("out is not writeable")
    if array.size > 0 and any(
            stride == 0 and size > 1
            for stride, size in zip(array.strides, array.shape)):
        raise _invalid("out has elements that share memory (a stride of 0, "
                       "as after expand or broadcast_to)")
    return array, bits


def _as_numpy(data: ArrayLike) -> NDArray:
    """A numpy array of ``data`` (see _source); torch.bfloat16 values come
    as float32."""
    array, bits = _source(data)
    return bf16_to_float32(array) if bits else array


def bf16_to_float32(bits: NDArray) -> NDArray:
    """bfloat16 bits (a 16-bit integer array) as float32 values (exact)."""
    return (bits.view(numpy.uint16).astype(numpy.uint32) << 16).view(
        numpy.float32)


def float_to_bf16(values: ArrayLike) -> NDArray:
    """Values as bfloat16 bits (uint16), rounded to the nearest even as
    torch does; NaNs stay NaNs."""
    f = numpy.ascontiguousarray(values, dtype=numpy.float32).reshape(
        numpy.shape(values))  # a 0-d array stays 0-d
    u = f.view(numpy.uint32)
    bits = ((u + numpy.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(
        numpy.uint16)
    nan = numpy.isnan(f)
    if nan.any():
        bits[nan] = ((u[nan] >> 16) | 0x40).astype(numpy.uint16)
    return bits


def _is_bits(array: NDArray) -> bool:
    return array.dtype.itemsize == 2 and array.dtype.kind in "ui"


class _Progress:
    """progress=True: a tqdm bar of the bytes moved (when python3-tqdm is
    installed; nothing otherwise), updated while the transfer runs."""

    def __init__(self, wanted: bool, total: int, description: str) -> None:
        self.bar: Any = None
        if not wanted:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, unit="B", unit_scale=True,
                        unit_divisor=1024, desc=description, leave=False)

    @property
    def callback(self) -> Optional[Callable[[int, int], object]]:
        if self.bar is None:
            return None
        return lambda done, total: self.bar.update(done - self.bar.n)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def _invalid(message: str) -> errors.InvalidArgumentError:
    return errors.InvalidArgumentError(3, message)


# The range of the native layer's integers (int64_t), of its int, and
# of its uint64_t (seeds).
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
UINT64_MAX = 2**64 - 1


def _integer(value: Any, what: str, low: Optional[int] = INT64_MIN,
             high: Optional[int] = INT64_MAX) -> int:
    """``value`` as an int: an int, a numpy integer, anything with
    ``__index__``; a TypeError naming ``what`` for anything else (a float
    is refused, not truncated: 2.5 elements or version 1.9 is a mistake,
    as torch and numpy say). InvalidArgumentError outside [low, high],
    by default the range the native calls hold (int64), so that 2**64 is
    refused in words, not by pybind11's list of signatures; the calls
    check their own ranges within it (None: no bound, for a caller that
    checks a narrower range itself)."""
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {value!r:.40}") from None
    if (low is not None and number < low) or (high is not None and
                                              number > high):
        if high is None:
            wanted = f"an integer of at least {low}"
        elif low is None:
            wanted = f"an integer of at most {high}"
        else:
            wanted = f"an integer from {low} to {high}"
        raise _invalid(f"{what} must be {wanted}, not {number}")
    return number


def _name(value: Any, what: str) -> str:
    """``value`` as a tensor name: a str; a TypeError naming ``what`` for
    anything else (None or a number is refused, not turned into the name
    "None" or "3" of some other tensor)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {value!r:.40}")
    return value


def _integers(values: Any, what: str, low: Optional[int] = INT64_MIN,
              high: Optional[int] = INT64_MAX) -> list[int]:
    """Each of ``values`` as an int (_integer), in a list."""
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, not "
                        f"{values!r:.40}") from None
    return [_integer(v, what, low, high) for v in items]


class Tensor:
    """A view of a named sharded tensor: its metadata as the daemon
    described it. After a reshard or a delete its reads and writes fail
    instead of touching the new layout; ``Client.open`` gets a fresh one."""

    def __init__(self, client: Client, native: _tessera.View) -> None:
        self._client = client
        self._native = native
        self._shape = tuple(native.shape)
        self._bf16 = native.dtype == "bfloat16"

    # ---- Metadata.
    @property
    def name(self) -> str:
        return self._native.name

    @property
    def tensor_id(self) -> str:
        return self._native.tensor_id

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self._shape:
            n *= s
        return n

    @property
    def dtype_name(self) -> str:
        """The tessera dtype name ("float32", "bfloat16", ...)."""
        return self._native.dtype

    @property
    def dtype(self) -> numpy.dtype[Any]:
        """The numpy dtype (InvalidArgumentError for bfloat16, which numpy
        lacks: see dtype_name; read with cast=, or with tessera.torch)."""
        if self._bf16:
            raise _invalid(f"tensor {self.name} is bfloat16, which numpy "
                           f"lacks (see dtype_name): read it with "
                           f"cast=\"float32\", or into a torch.bfloat16 "
                           f"tensor with tessera.torch.read")
        return numpy.dtype(self.dtype_name)

    @property
    def degraded(self) -> bool:
        """Whether shards were lost (their owners restarted, no copy left)."""
        return self._native.degraded

    @property
    def copies(self) -> int:
        """Copies of each shard, the owner's included (create's ``copies``)."""
        return self._native.copies

    @property
    def shards(self) -> list[Shard]:
        return [Shard(i, tuple(o), tuple(s), p, r)
                for i, (o, s, p, r) in enumerate(self._native.shards())]

    def remote_shards(self) -> list[RemoteShard]:
        return [RemoteShard(self, shard) for shard in self.shards]

    # ---- Versions (docs/versions.md).
    @property
    def versioned(self) -> bool:
        """Whether the tensor keeps versions (created with versions >= 2)."""
        return self._native.versioned

    @property
    def version(self) -> int:
        """The latest published version now (asks the daemon); for a view
        of a given version (``at``, a snapshot's), that version."""
        if self._native.at_version:
            return self._native.at_version
        return self._client._native.open(self.name).version

    def versions(self) -> list[int]:
        """The published versions kept now (asks the daemon)."""
        return list(self._client._native.open(self.name).kept_versions())

    @property
    def last_version(self) -> int:
        """The version the last read through this object returned."""
        return self._native.last_version

    def at(self, version: int) -> Tensor:
        """This tensor at published ``version``: its reads return exactly
        that version (NotFoundError once it is no longer kept)."""
        return Tensor(self._client,
                      self._native.at(_integer(version, "version")))

    def begin(self, empty: bool = False,
              lease: Optional[float] = None,
              skip_zeroing: bool = False,
              renew: Optional[bool] = None) -> Any:
        """Opens a new version (a tessera.Version), starting from the
        latest version's values unless ``empty``. ``lease``, ``renew``
        and ``skip_zeroing``: as Client.begin (by default the version
        lives while this process holds it, and 30 s after it dies)."""
        return self._client.begin(self.name, empty=empty, lease=lease,
                                  skip_zeroing=skip_zeroing, renew=renew)

    def snapshot(self, lease: Optional[float] = None,
                 renew: Optional[bool] = None) -> Any:
        """Pins the latest version (a tessera.Snapshot) until released:
        ``lease`` and ``renew`` as Client.snapshot (by default the pin
        lives while this process holds it, and 30 s after it dies)."""
        return self._client.snapshot([self.name], lease=lease, renew=renew)

    def watch(self, timeout: Optional[float] = None, after: int = 0) -> Any:
        """Yields each newly published version number, or each after
        ``after`` (Client.watch)."""
        return self._client.watch(self.name, timeout=timeout, after=after)

    # ---- Bytes.
    def read_region(self, offsets: Sequence[int], sizes: Sequence[int],
                    out: ArrayLike = None, timeout: Optional[float] = None,
                    progress: bool = False, cast: DTypeLike = None) -> Any:
        """The box at ``offsets`` of ``sizes`` as a numpy array, converted
        to the dtype ``cast`` when given; or read into ``out`` in place and
        ``out`` returned. ``out`` may be a numpy array, a CPU torch tensor
        (torch.bfloat16 included), any writable buffer (memoryview,
        bytearray, array.array) or a ``__dlpack__`` object in CPU memory,
        of the box's shape and (without ``cast``) the tensor's dtype, any
        strides; anything else is refused before a byte moves (TypeError
        for a kind of object it cannot fill, InvalidArgumentError, a
        ValueError, for a wrong shape or dtype, read-only memory or
        elements that share memory). Ctrl-C stops a long read promptly;
        ``progress=True`` shows a tqdm bar. A bfloat16 tensor (numpy has
        no such dtype) is read with ``cast``, or as its bits into a 16-bit
        integer ``out`` or a torch.bfloat16 one."""
        offsets = _integers(offsets, "offsets")
        sizes = _integers(sizes, "sizes")
        target, bits = (None, False) if out is None else _target(out)
        # Checked before any byte moves, whatever the layout of out (a
        # strided one is filled by assignment, which would broadcast or
        # convert silently).
        if target is not None and target.shape != tuple(sizes):
            raise _invalid(f"out has shape {target.shape} but the box is "
                           f"{tuple(sizes)}")
        if cast is not None:
            try:
                cast = numpy.dtype(cast)
            except TypeError as e:
                raise _invalid(f"cast: {e}") from None
            got = self._read(offsets, sizes, None, timeout, progress)
            values = self._values(got, cast)
            if target is None:
                return values
            # A torch.bfloat16 out takes the values rounded as torch rounds.
            target[...] = (float_to_bf16(values).view(target.dtype) if bits
                           else values)
            return out
        if self._bf16 and (target is None or not _is_bits(target)):
            self.dtype  # raises, saying how to read it
        if (target is not None and not self._bf16 and
                (bits or target.dtype != self.dtype)):
            raise _invalid(f"out has dtype "
                           f"{'bfloat16' if bits else target.dtype} but "
                           f"tensor {self.name} is {self.dtype_name}")
        if target is None or target.flags.c_contiguous:
            got = self._read(offsets, sizes, target, timeout, progress)
            return got if out is None else out
        # A strided out: read into a dense array of its dtype (the same
        # bytes as out's, bits included), then assign.
        dense = self._read(offsets, sizes,
                           numpy.empty(target.shape, target.dtype), timeout,
                           progress)
        target[...] = dense
        return out

    def _read(self, offsets: list[int], sizes: list[int],
              out: Optional[NDArray], timeout: Optional[float],
              progress: bool) -> NDArray:
        if not progress:  # the common case, kept short for small boxes
            return self._native.read_region(offsets, sizes, out,
                                            _seconds(timeout), None)
        nbytes = (2 if self._bf16 else self.dtype.itemsize) * math.prod(sizes)
        with _Progress(progress, nbytes, f"read {self.name}") as bar:
            return self._native.read_region(offsets, sizes, out,
                                            _seconds(timeout), bar.callback)

    def _values(self, got: NDArray, cast: DTypeLike) -> NDArray:
        """What the native layer read (bfloat16: its bits) as ``cast``."""
        if cast is None:
            if self._bf16:
                self.dtype  # raises, saying how to read it
            return got
        values = bf16_to_float32(got) if self._bf16 else got
        return values.astype(numpy.dtype(cast), copy=False)

    def read(self, out: ArrayLike = None, timeout: Optional[float] = None,
             progress: bool = False, cast: DTypeLike = None,
             version: Optional[int] = None) -> Any:
        """The whole tensor (into ``out`` in place when given, which
        read_region describes; as ``cast`` when given). A versioned tensor
        reads its latest published version, or ``version``
        (docs/versions.md)."""
        source = self if version is None else self.at(version)
        return source.read_region((0,) * self.ndim, self._shape, out=out,
                                  timeout=timeout, progress=progress,
                                  cast=cast)

    def write(self, offsets: Sequence[int], data: ArrayLike,
              timeout: Optional[float] = None,
              progress: bool = False) -> None:
        """Writes ``data`` (numpy array or CPU torch tensor, any layout) as
        the box at ``offsets``; each owner gets its part. A bfloat16 tensor
        takes numbers (rounded to bfloat16 as torch does) or a
        torch.bfloat16 tensor. Ctrl-C stops a long write promptly (owners
        may hold part of it, as after any failed write)."""
        offsets, array = self._write_source(offsets, data)
        with _Progress(progress, array.nbytes, f"write {self.name}") as bar:
            self._native.write(offsets, array, _seconds(timeout),
                               bar.callback)

    def _write_source(self, offsets: Sequence[int],
                      data: ArrayLike) -> tuple[list[int], NDArray]:
        """``offsets`` checked and ``data`` as the C-contiguous array
        ``write`` sends (bfloat16 as its bits)."""
        array, bits = _source(data)
        if bits and not self._bf16:
            raise _invalid(f"data is bfloat16 but tensor {self.name} is "
                           f"{self.dtype_name}")
        if self._bf16 and not bits:
            array = float_to_bf16(array)
        if not array.flags.c_contiguous:  # (ascontiguousarray makes 0-d 1-d)
            array = numpy.ascontiguousarray(array)
        return _integers(offsets, "offsets"), array

    # ---- numpy basic indexing (ints, slices of step 1, '...'; parsed by
    # the native view, so a small read is one call).
    def __getitem__(self, key: Index) -> NDArray:
        return self._native.getitem(key)

    def __setitem__(self, key: Index, value: ArrayLike) -> None:
        offsets, sizes, shape = self._native.box(key)
        value = _as_numpy(value)
        dtype: DTypeLike = numpy.float32 if self._bf16 else self.dtype
        array = numpy.asarray(value, dtype=dtype)
        # As numpy assigns: leading dimensions of size 1 beyond the box's
        # are dropped (t[0] = rows of shape (1, n)).
        extra = array.ndim - len(shape)
        if extra > 0 and all(d == 1 for d in array.shape[:extra]):
            array = array.reshape(array.shape[extra:])
        try:
            data = numpy.broadcast_to(array, shape).reshape(sizes)
        except ValueError:
            raise ValueError(
                f"could not broadcast input array from shape {array.shape} "
                f"into shape {tuple(shape)}") from None
        if 0 in sizes:
            return
        self.write(offsets, data)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __array__(self, dtype: DTypeLike = None) -> NDArray:
        array: NDArray = self.read()
        return array if dtype is None else array.astype(dtype)

    def __repr__(self) -> str:
        at = self._native.at_version
        return (f"tessera.Tensor({self.name!r}, shape={self._shape}, "
                f"dtype={self.dtype_name}, shards={len(self.shards)}, "
                f"id={self.tensor_id!r}"
                f"{f', version={at}' if at else ''})")


def _write_many(items: Iterable[tuple[Tensor, Sequence[int], ArrayLike]],
                timeout: Optional[float]) -> None:
    """Writes each ``(tensor, offsets, data)`` as ``tensor.write`` would,
    in one native call (several at once, in no order; ``timeout`` bounds
    the whole call)."""
    prepared = []
    for tensor, offsets, data in items:
        at, array = tensor._write_source(offsets, data)
        prepared.append((tensor._native, at, array))
    _tessera.write_many(prepared, _seconds(timeout))
