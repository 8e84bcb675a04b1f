"""The ``"ina"`` torch backend's process group (layer: dynamiccl; served by
:mod:`dynamiccl.torch_backend`).

Owns :class:`InaProcessGroup` (its collectives, what it hands Gloo, its shutdown) and the
backend's registration with ``torch.distributed`` (:func:`register_backend`, called when
this module is imported, so on ``import dynamiccl.torch_backend``).

Gloo, and the GIL (issue #20). A Gloo worker thread destroys each finished work while
it holds Gloo's work-queue lock, and destroying a work whose tensors belong to Python
objects takes the GIL; every Gloo collective takes that lock to enqueue. So a thread
that holds the GIL while it enqueues can deadlock with a worker. torch's C++ trampoline
for Python subclasses of ``ProcessGroup`` does exactly that for a collective the
subclass does not define: it takes the GIL to look for a Python method and, finding
none, calls the C++ base method, which dispatches to the registered Gloo backend, with
the GIL still held (a loop of list all-gathers hung within 50 calls). Hence:

- this class defines every collective of ``ProcessGroup`` (those the trampoline
  forwards, which C++ callers such as functional collectives reach, and the rest, which
  ``torch.distributed``'s functions call by name; :data:`GLOO_COLLECTIVES` are Gloo's
  alone), so none is left to the C++ base class; a test holds torch's list to this;
- whatever goes to Gloo goes through :meth:`InaProcessGroup._to_gloo`, which calls the
  ``ProcessGroupGloo`` object's own methods: their bindings release the GIL for the whole
  C++ call (``py::call_guard<py::gil_scoped_release>`` on every collective of c10d's
  ``Backend`` class), so the GIL is never held while Gloo's lock is awaited; waiting on
  the returned work releases it too (``Work.wait``);
- what runs on hostlib runs to the end in the calling thread (its waits are socket
  waits, which release the GIL) and returns a work completed already, so nothing waits
  on another thread for it.

A Gloo thread may still wait for the GIL, but never while the thread holding the GIL
waits for that Gloo thread: no cycle remains. Gloo is also registered as the group's
CPU (and CUDA) backend, for torch code that asks the group for it (``_get_backend``);
calling c10d's dispatcher ops (``torch.ops.c10d.*``) on this group directly from Python
would reach it with the GIL held, and is not supported (``torch.distributed`` and its
functional collectives go through the methods above). ``dist.monitored_barrier`` refuses
every backend not named "gloo" before it reaches a group: call the group's own
``monitored_barrier`` (Gloo's).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist

from dynamiccl.actions import Action
from dynamiccl.learning import AgreedLearner
from dynamiccl.torchbackend.choosers import Chooser, choose_for, resolve_action
from dynamiccl.torchbackend.collnet import CollNetMember, connect_collnet, host_layout
from dynamiccl.torchbackend.exchange import StoreExchange
from dynamiccl.torchbackend.gloo import _given, gloo_group
from dynamiccl.torchbackend.options import InaOptions, InaSetupError
from dynamiccl.torchbackend.session import connect_peers, connect_session, remove_job
from dynamiccl.torchbackend.tensors import (
    _all_done,
    _carried,
    _completed,
    _host_flat,
    _in_place,
    _nbytes,
)
from hostlib.communicator import Communicator
from hostlib.ina import InaError
from hostlib.session import InaSession, StripedInaSession, part_bounds

__all__ = ["BACKEND_NAME", "InaProcessGroup", "register_backend"]

log = logging.getLogger("dynamiccl.torch_backend")
"""The backend's one logger, by the name of its public module (users and tests capture
it so), whichever of the package's modules logs."""

BACKEND_NAME = "ina"


def _kind(op: Any) -> Any:
    """The ``RedOpType`` of a ``ReduceOp`` (or of a ``RedOpType``), which compares with
    ``dist.ReduceOp.SUM`` and the like whichever side it is on."""
    return getattr(op, "op", op)


def _gloo_collective(name: str) -> Callable[..., Any]:
    """A method of :class:`InaProcessGroup` that runs Gloo's ``name`` with the
    arguments it is given (see :meth:`InaProcessGroup._to_gloo`)."""

    def collective(self: InaProcessGroup, *args: Any, **kwargs: Any) -> Any:
        return self._to_gloo(name, *args, **kwargs)

    collective.__name__ = collective.__qualname__ = name
    collective.__doc__ = f"Gloo's ``{name}``, with its arguments; its work (if any)."
    return collective


