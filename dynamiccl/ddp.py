"""The DDP communication hook of dynamiccl: gradient buckets averaged through INA.

``model.register_comm_hook(state, ina_allreduce_hook)`` makes DDP sum each gradient
bucket through the state's :class:`~hostlib.session.InaSession` and divide by the world
size, as DDP's default allreduce hook does. The hook does INA itself, so the model's
process group may be plain Gloo; a bucket the chooser sends elsewhere (or a dtype INA
does not carry) goes to ``dist.all_reduce`` on the state's group.

Every rank must register the hook with a state of the same job: DDP launches buckets in
the same order on all ranks, which is the order the session's slot sets rely on.
"""

# No ``from __future__ import annotations``: DDP's register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] as objects, not as strings.
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Self

import torch
import torch.distributed as dist

from dynamiccl.torch_backend import (
    AlwaysIna,
    Chooser,
    GroupExchange,
    InaOptions,
    InaProcessGroup,
    InaSetupError,
    connect_session,
    ina_action,
    ina_allreduce_,
    remove_job,
)
from hostlib.session import InaSession, StripedInaSession

__all__ = ["InaHookState", "ina_allreduce_hook"]


@dataclass
class InaHookState:
    """What :func:`ina_allreduce_hook` needs: the session, the chooser and the fallback.

    Attributes:
        session: this rank's INA session of the job.
        world_size: ranks in the job (the divisor of the average).
        chooser: INA (an "ina" name or Action) or the fallback, per bucket size; the
            same on every rank.
        group: the fallback's process group (``None``: the default group).
        options: the job's options if this state set the job up (then :meth:`close`
            tears it down), else ``None``.
        ina_buckets: buckets reduced through the switch so far.
        fallback_buckets: buckets reduced by ``dist.all_reduce`` so far.
    """

    session: InaSession | StripedInaSession
    world_size: int
    chooser: Chooser = field(default_factory=AlwaysIna)
    group: dist.ProcessGroup | None = None
    options: InaOptions | None = None
    ina_buckets: int = 0
    fallback_buckets: int = 0

    @classmethod
    def connect(
        cls,
        options: InaOptions,
        group: dist.ProcessGroup | None = None,
        timeout: timedelta = timedelta(minutes=5),
    ) -> Self:
        """Set up the job of ``options`` over ``group`` (collective: every rank calls it).

        Args:
            options: the switch and job; its chooser becomes the state's.
            group: an initialized process group (any backend); ``None``: the default.
            timeout: bounds the no-progress deadline if ``options.deadline`` is unset
                (:meth:`~dynamiccl.torch_backend.InaOptions.no_progress_deadline`).

        Raises:
            InaSetupError: the job could not be installed.
        """
        session = connect_session(options, GroupExchange(group), timeout)
        world_size = dist.get_world_size(group)
        return cls(session, world_size, options.chooser, group, options)

    @classmethod
    def from_process_group(cls, group: InaProcessGroup) -> Self:
        """Share the session and chooser of an ``"ina"`` process group (not owned).

        Raises:
            InaSetupError: the group runs CollNet (machines of several ranks): its ranks
                have no session of their own; DDP through the group's own allreduce
                (no hook) goes through the switch already.
        """
        if group.session is None or group.collnet is not None:
            raise InaSetupError(
                "the ina group runs CollNet (machines of several ranks), so its ranks have "
                "no INA session of their own: use DDP without this hook (the group's "
                "allreduce goes through the switch), or INALAB_COLLNET=0"
            )
        return cls(group.session, group.size(), group.options.chooser, group)

    def close(self) -> None:
        """Close the session if this state set it up; rank 0 then removes the job.
        Collective: every rank calls it (a barrier on the group comes first)."""
        if self.options is None:
            return
        dist.barrier(group=self.group)
        self.session.close()
        if self.options.remove_on_shutdown and dist.get_rank(self.group) == 0:
            remove_job(self.options)
        self.options = None


def ina_allreduce_hook(
    state: InaHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s gradients over all ranks, through the switch if the chooser
    says ``"ina"`` or an INA :class:`~dynamiccl.actions.Action` (then with its window,
    within the job's slots); any other answer goes to ``dist.all_reduce``.

    Returns:
        A future of the averaged bucket buffer (completed already for INA).

    Raises:
        ValueError: NaN or infinity in the gradients (INA cannot quantize them).
        InaError: the switch or a peer stopped answering.
    """
    buffer = bucket.buffer()
    action = ina_action(buffer, state.chooser, state.session.spec)
    if action is not None:
        ina_allreduce_(state.session, buffer, window=action.window)
        buffer.div_(state.world_size)
        state.ina_buckets += 1
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(buffer)
        return future
    state.fallback_buckets += 1
    world_size = state.world_size
    work = dist.all_reduce(buffer, group=state.group, async_op=True)
    if work is None:  # async_op=True returns a Work; None would mean a non-member rank
        raise RuntimeError("this rank is not in the hook's process group")

    def average(done: torch.futures.Future[Any]) -> torch.Tensor:
        return done.value()[0].div_(world_size)

    return work.get_future().then(average)
