"""Read plans (docs/weight_sync.md): destinations filled from boxes of named
tensors, planned once from the metadata and run every step.

    plan = c.plan_reads([
        ("w", (0, 512), (768, 256), w_half),             # a box into an out
        ([("q", (0, 0), (768, 384), (0, 0)),             # fused: q, k and v
          ("k", (0, 0), (768, 384), (768, 0)),           #   into one qkv,
          ("v", (0, 0), (768, 384), (1536, 0))], qkv),   #   at out offsets
    ])
    n = plan.run()            # every step: the latest version, no metadata call
    plan.run(version=n)       # a kept version

``out`` is a numpy array or a torch tensor (C-contiguous; on the CPU, or a
GPU: pieces land in host memory and are copied there), written in place; its dtype may differ from the tensor's between floating types
(float32 to float16 or bfloat16, bfloat16 to float32...), converted as torch
rounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from . import _tessera
from ._tensor import (_integer, _integers, _invalid, _is_torch, _seconds,
                      _target)

if TYPE_CHECKING:
    from . import Client


def _item(item: Any, index: int) -> Tuple[List[Any], Any, str, Any]:
    """(sources, numpy out, dtype name, out as given) of one plan_reads
    item."""
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 4):
        raise _invalid(f"item {index} must be (name, offsets, sizes, out) or "
                       f"(sources, out), not {item!r:.80}")
    if len(item) == 4:
        name, offsets, sizes, out = item
        sources = [(name, offsets, sizes, [])]
    else:
        sources, out = item
        if isinstance(sources, str) or not isinstance(sources, (tuple, list)):
            raise _invalid(f"item {index}: sources must be a list of (name, "
                           f"offsets, sizes, out_offsets)")
    target: Any
    if _is_torch(out) and out.device.type == "cuda":
        # GPU memory: its pointer, kept alive by the plan (pieces land in
        # host staging and are copied to the device).
        if not out.is_contiguous():
            raise _invalid(f"item {index}: out must be C-contiguous")
        dtype = str(out.dtype).replace("torch.", "")
        target = (int(out.data_ptr()), list(out.shape),
                  int(out.device.index or 0), out)
    else:
        array, bits = _target(out)
        if not array.flags.c_contiguous:
            raise _invalid(f"item {index}: out must be C-contiguous")
        dtype = "bfloat16" if bits else str(array.dtype)
        target = array
    planned = []
    for k, source in enumerate(sources):
        if not isinstance(source, (tuple, list)) or len(source) not in (3, 4):
            raise _invalid(f"item {index} source {k} must be (name, offsets, "
                           f"sizes, out_offsets)")
        name, offsets, sizes = source[0], source[1], source[2]
        out_offsets = source[3] if len(source) == 4 else []
        if not isinstance(name, str):
            raise _invalid(f"item {index} source {k}: the name must be a str")
        planned.append((name, _integers(offsets, "offsets"),
                        _integers(sizes, "sizes"),
                        _integers(out_offsets, "out_offsets")))
    if len(item) == 4:
        shape = (tuple(target[1]) if isinstance(target, tuple)
                 else tuple(target.shape))
        if shape != tuple(planned[0][2]):
            raise _invalid(f"item {index}: out has shape {list(shape)}, not "
                           f"the box's sizes {list(planned[0][2])} (to fill "
                           f"part of an out, give (sources, out) with "
                           f"out_offsets)")
    return planned, target, dtype, out


class ReadPlan:
    """A plan made by Client.plan_reads: ``run()`` fills every ``out``.
    Runs make no metadata call while nothing changed; a reshard, a
    re-create or a restarted daemon makes the next run plan again by
    itself. Safe to share between threads (runs take turns)."""

    def __init__(self, client: "Client", native: _tessera.ReadPlan) -> None:
        self._client = client
        self._native = native
        self.versions: Dict[str, int] = {}
        self.last_bytes = 0
        self.replanned = False
        self.pinned = False

    def run(self, version: Optional[int] = None,
            timeout: Optional[float] = None) -> int:
        """Reads every item: the latest published version of the plan's
        tensors (one point of the log across them), or ``version`` of each.
        Returns the version read (0 when no tensor is versioned; the
        highest when the tensors' numbers differ: ``versions`` has each).
        Ctrl-C stops it; a failed run leaves the outs partly written."""
        number, versions, replanned, pinned, moved = self._native.run(
            0 if version is None else _integer(version, "version"),
            _seconds(timeout))
        self.versions = dict(versions)
        self.replanned = bool(replanned)
        self.pinned = bool(pinned)
        self.last_bytes = int(moved)
        return int(number)

    @property
    def bytes(self) -> int:
        """Bytes one run moves (in the tensors' dtypes)."""
        return int(self._native.bytes)

    @property
    def pieces(self) -> int:
        """Shard pieces one run fetches."""
        return int(self._native.pieces)

    @property
    def plans(self) -> int:
        """How many times the plan was made (1 + re-plans)."""
        return int(self._native.plans)

    @property
    def names(self) -> List[str]:
        """The plan's tensors."""
        return list(self._native.names)

    @property
    def shapes(self) -> List[Tuple[int, ...]]:
        """The sizes of each of ``names``, as the plan was last made."""
        return [tuple(int(n) for n in shape) for shape in self._native.shapes]

    def sources(self) -> List[Dict[str, int]]:
        """Per daemon: its rank, the pieces and bytes a run reads from it."""
        return [{"rank": r, "pieces": p, "bytes": b}
                for r, p, b in self._native.sources()]

    def __repr__(self) -> str:
        return (f"ReadPlan({len(self.names)} tensors, {self.pieces} pieces, "
                f"{self.bytes} bytes)")


def plan_reads(client: "Client", items: Sequence[Any]) -> ReadPlan:
    """Client.plan_reads (see there)."""
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise TypeError("items must be a list of (name, offsets, sizes, out) "
                        "or (sources, out)")
    native_items = [_item(item, i) for i, item in enumerate(items)]
    return ReadPlan(client, client._native.plan_reads(native_items))