class InaProcessGroup(dist.ProcessGroup):
    """A process group whose SUM and AVG allreduce and reduce-scatter and whose all-gather
    of int32/float32 tensors run on hostlib (the switch, or host to host); everything
    else is Gloo's (created from ``store``), called so that the GIL is not held while
    Gloo's threads are waited for (see the module docstring).

    Built by ``init_process_group("ina")`` (see :func:`register_backend`); construct it
    directly only for a group of your own (every rank at once: it sets up the job).

    Attributes:
        session: this rank's INA session; ``None`` on a CollNet rank that is not its
            machine's head (the head's is in :attr:`collnet` too).
        collnet: this rank's CollNet membership where machines have several ranks
            (:class:`CollNetMember`), else ``None``: then every ``"ina"`` allreduce and
            reduce-scatter is CollNet's (the machine's ranks add in shared memory, the
            heads through the switch).
        peers: this rank's host-to-host session (ring and tree), by default with the
            switch's packet width and the job's slots as its window.

    Raises:
        InaSetupError: the job could not be set up.
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        timeout: timedelta,
        options: InaOptions,
    ) -> None:
        # torch 2.13 rejects the (store, rank, size) constructor for Python subclasses.
        super().__init__(rank, world_size)  # type: ignore[call-arg]
        self.options = options
        self._store = store
        # Any: the stubs omit the collectives of ProcessGroupGloo (a c10d Backend).
        self._gloo: Any = gloo_group(dist.PrefixStore("gloo/", store), rank, world_size, timeout)
        # For torch code that asks the group for its backend; the collectives themselves
        # are all methods of this class (see the module docstring).
        gloo_type = dist.ProcessGroup.BackendType.GLOO
        self._register_backend(torch.device("cpu"), gloo_type, self._gloo)
        if torch.cuda.is_available():
            self._register_backend(torch.device("cuda"), gloo_type, self._gloo)
        prefix = f"ina/job{options.job_id}"
        self.collnet: CollNetMember | None = None
        self.session: InaSession | StripedInaSession | None
        layout = None
        if options.collnet and not options.installed:
            layout = host_layout(options, StoreExchange(store, rank, world_size, f"{prefix}/hosts"))
        if layout is not None and layout.collnet:
            self.collnet = connect_collnet(options, store, rank, layout, timeout)
            self.session = self.collnet.session
            self._lanes, self._slots = self.collnet.lanes, self.collnet.slots
            if rank == 0:
                log.info("ina job %d: CollNet on %s", options.job_id, layout)
        else:
            exchange = StoreExchange(store, rank, world_size, prefix)
            self.session = connect_session(options, exchange, timeout)
            self._lanes, self._slots = self.session.spec.lanes, self.session.spec.slots
        try:
            exchange = StoreExchange(store, rank, world_size, f"{prefix}/peers")
            self.peers = connect_peers(options, exchange, self._lanes, self._slots, timeout)
        except BaseException:
            self._close_ina()
            raise
        # Every action of every collective that runs on hostlib, mapped onto the wire in
        # hostlib's one place (the tree on the ring's socket). Under CollNet the switch
        # is reached only through the machine's group.
        ina = None if self.collnet is not None else self.session
        group = None if self.collnet is None else self.collnet.allreduce
        self.comm = Communicator(rank, world_size, ina=ina, ring=self.peers, collnet=group)
        self._chooser: Chooser = options.chooser
        self._bound: list[Chooser] = []
        self._bind(options.chooser)
        self.last_action: Action | None = None
        """The action the last call carried on hostlib ran (``None`` before any)."""
        self._closed = False
        self._warned: set[str] = set()
        self._coalesced: list[dist.Work] | None = None  # between start/end_coalescing

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # ------------------------------------------------------------------ choosing
    def use_chooser(self, chooser: Chooser) -> None:
        """Let ``chooser`` decide from the next call on (e.g. strategies taking turns in
        one job, as ``examples/train_mixed.py`` runs them).

        Every rank must call it between the same two calls, with choosers that decide
        alike: a choice must be the same on every rank. A learning chooser is bound to
        the job's switch the first time it is used; the times it has not agreed on yet
        wait for its next turn (its agreements still come at the same call on every
        rank, since every rank counts the same calls)."""
        self._bind(chooser)
        self._chooser = chooser

    def _bind(self, chooser: Chooser) -> None:
        """A learning chooser's actions need the switch's lanes and the job's slots: give
        them to it, once."""
        bind = getattr(chooser, "bind", None)
        if callable(bind) and not any(c is chooser for c in self._bound):
            bind(self._lanes, self._slots)
            self._bound.append(chooser)

    def _plan(self, collective: str, size_bytes: int) -> Action | None:
        """What runs this call (``None``: Gloo), from the chooser."""
        self.last_action = None  # until the call runs on hostlib
        choice = choose_for(self._chooser, collective, size_bytes)
        peers = self.peers.spec
        return resolve_action(
            choice,
            collective,
            switch_lanes=self._lanes,
            slots=self._slots,
            lanes=peers.lanes,
            window=peers.window,
            warn=self._warn_once,
            collnet=self.collnet is not None,
        )

    def _on_wire(self, action: Action) -> Action:
        """What runs ``action``: under CollNet, an INA action is CollNet's (the switch
        knows the machines' heads alone)."""
        if self.collnet is not None and action.algorithm == "ina":
            return Action("collnet", action.lanes, action.window)
        return action

    def _observed(self, collective: str, size_bytes: int, action: Action, start: float) -> None:
        """Record the call's action as :attr:`last_action`; tell a learning chooser
        (``dynamiccl.learning.AgreedLearner``) the call's time if it ran as chosen; when
        an agreement is due (at the same call on every rank), agree on the times with the
        other ranks."""
        self.last_action = self._on_wire(action)
        learner = self._chooser
        if not isinstance(learner, AgreedLearner) or learner.agent is None:
            return
        if action not in learner.agent.actions.get(collective, ()):
            return  # a fallback ran (the same on every rank): nothing to learn of the choice
        learner.observe(collective, size_bytes, action, time.perf_counter() - start)
        if learner.due:
            learner.agree(self._agree_max)

    def _agree_max(self, values: Sequence[float]) -> list[float]:
        """The elementwise maximum of ``values`` over the group's ranks (a Gloo allreduce,
        its binding releasing the GIL while Gloo's threads run)."""
        agreed = torch.tensor(list(values), dtype=torch.float64)
        opts: Any = dist.AllreduceOptions()  # Any: the stubs type reduceOp narrowly
        opts.reduceOp = dist.ReduceOp.MAX
        self._gloo.allreduce([agreed], opts).wait()
        return [float(v) for v in agreed.tolist()]

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("ina backend: %s (logged once)", message)

    def _note_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.info("ina backend: %s (logged once)", message)

    def _check_open(self) -> None:
        if self._closed:
            raise InaError("the ina process group is shut down")

    # ------------------------------------------------------------------ collectives
    def allreduce(  # type: ignore[override]  # what the C++ trampoline passes
        self, tensors: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        """SUM or AVG of non-empty int32/float32 tensors as the chooser says; anything
        else, and a call the chooser sends to Gloo, through Gloo."""
        if opts is None:
            opts = dist.AllreduceOptions()
        work = self._allreduce_on_hostlib(tensors, opts.reduceOp)
        return self._to_gloo("allreduce", tensors, opts) if work is None else work

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        """:meth:`allreduce` of several tensors at once (``all_reduce_coalesced``, and
        ``_coalescing_manager`` of allreduces)."""
        if opts is None:
            opts = dist.AllreduceCoalescedOptions()
        work = self._allreduce_on_hostlib(tensors, opts.reduceOp)
        return self._to_gloo("allreduce_coalesced", tensors, opts) if work is None else work

    def _allreduce_on_hostlib(self, tensors: list[torch.Tensor], op: Any) -> dist.Work | None:
        """Run a SUM or AVG allreduce of ``tensors`` on hostlib as the chooser says and
        return its completed work; ``None``: it is Gloo's to run."""
        if not all(_carried(t) and t.numel() for t in tensors) or not self._adds(op):
            return None
        actions = [self._plan("allreduce", _nbytes(t)) for t in tensors]
        if any(a is None for a in actions):
            return None
        self._check_open()
        for tensor, action in zip(tensors, actions, strict=True):
            start = time.perf_counter()
            self._allreduce_(tensor, cast(Action, action))
            self._observed("allreduce", _nbytes(tensor), cast(Action, action), start)
        if _kind(op) == dist.ReduceOp.AVG:
            self._average(tensors)
        return _completed(tensors)

    def _allreduce_(self, tensor: torch.Tensor, action: Action) -> None:
        wire = self._on_wire(action)
        _in_place(tensor, lambda host: self.comm.allreduce(host, wire, inplace=True))

    def _adds(self, op: Any) -> bool:
        """Whether reduce op ``op`` runs on hostlib (SUM, AVG); the others run on Gloo, as
        logged once per op."""
        kind = _kind(op)
        if kind in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            return True
        name = getattr(kind, "name", str(kind))
        self._note_once(f"op/{name}", f"{name} runs on Gloo: the switch and hostlib only add")
        return False

    def _average(self, tensors: Sequence[torch.Tensor]) -> None:
        """Divide sums by the group's size in place, as Gloo's AVG does after its sum; on
        an integer tensor that raises torch's RuntimeError (the sum stays), as Gloo's
        does (there when the work is waited for)."""
        for tensor in tensors:
            tensor.detach().div_(self.size())

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> dist.Work:
        """``reduce_scatter_tensor``: rank ``r`` of ``n`` gets elements ``r * k`` to
        ``(r + 1) * k`` of the SUM (or AVG) of every rank's ``n * k``-element input,
        through the switch (an INA allreduce of which it keeps its part) or hostlib's
        ring. Other ops, dtypes or sizes go to Gloo."""
        if opts is None:
            opts = dist.ReduceScatterOptions()
        k = output.numel()
        if not (
            _carried(input)
            and output.dtype == input.dtype
            and k > 0
            and input.numel() == self.size() * k
            and self._adds(opts.reduceOp)
        ):
            return self._to_gloo("_reduce_scatter_base", output, input, opts)
        action = self._plan("reduce_scatter", _nbytes(input))
        self._check_open()
        if action is None or action.algorithm != "ina":
            action = self._ring(action)
        start = time.perf_counter()
        wire = self._on_wire(action)
        if wire.algorithm == "collnet":
            # CollNet's allreduce, of which this rank keeps its part.
            total = self.comm.allreduce(_host_flat(input), wire)
            lo, hi = part_bounds(total.numel(), self.size(), self.rank())
            part = total[lo:hi]
        else:
            part = self.comm.reduce_scatter(_host_flat(input), action)
        output.detach().copy_(part.reshape(output.shape))
        self._observed("reduce_scatter", _nbytes(input), action, start)
        if _kind(opts.reduceOp) == dist.ReduceOp.AVG:
            self._average([output])
        return _completed([output])

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> dist.Work:
        """``all_gather_into_tensor``: every rank's ``k``-element input, in rank order, in
        every rank's ``n * k``-element output, over hostlib's ring. Other dtypes or sizes
        go to Gloo."""
        k = input.numel()
        if not (
            _carried(input) and output.dtype == input.dtype and k > 0
            and output.numel() == self.size() * k
        ):  # fmt: skip
            return self._to_gloo("_allgather_base", output, input, *_given(opts))
        action = self._ring(self._plan("all_gather", _nbytes(output)))
        self._check_open()
        start = time.perf_counter()
        full = self.comm.all_gather(_host_flat(input), action)
        output.detach().copy_(full.reshape(output.shape))
        self._observed("all_gather", _nbytes(output), action, start)
        return _completed([output])

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        """:meth:`all_gather_single` of each pair (``_coalescing_manager`` of
        ``all_gather_into_tensor``); done when it returns."""
        pairs = zip(outputs, inputs, strict=True)
        return _all_done([self.all_gather_single(o, i, opts) for o, i in pairs])

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        """:meth:`reduce_scatter_single` of each pair (``_coalescing_manager`` of
        ``reduce_scatter_tensor``); done when it returns."""
        pairs = zip(outputs, inputs, strict=True)
        return _all_done([self.reduce_scatter_single(o, i, opts) for o, i in pairs])

    # The names torch before 2.13 calls, deprecated there: the same collectives.
    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]  # arg names
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def _ring(self, action: Action | None) -> Action:
        """The ring with ``action``'s packet width and window (``None``: the defaults)."""
        if action is None:
            return Action("ring", self.peers.spec.lanes, self.peers.spec.window)
        return Action("ring", action.lanes, action.window)

    # ------------------------------------------------------------------ Gloo's alone
    # Each a method of this class, so that no call reaches Gloo through the C++ base
    # class with the GIL held (see the module docstring); the arguments are Gloo's.
    allgather = _gloo_collective("allgather")
    allgather_coalesced = _gloo_collective("allgather_coalesced")
    alltoall = _gloo_collective("alltoall")
    all_to_all_single = _gloo_collective("alltoall_base")
    alltoall_base = all_to_all_single
    barrier = _gloo_collective("barrier")
    broadcast = _gloo_collective("broadcast")
    gather = _gloo_collective("gather")
    monitored_barrier = _gloo_collective("monitored_barrier")
    recv = _gloo_collective("recv")
    recv_anysource = _gloo_collective("recv_anysource")
    reduce = _gloo_collective("reduce")
    reduce_scatter = _gloo_collective("reduce_scatter")
    scatter = _gloo_collective("scatter")
    send = _gloo_collective("send")

    def _to_gloo(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Gloo's collective ``name`` (a method of ``ProcessGroupGloo``): its binding
        releases the GIL for the whole call, Gloo's enqueue included."""
        work = getattr(self._gloo, name)(*args, **kwargs)
        if self._coalesced is not None and work is not None:
            self._coalesced.append(work)
        return work

    def start_coalescing(self, device: Any = None) -> None:
        """``_coalescing_manager(group, device)`` begins: every call still runs when it
        is issued; :meth:`end_coalescing` waits for the works of those Gloo runs."""
        self._coalesced = []

    def end_coalescing(self, device: Any = None) -> dist.Work:
        """The coalesced calls' work, done when it returns (``Work.wait`` releases the
        GIL while it waits)."""
        works, self._coalesced = self._coalesced or [], None
        return _all_done(works)

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    # ------------------------------------------------------------------ teardown
    def shutdown(self) -> None:
        """Close the sessions; rank 0 removes the job once every rank has shut down, or
        after waiting a few seconds for them (a rank may be dead)."""
        if self._closed:
            return
        self._closed = True
        learner = self._chooser
        if isinstance(learner, AgreedLearner) and self.rank() == 0:
            try:  # every rank's agent holds the same state: rank 0 writes it
                learner.save()
            except OSError as exc:
                log.warning("ina backend: agent state not saved: %s", exc)
        self._close_ina()
        # A peer whose last ack from us was lost needs us a little longer, if any call ran.
        self.peers.close(linger=0.0 if self.peers.endpoint.call == 0 else None)
        if not self.options.remove_on_shutdown or self.options.installed:
            return
        key = f"ina/job{self.options.job_id}/closed"
        try:
            self._store.add(key, 1)
            if self.rank() == 0:
                self._wait_for_count(key, self.size())
        except (RuntimeError, InaSetupError) as exc:  # c10d store errors are RuntimeErrors
            log.warning("ina job %d: not every rank shut down: %s", self.options.job_id, exc)
        # Rank 0 removes the job even then: a rank that has not shut down by now is dead
        # or stuck (issue #20: a rank killed), and nobody else would remove it; a late
        # rank's packets are dropped by the switch as an unknown job's.
        if self.rank() == 0:
            remove_job(self.options)

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            if self.collnet is not None:
                self.collnet.abort()
            else:
                self._close_ina()
            self.peers.close(linger=0.0)

    def _close_ina(self) -> None:
        """Close the INA session, or this rank's CollNet membership (its session too)."""
        if self.collnet is not None:
            self.collnet.close()
        elif self.session is not None:
            self.session.close()

    def _wait_for_count(self, key: str, count: int, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while self._store.add(key, 0) < count:
            if time.monotonic() > deadline:
                raise InaSetupError(f"only some ranks shut down within {seconds:.0f}s")
            time.sleep(0.01)


def _create(backend_opts: Any, pg_options: Any) -> InaProcessGroup:
    """``init_process_group``'s factory (extended API): ``pg_options`` or the environment."""
    options = pg_options if pg_options is not None else InaOptions.from_env()
    if not isinstance(options, InaOptions):
        raise TypeError(f"pg_options of the ina backend must be InaOptions, not {options!r}")
    return InaProcessGroup(
        backend_opts.store,
        backend_opts.group_rank,
        backend_opts.group_size,
        backend_opts.timeout,
        options,
    )


def register_backend(devices: Sequence[str] = ("cpu", "cuda")) -> None:
    """Register ``"ina"`` with ``torch.distributed`` (done on import; idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=list(devices))


register_backend()
