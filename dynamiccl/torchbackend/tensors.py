"""The ``"ina"`` torch backend's tensors (layer: dynamiccl; served by
:mod:`dynamiccl.torch_backend`).

Owns what hostlib carries of a torch tensor (int32/float32, on the CPU or staged from
CUDA: :data:`INA_DTYPES`), the staging through a contiguous host copy
(:func:`ina_allreduce_` and the in-place helpers), and the completed ``Work`` that a call
run to its end on hostlib returns. Imports nothing else of the package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (  # type: ignore[attr-defined]  # not in the stubs
    _create_work_from_future,
)

from hostlib.session import InaSession, StripedInaSession

__all__ = ["INA_DTYPES", "ina_allreduce_"]

INA_DTYPES = (torch.float32, torch.int32)


def _carried(tensor: torch.Tensor) -> bool:
    """Whether hostlib can take ``tensor``: int32/float32, on the CPU or staged from CUDA."""
    return tensor.dtype in INA_DTYPES and tensor.device.type in ("cpu", "cuda")


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def ina_allreduce_(
    session: InaSession | StripedInaSession, tensor: torch.Tensor, *, window: int | None = None
) -> torch.Tensor:
    """Sum ``tensor`` in place over the session's job; return it.

    A CPU contiguous tensor is reduced in its own memory; a non-contiguous or CUDA
    tensor is staged through a contiguous host copy and copied back.

    Args:
        session: this rank's INA session.
        tensor: an int32 or float32 tensor.
        window: the call's INA window (``None``: the job's slots).

    Raises:
        TypeError: a dtype other than int32/float32.
        ValueError: NaN or infinity in float32 data, or a window outside the job's slots.
        InaError: the switch or a peer stopped answering.
    """
    return _in_place(tensor, lambda host: session.allreduce(host, inplace=True, window=window))


def _in_place(tensor: torch.Tensor, reduce: Callable[[torch.Tensor], Any]) -> torch.Tensor:
    """``reduce(host)`` on ``tensor``'s own memory if it is CPU and contiguous, else on a
    contiguous host copy that is copied back."""
    data = tensor.detach()
    if data.device.type == "cpu" and data.is_contiguous():
        reduce(data)
        return tensor
    host = data.to("cpu", memory_format=torch.contiguous_format, copy=True)
    reduce(host)
    data.copy_(host)
    return tensor


def _host_flat(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s elements as a contiguous 1-D CPU tensor (a view when it is one)."""
    return tensor.detach().to("cpu").contiguous().reshape(-1)


def _completed(result: Any) -> dist.Work:
    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _all_done(works: Sequence[dist.Work]) -> dist.Work:
    """A completed work, once each of ``works`` is waited for here (``Work.wait``
    releases the GIL while it waits)."""
    for work in works:
        work.wait()
    return _completed(None)
