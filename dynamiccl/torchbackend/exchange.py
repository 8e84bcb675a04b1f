"""The ``"ina"`` torch backend's exchange of set-up values between ranks (layer:
dynamiccl; served by :mod:`dynamiccl.torch_backend`).

Owns the store protocol: :class:`Exchange` (every rank's value gathered on rank 0, rank
0's outcome shared with all), over a c10d store (:class:`StoreExchange`, the one a
backend is built from; keys under a prefix of the job's) or over an initialized process
group's object collectives (:class:`GroupExchange`). Imports nothing else of the package.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch.distributed as dist

__all__ = ["Exchange", "GroupExchange", "StoreExchange"]


class Exchange(Protocol):
    """How the ranks of a job share their addresses and rank 0's outcome of the setup."""

    rank: int
    world_size: int

    def gather(self, value: str) -> list[str] | None:
        """Every rank's ``value`` on rank 0 (index = rank); ``None`` on other ranks."""
        ...

    def share(self, value: str | None) -> str:
        """Rank 0's ``value``, on every rank (others pass ``None``)."""
        ...

    def within(self, name: str) -> Exchange:
        """The same ranks for a further round of gather and share, which must not meet
        this one's values (every rank asks for the same ``name``)."""
        ...


class StoreExchange:
    """An :class:`Exchange` over a c10d store (the one a backend is built from)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, prefix: str) -> None:
        self.store, self.rank, self.world_size, self.prefix = store, rank, world_size, prefix

    def gather(self, value: str) -> list[str] | None:
        self.store.set(f"{self.prefix}/addr/{self.rank}", value)
        if self.rank != 0:
            return None
        keys = [f"{self.prefix}/addr/{r}" for r in range(self.world_size)]
        return [self.store.get(key).decode() for key in keys]

    def share(self, value: str | None) -> str:
        if self.rank == 0:
            if value is None:
                raise ValueError("rank 0 must share a value")
            self.store.set(f"{self.prefix}/ready", value)
            return value
        return self.store.get(f"{self.prefix}/ready").decode()

    def within(self, name: str) -> StoreExchange:
        """Keys under ``PREFIX/name``: a round of its own."""
        return StoreExchange(self.store, self.rank, self.world_size, f"{self.prefix}/{name}")


class GroupExchange:
    """An :class:`Exchange` over an initialized process group's object collectives."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def gather(self, value: str) -> list[str] | None:
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value, group=self.group)
        return [str(v) for v in values] if self.rank == 0 else None

    def share(self, value: str | None) -> str:
        box: list[Any] = [value]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return str(box[0])

    def within(self, name: str) -> GroupExchange:
        """This exchange: the group's collectives keep each round's values apart."""
        return self
