"""Versions of versioned tensors (docs/versions.md): open versions written
and then published atomically, and snapshots that pin published ones."""

from __future__ import annotations

from typing import (TYPE_CHECKING, Any, Iterable, Iterator, List, Optional,
                    Sequence)

from . import _tessera, errors
from ._tensor import Tensor, _write_many

if TYPE_CHECKING:
    from . import Client

__all__ = ["Version", "VersionGroup", "Snapshot"]


class VersionGroup:
    """Open versions of one or more tensors, begun together
    (``Client.begin``) or joined by id (``Client.join``): write each
    through ``group[name]`` (a Tensor: ``group["a"][0:2] = x``), then
    ``publish()`` makes all of them the latest at once on every daemon, or
    ``abort()`` drops them. As a context manager it publishes on normal
    exit and aborts on an exception. ``id`` names the group for another
    process's ``Client.join``."""

    def __init__(self, client: Client,
                 native: _tessera.VersionGroup) -> None:
        self._client = client
        self._native = native
        self._tensors = {name: Tensor(client, view)
                         for name, _, view in native.versions()}
        self._numbers = {name: number
                         for name, number, _ in native.versions()}
        self._done = False

    @property
    def id(self) -> str:
        return self._native.id

    @property
    def numbers(self) -> dict[str, int]:
        """The number each version will have once published."""
        return dict(self._numbers)

    @property
    def names(self) -> list[str]:
        return list(self._tensors)

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise errors.NotFoundError(
                5, f"tensor {name} is not in version group {self.id}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def write_many(self, items: Iterable[tuple[str, Sequence[int], Any]],
                   timeout: Optional[float] = None) -> None:
        """Writes each ``(name, offsets, data)`` as ``group[name].write``
        would, all in one call (several at once): a state dict of many
        small tensors costs one call, not a round trip per tensor in turn.
        The boxes are written in no order, so boxes of one tensor that
        overlap are refused (InvalidArgumentError) before anything is
        written; ``timeout`` bounds the whole call. On an error
        (the first item's, in order, that failed) the items started may
        have been written, as after any failed write."""
        _write_many([(self[name], offsets, data)
                     for name, offsets, data in items], timeout)

    def publish(self) -> dict[str, int]:
        """Makes every version of the group the latest, atomically;
        returns their numbers by name."""
        published = dict(self._native.publish())
        self._done = True
        return published

    def abort(self) -> None:
        """Drops the versions (their memory is freed)."""
        self._native.abort()
        self._done = True

    def __enter__(self) -> VersionGroup:
        return self

    def __exit__(self, kind: Any, *exc: object) -> None:
        if self._done:
            return
        if kind is None:
            self.publish()
        else:
            self.abort()

    def __repr__(self) -> str:
        return f"tessera.VersionGroup({self.id!r})"


class Version(VersionGroup):
    """An open version of one tensor (``Tensor.begin``): written like the
    tensor (``v[0:2] = x``, ``v.write(offsets, data)``, read back with
    ``v.read()``), then published (``v.publish()`` returns its number) or
    aborted; as a context manager it publishes on normal exit and aborts
    on an exception."""

    @property
    def tensor(self) -> Tensor:
        """The open version as a Tensor (writable until published)."""
        return next(iter(self._tensors.values()))

    @property
    def number(self) -> int:
        return next(iter(self._numbers.values()))

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return super().__getitem__(key)
        return self.tensor[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self.tensor[key] = value

    def write(self, offsets: Sequence[int], data: Any,
              timeout: Optional[float] = None) -> None:
        self.tensor.write(offsets, data, timeout=timeout)

    def read(self, **kwargs: Any) -> Any:
        return self.tensor.read(**kwargs)

    def publish(self) -> int:  # type: ignore[override]
        """Makes this version the latest on every daemon at once; returns
        its number."""
        return next(iter(super().publish().values()))

    def __enter__(self) -> Version:
        return self

    def __repr__(self) -> str:
        return (f"tessera.Version({self.tensor.name!r}, {self.number}, "
                f"id={self.id!r})")


class Snapshot:
    """Pinned versions (``Tensor.snapshot``, ``Client.snapshot``): every
    read through ``snapshot[name]`` (or, for one tensor, the snapshot
    itself) returns its pinned version until ``release()``, the end of a
    ``with`` block, or the pin's lease. ``version`` (one tensor) and
    ``versions`` (by name) are the pinned numbers."""

    def __init__(self, client: Client, native: _tessera.Snapshot) -> None:
        self._client = client
        self._native = native
        self._tensors = {name: Tensor(client, view)
                         for name, _, view in native.versions()}
        self.versions = {name: number
                         for name, number, _ in native.versions()}

    @property
    def id(self) -> str:
        return self._native.id

    @property
    def version(self) -> int:
        """The pinned version (of the snapshot's first tensor)."""
        return next(iter(self.versions.values()))

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and key in self._tensors:
            return self._tensors[key]
        if isinstance(key, str):
            raise errors.NotFoundError(
                5, f"tensor {key} is not in snapshot {self.id}")
        return next(iter(self._tensors.values()))[key]

    def read(self, **kwargs: Any) -> Any:
        """The pinned version of the (first) tensor, whole."""
        return next(iter(self._tensors.values())).read(**kwargs)

    def save(self, path: str, overwrite: bool = False) -> List[str]:
        """Saves the pinned version of every tensor of the snapshot into a
        checkpoint at ``path`` (as ``Client.save``): one consistent state
        of them, whatever was published since."""
        return self._client.save(path, list(self.versions), overwrite,
                                 versions=self.versions)

    def release(self) -> None:
        self._native.release()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"tessera.Snapshot({self.versions!r}, id={self.id!r})"
