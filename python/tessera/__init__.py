"""Tessera from Python: named sharded tensors on a cluster of daemons.

    import tessera, numpy as np
    c = tessera.connect()                       # $TESSERA_ADDRESS or 127.0.0.1:29600
    spec = tessera.chunk(0, ["rank:0/cpu", "rank:1/cpu"])
    w = c.create("w", (1000, 64), spec, dtype="float32", init="randn", seed=7)
    a = w[100:200, 8:16]                        # only those bytes move
    w[0:2, 0:8] = np.ones((2, 8), np.float32)   # each owner gets its part

Reads and writes go straight to the shards' owners over the C++ client
library (tessera._tessera), without copies for C-contiguous arrays and with
the GIL released. Every call has a deadline; failures raise
tessera.errors classes (tessera.Error and its subclasses).
"""

from __future__ import annotations

import os as _os
import warnings as _warnings
from typing import (TYPE_CHECKING, Any, Dict, Iterable, Iterator, List,
                    Mapping, Optional, Sequence, Union)

from . import _tessera
from ._tensor import (INT32_MAX, INT32_MIN, UINT64_MAX, Shard, Tensor,
                      RemoteShard, _integer, _integers, _name, _seconds,
                      _source)
from ._versions import Snapshot, Version, VersionGroup
from ._plans import ReadPlan
from . import _plans
from . import errors
from .errors import *  # noqa: F401,F403  (Error and its subclasses)

if TYPE_CHECKING:
    from ._tensor import NDArray

__all__ = [
    "connect",
    "chunk",
    "parse_spec",
    "Client",
    "Tensor",
    "Shard",
    "RemoteShard",
    "ShardingSpec",
    "Version",
    "VersionGroup",
    "Snapshot",
    "ReadPlan",
    *errors.__all__,
]

__version__ = "0.1.0"

DEFAULT_ADDRESS = "127.0.0.1:29600"
ShardingSpec = _tessera.ShardingSpec


def chunk(dim: int, placements: Iterable[object]) -> ShardingSpec:
    """ChunkShardingSpec: the tensor cut along ``dim`` into one chunk per
    placement ("rank:0/cpu", "worker1/cuda:0", ...), as torch's."""
    return _tessera.chunk(_integer(dim, "dim", INT32_MIN, INT32_MAX),
                          [str(p) for p in placements])


def parse_spec(text: str) -> ShardingSpec:
    """A spec in the CLI's text form ("chunk:dim=1:rank:0/cpu,rank:1/cpu",
    "enum:0,0:4,8@rank:0/cpu;4,0:4,8@rank:1/cpu")."""
    return _tessera.parse_spec(text)


def _dtype_name(dtype: Any) -> str:
    """The canonical tessera dtype name of a numpy/torch dtype or a name."""
    if isinstance(dtype, str):
        return _tessera.canonical_dtype(dtype)
    name = getattr(dtype, "name", None)
    if name is None:  # a numpy scalar type (np.float32) or a torch dtype
        text = str(dtype)
        name = text[len("torch."):] if text.startswith("torch.") else None
        if name is None:
            import numpy

            name = numpy.dtype(dtype).name
    return _tessera.canonical_dtype(name)


def _copies(copies: int, replicas: Optional[int]) -> int:
    """``copies``, or ``replicas`` (its older name) when given; refused
    below 1 (0 would read as the default on the daemons) and beyond what a
    count can hold (the daemons refuse more than their number)."""
    if replicas is not None:
        _warnings.warn("'replicas' is now 'copies' (the owner's copy "
                      "included)", DeprecationWarning, stacklevel=3)
        copies = replicas
    copies = _integer(copies, "copies", None, None)
    # Above int32 the native call could not even take it.
    if copies < 1 or copies > 2**31 - 1:
        raise errors.InvalidArgumentError(
            3, f"copies must be between 1 and the number of daemons, not "
            f"{copies}")
    return copies


class Client:
    """A connection to a Tessera cluster (every daemon's address is learnt
    from the one given). Safe to share between threads."""

    def __init__(self, native: _tessera.Client) -> None:
        self._native = native

    @property
    def world_size(self) -> int:
        """The number of daemons."""
        return self._native.world_size

    @property
    def generation(self) -> int:
        """The generation of the daemons' process group when connecting."""
        return self._native.generation

    @property
    def devices(self) -> list[str]:
        """Each daemon's device ("cpu", "cuda:0"), in rank order."""
        return list(self._native.devices)

    def health(self) -> list[tuple[str, int, bool]]:
        """Each daemon's health: a list of (address, rank, ok)."""
        return self._native.health()

    def stats(self) -> list[dict[str, Any]]:
        """Each daemon's metrics (docs/metrics.md), in rank order: a list of
        {"rank", "metrics": Prometheus text, "error"}, where "error" is None
        for a daemon that answered and "metrics" None for one that did not."""
        return [{"rank": rank, "metrics": text if not error else None,
                 "error": error or None}
                for rank, text, error in self._native.stats()]

    def create(self, name: str, shape: Sequence[int], spec: ShardingSpec,
               dtype: Any = "float32", init: str = "empty",
               fill_value: Optional[float] = 0.0, seed: int = 0,
               copies: int = 1, *, replicas: Optional[int] = None,
               versions: Optional[int] = None) -> Tensor:
        """Creates a named tensor laid out by ``spec``, filled by ``init``
        (empty, zeros, ones, full with ``fill_value``, rand, randn from
        ``seed``; "empty" promises no values, and reads as zeros: a daemon
        never hands out older bytes of its memory), with ``copies`` copies
        of every shard, the owner's included (1 to the number of daemons;
        C > 1 keeps C - 1 replicas on other daemons: docs/control_log.md,
        "Replicas"). ``replicas`` is an older name of ``copies``.
        ``versions=K`` (2 to 64) makes it a versioned tensor keeping K
        published versions, written through ``begin`` and read one
        published version at a time (docs/versions.md); None or 1 writes it
        in place."""
        copies = _copies(copies, replicas)
        kept = (0 if versions is None else
                _integer(versions, "versions", None, None))
        if kept < 0 or kept > 64:
            raise errors.InvalidArgumentError(
                3, f"versions must be between 1 and 64, not {kept}")
        if fill_value is None:
            fill_value = 0.0
        elif init == "empty" and fill_value != 0.0:
            init = "full"
        return Tensor(self, self._native.create(
            name, _integers(shape, "shape"), spec, _dtype_name(dtype), init,
            float(fill_value), _integer(seed, "seed", 0, UINT64_MAX), copies,
            kept))

    def create_many(self, tensors: Sequence[Mapping[str, Any]]
                    ) -> List[Tensor]:
        """Creates every tensor of ``tensors`` in one logged call: the cost
        of one :meth:`create`, whatever their number (a model's state
        dict). Each is a dict of :meth:`create`'s arguments (``name``,
        ``shape``, ``spec``; optional ``dtype``, ``init``, ``fill_value``,
        ``seed``, ``copies``, ``versions``). All of them are created, or
        none: the error names the first refused."""
        native = []
        for i, t in enumerate(tensors):
            try:
                name, shape, spec = t["name"], t["shape"], t["spec"]
            except (KeyError, TypeError):
                raise errors.InvalidArgumentError(
                    3, f"tensor {i}: a dict with name, shape and spec, not "
                       f"{t!r:.80}") from None
            kept = t.get("versions")
            kept = 0 if kept is None else _integer(kept, "versions", None,
                                                   None)
            if kept < 0 or kept > 64:
                raise errors.InvalidArgumentError(
                    3, f"tensor {name}: versions must be between 1 and 64, "
                       f"not {kept}")
            init = t.get("init", "empty")
            fill_value = t.get("fill_value")
            if fill_value is None:
                fill_value = 0.0
            elif init == "empty" and fill_value != 0.0:
                init = "full"
            native.append((_name(name, f"tensor {i}: name"),
                           _integers(shape, "shape"), spec,
                           _dtype_name(t.get("dtype", "float32")), init,
                           float(fill_value),
                           _integer(t.get("seed", 0), "seed", 0, UINT64_MAX),
                           _copies(t.get("copies", 1), None), kept))
        return [Tensor(self, v) for v in self._native.create_many(native)]

    def put(self, name: str, array: Any, spec: ShardingSpec,
            copies: int = 1, timeout: Optional[float] = None, *,
            replicas: Optional[int] = None) -> Tensor:
        """Creates ``name`` with ``array``'s shape and dtype (a numpy array
        or a CPU torch tensor), ``copies`` copies of every shard (as
        :meth:`create`), and writes it."""
        data, bits = _source(array)
        tensor = self.create(name, data.shape, spec,
                             dtype="bfloat16" if bits else data.dtype.name,
                             copies=_copies(copies, replicas))
        try:
            tensor.write((0,) * data.ndim, array, timeout=timeout)
        except BaseException:
            try:
                self.delete(name)
            except Error:
                pass
            raise
        return tensor

    # (Below this method, "list" in an annotation would name it: List.)
    def list(self) -> list[Tensor]:
        """Every tensor, sorted by name."""
        return [Tensor(self, v) for v in self._native.list()]

    def open(self, name: str) -> Tensor:
        """The tensor named ``name`` (NotFoundError when there is none)."""
        return Tensor(self, self._native.open(name))

    def operation(self, request_id: str) -> dict[str, Any]:
        """What became of the logged call (create, delete, reshard, save,
        load) that carried ``request_id``: {"state": "committed" | "failed"
        | "pending" | "unknown", "method", "tensor", "log_entry", "code",
        "message"} ("code" and "message" say why a failed one failed; a
        failed call changed nothing and a retry with the id runs it again;
        a committed one is never applied twice)."""
        state, method, tensor, entry, code, message = \
            self._native.operation(request_id)
        return {"request_id": request_id, "state": state, "method": method,
                "tensor": tensor, "log_entry": entry, "code": code,
                "message": message}

    # ---- Versions (docs/versions.md).
    def begin(self, names: Union[str, Sequence[str]], empty: bool = False,
              lease: Optional[float] = None,
              skip_zeroing: bool = False,
              renew: Optional[bool] = None) -> Any:
        """Opens one new version of each named tensor (versioned ones):
        a tessera.Version for one name, a tessera.VersionGroup for a list
        (``group["a"][...] = x``, then ``group.publish()`` makes all of
        them the latest together). The new versions start from the latest
        values unless ``empty`` (then as zeros). Unless published or
        aborted, they live while this process holds them: it renews
        their lease on every daemon (from a thread of its own) until the
        group is published, aborted or garbage-collected, and they are
        dropped 30 s after the last renewal (a writer that dies or stops
        frees them within 30 s; a long write keeps them). With ``lease``
        (seconds), they are dropped unless published within ``lease`` of
        the begin instead, or, with ``renew=True``, within ``lease`` of
        their last renewal. ``skip_zeroing`` (with ``empty``), for writers
        that write every element before publishing: a version begun in a
        freed one's memory is not zeroed first, and an element they miss
        holds an older version's value."""
        single = isinstance(names, str)
        listed = [names] if single else list(names)
        native = self._native.begin(listed, bool(empty),
                                    _seconds(lease, "lease"),
                                    bool(skip_zeroing), bool(renew))
        return (Version if single else VersionGroup)(self, native)

    def join(self, id: str) -> Any:
        """The open versions another process began (its ``.id``), to write
        into them too: a tessera.Version for one tensor, else a
        tessera.VersionGroup. Publishing from any one of them publishes
        the group."""
        native = self._native.join(id)
        return (Version if len(native.versions()) == 1 else VersionGroup)(
            self, native)

    def plan_reads(self, items: Sequence[Any]) -> ReadPlan:
        """Plans reads of boxes of named tensors into destinations, once
        (docs/weight_sync.md); ``plan.run()`` then reads them every step
        with no metadata call. Each item is ``(name, offsets, sizes, out)``
        or ``(sources, out)`` with ``sources`` a list of ``(name, offsets,
        sizes, out_offsets)`` (several boxes into one ``out``: q, k and v
        into a fused qkv). ``out``: a C-contiguous numpy array or CPU torch
        tensor, of the tensor's dtype or another floating one (converted
        as torch rounds), of shape ``sizes`` in the first form. The plan
        writes the memory ``out`` has now: a run after ``out`` was resized
        or given other storage raises InvalidArgumentError and writes
        nothing. NotFoundError for an unknown tensor,
        InvalidArgumentError / OutOfRangeError for boxes that leave their
        tensor or ``out``, overlapping sources, the ``out``s of two items
        that overlap in part, or dtypes that do not convert. Two items may
        share one ``out`` exactly (tied weights): it holds whichever lands
        last."""
        return _plans.plan_reads(self, items)

    def snapshot(self, names: Union[str, Sequence[str]],
                 lease: Optional[float] = None,
                 versions: Optional[Sequence[int]] = None,
                 renew: Optional[bool] = None) -> Snapshot:
        """Pins the latest version of each named tensor, all taken at one
        point (or ``versions``, by position), until released (``with``):
        ``snapshot["a"]`` reads it. This process renews the pin while it
        holds the snapshot; a reader that dies or stops loses it 30 s
        after its last renewal. With ``lease`` (seconds): the pin ends
        ``lease`` after it was taken, or, with ``renew=True``, after its
        last renewal."""
        listed = [names] if isinstance(names, str) else list(names)
        return Snapshot(self, self._native.pin(
            listed, _seconds(lease, "lease"),
            _integers(versions or [], "versions"), bool(renew)))

    def watch(self, name: str, timeout: Optional[float] = None,
              after: int = 0) -> Iterator[int]:
        """Yields each version of ``name`` published from now on (or after
        ``after``: those still kept first), in increasing order, over a
        server stream of the connected daemon that reconnects by itself.
        ``timeout`` ends the iteration after that many seconds without a
        new version (None: never); Ctrl-C stops it. NotFoundError once the
        tensor is deleted."""
        if timeout is not None:
            timeout = _seconds(timeout)
        # The stream starts now, not at the first next().
        watcher = self._native.watch(name, _integer(after, "after"))

        def versions() -> Iterator[int]:
            idle = 0.0
            while True:
                wait = 0.25 if timeout is None else min(0.25, timeout - idle)
                number = watcher.next(max(wait, 0.0))
                if number is not None:
                    idle = 0.0
                    yield number
                    continue
                idle += wait
                if timeout is not None and idle >= timeout:
                    return

        return versions()

    def delete(self, name: str) -> None:
        """Deletes the tensor (NotFoundError when there is none)."""
        self._native.delete(name)

    def delete_many(self, names: Sequence[str]) -> None:
        """Deletes every tensor of ``names`` in one logged call (per 4096
        of them): the cost of one :meth:`delete`, whatever their number.
        All of them are deleted, or none: NotFoundError names the first
        that does not exist, InvalidArgumentError a name given twice."""
        if isinstance(names, (str, bytes)):
            raise errors.InvalidArgumentError(
                3, "delete_many takes a list of names, not one name")
        self._native.delete_many([_name(n, "delete_many: each name")
                                  for n in names])

    def reshard(self, name: str, spec: ShardingSpec) -> Tensor:
        """Lays the tensor out by ``spec``; returns its new view. A
        versioned tensor moves its latest published version (same number)
        and drops the older ones. While a version is open it waits, asking
        again, until the version is published or aborted: AbortedError at
        the client's timeout, having applied nothing."""
        return Tensor(self, self._native.reshard(name, spec))

    def gather(self, name: str, timeout: Optional[float] = None
               ) -> NDArray:
        """The whole tensor, gathered by the connected daemon."""
        return self._native.gather(name, _seconds(timeout))

    def save(self, path: str, names: Optional[Iterable[str]] = None,
             overwrite: bool = False,
             versions: Optional[Dict[str, int]] = None) -> List[str]:
        """Saves tensors (None: all) under the daemons' checkpoint root;
        returns the names saved. ``versions`` saves a kept older version
        of versioned tensors, by name (the others save their latest);
        ``Snapshot.save`` saves a snapshot's pinned versions."""
        return self._native.save(path, list(names or []), bool(overwrite),
                                 {_name(k, "versions: each name"):
                                  _integer(v, "version", 1)
                                  for k, v in (versions or {}).items()})

    def load(self, path: str, names: Optional[Iterable[str]] = None,
             as_names: Optional[Iterable[str]] = None,
             spec: Optional[ShardingSpec] = None,
             replace: bool = False,
             versions: Optional[int] = None) -> List[Tensor]:
        """Loads a checkpoint (entries ``names``, renamed ``as_names``,
        resharded to ``spec``); returns the loaded tensors, each held as
        it was saved (its versions kept, its copies) unless ``versions``
        says: 2 to 64 loads them as versioned tensors, as ``create`` does,
        the checkpoint's values being their version 1; 1, in place."""
        views = self._native.load(path, list(names or []),
                                  list(as_names or []), spec, bool(replace),
                                  _integer(versions or 0, "versions", 0, 64))
        return [Tensor(self, v) for v in views]

    def __repr__(self) -> str:
        return f"tessera.Client(world_size={self.world_size})"


def connect(address: Optional[str] = None, timeout: float = 60.0,
            tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
            tls_key: Optional[str] = None, token: Optional[str] = None,
            token_file: Optional[str] = None,
            request_id: Optional[str] = None,
            data_lanes: int = 0, local_path: bool = True) -> Client:
    """Connects to the daemon at ``address`` ($TESSERA_ADDRESS, else
    127.0.0.1:29600) and learns the cluster from it.

    ``timeout`` is each control call's deadline (seconds). TLS and tokens
    are the CLI's: ``tls_ca``/``tls_cert``/``tls_key`` (else
    $TESSERA_TLS_CA/_CERT/_KEY) and ``token`` or ``token_file`` (else
    $TESSERA_TOKEN / $TESSERA_TOKEN_FILE); they apply to the whole process.
    ``request_id`` is the id of this client's calls: the daemons log it with
    the operations they start (docs/metrics.md), and it is their
    idempotency key (the first logged call carries it, the next ones
    "<id>.2", "<id>.3", ...: a script run again with the same id applies
    none of its operations twice; ``Client.operation`` tells what became of
    one). None: a new random one per call. ``data_lanes`` is the most
    data-plane connections to one daemon a large read or write is striped
    across (0: the default, 4; 1: one connection per transfer).
    ``local_path=False`` reads daemons of this host over their sockets
    instead of mapping their memory (benchmarks of the wire use it).
    """
    if address is None:
        address = _os.environ.get("TESSERA_ADDRESS") or DEFAULT_ADDRESS
    if tls_ca or tls_cert or tls_key:
        _tessera.set_tls(tls_ca or "", tls_cert or "", tls_key or "")
    if token_file is not None:
        token = _tessera.read_token_file(_os.fspath(token_file))
    if token is not None:
        _tessera.set_token(token)
    return Client(_tessera.Client.connect(address, _seconds(timeout),
                                          request_id or "",
                                          _integer(data_lanes, "data_lanes",
                                                   INT32_MIN, INT32_MAX),
                                          bool(local_path)))
