"""The PyTorch seam of dynamiccl: a ``torch.distributed`` backend named ``"ina"``.

``import dynamiccl.torch_backend`` registers the backend; then
``torch.distributed.init_process_group("ina", ...)`` builds an :class:`InaProcessGroup`.
Its SUM and AVG allreduce and reduce-scatter (``reduce_scatter_tensor``) and its
all-gather (``all_gather_into_tensor``) of int32/float32 tensors (CPU; CUDA staged through
host memory) run on hostlib: through the switch (:class:`~hostlib.session.InaSession`,
UDP) or host to host (:class:`~hostlib.peers.RingAllreduce`, ring or tree, over a UDP
socket of its own), as the :class:`Chooser` says; AVG is that SUM divided by the group's
size here, as Gloo divides its sum (so an integer AVG fails as Gloo's does, after the
sum). Every other call (MAX/MIN/PRODUCT, logged once per op; other dtypes; broadcast,
the list forms of allgather, barrier, ...) goes to a Gloo backend built from the same
store.

Gloo, and the GIL (issue #20): every collective of ``ProcessGroup`` is a method of
:class:`InaProcessGroup`, and what goes to Gloo is called through ``ProcessGroupGloo``'s
own bindings, which release the GIL; why, and what is not supported
(``torch.ops.c10d.*`` on this group from Python, ``dist.monitored_barrier``), is told in
:mod:`dynamiccl.torchbackend.group`.

Job setup (:func:`connect_session`), in one of two modes:

- rank 0 installs (``INALAB_P4RUNTIME`` set): each rank binds a UDP socket and writes its
  address to the c10d store; rank 0 reads them all, installs the job on the switch over
  P4Runtime (``controller.switch.SwitchController.add_job``) and writes the outcome and
  the switch's lanes per packet; the other ranks wait for that key; rank 0 removes the
  job at shutdown. With several aggregators (comma lists in ``INALAB_SWITCH`` and
  ``INALAB_P4RUNTIME``, or :attr:`InaOptions.stripes`) each rank binds a socket per
  aggregator, rank 0 installs the job on each, and calls are striped across them;
- installed already (``INALAB_P4RUNTIME`` absent or empty): a launcher that knows the
  network (``inalab emulate TOPOLOGY run``) installed the job for fixed addresses; each
  rank binds its own (``INALAB_BIND``, ``INALAB_PORT``), sends to its own switch
  (``INALAB_SWITCH``: under hierarchical aggregation its leaf) as the rank the job has
  there (``INALAB_SWITCH_RANK``), quantizes for ``INALAB_WORKERS`` contributions and
  packs ``INALAB_LANES`` lanes per packet; nothing is exchanged, installed or removed.

Over RDMA (``INALAB_TRANSPORT=rdma``, rank 0 installing): each rank opens an emulated RNIC
on its address, UDP 4791 (or ``INALAB_RDMA_DEVICE``'s verbs device), rank 0 installs the
job and its RoCEv2 queue pairs (``SwitchController.roce``), and INA calls are RDMA WRITEs
of ``INALAB_MSG_PACKETS`` packets (:mod:`dynamiccl.torchbackend.rdma`).

Configuration comes from ``pg_options=InaOptions(...)`` or, without it, from the
environment (:meth:`InaOptions.from_env`, the ``ENV_*`` names below).

What runs each call is the chooser's pick (:func:`resolve_action`): :class:`AlwaysIna`
by default, dynamiccl's :class:`~dynamiccl.policy.Policy` (``chooser=Policy(profile,
world_size)``, or ``INALAB_CHOOSER=dynamiccl`` with an optional ``INALAB_PROFILE`` from
``inalab calibrate``), or any object with ``choose(size_bytes)`` and optionally
``choose_call(collective, size_bytes)``. A name: ``"ina"`` through the switch; any other
name sends an allreduce to Gloo (so the policy's ``ring`` and ``tree`` mean Gloo's) and a
reduce-scatter or all-gather to hostlib's ring. A :class:`~dynamiccl.actions.Action`:
its algorithm with its lanes and window on hostlib. What cannot run here runs on
hostlib's ring with the action's lanes and window, with a warning logged once per kind:
CollNet without machines of several ranks, INA without switch slots, an algorithm that
does not run the collective (``all_gather`` is the ring's only). Nothing a chooser
returns fails the job.

Several ranks per machine (``torchrun --nproc-per-node P`` on several nodes), where rank
0 installs the job: the ranks say which machine they are on (:data:`ENV_HOST`, by
default :func:`host_key`) and, as NCCL's CollNet with SHARP, each machine's first rank
alone is a worker of the switch (:func:`connect_collnet`): an ``"ina"`` allreduce adds
the machine's ranks through shared memory (:mod:`hostlib.collnet`, the segment named in
the store), the heads add the machines' sums through the switch, and every rank copies
the result out; a reduce-scatter is that allreduce, each rank keeping its part. The
switch then carries one machine's traffic per head instead of P ranks'. Ring, tree and
Gloo calls still run between all ranks. ``INALAB_COLLNET=0`` keeps every rank a worker
of the switch.

Every rank must make the same sequence of calls with the same sizes and the same picks
(the session's slot sets and the ring's messages follow it), so a chooser must decide
from the collective and size alone, the same way on all ranks.

The code is in :mod:`dynamiccl.torchbackend`, one module per part (options, choosers,
exchange, gloo, rdma, session, collnet, group, tensors); this module, the backend's public
one, re-exports their names and, by importing the group, registers the backend. The
backend logs to the logger of this module's name, ``dynamiccl.torch_backend``.
"""

from __future__ import annotations

import logging

from dynamiccl.torchbackend.choosers import (
    AlwaysIna,
    Chooser,
    StaticChooser,
    choose_for,
    ina_action,
    resolve_action,
    uses_ina,
)
from dynamiccl.torchbackend.choosers import Warn as Warn
from dynamiccl.torchbackend.collnet import (
    CollNetMember,
    HostLayout,
    connect_collnet,
    host_key,
    host_layout,
)
from dynamiccl.torchbackend.exchange import Exchange, GroupExchange, StoreExchange
from dynamiccl.torchbackend.gloo import GLOO_COLLECTIVES, gloo_group, gloo_interface
from dynamiccl.torchbackend.group import BACKEND_NAME, InaProcessGroup, register_backend
from dynamiccl.torchbackend.options import (
    DEFAULT_CC_TARGET,
    DEFAULT_DEADLINE,
    ENV_AGENT_FROZEN,
    ENV_AGENT_SAVE,
    ENV_AGENT_STATE,
    ENV_AGENT_SYNC_EVERY,
    ENV_BIND,
    ENV_CC_TARGET,
    ENV_CHOOSER,
    ENV_COLLNET,
    ENV_COLLNET_BYTES,
    ENV_DEADLINE,
    ENV_DEVICE_ID,
    ENV_GLOO_IFNAME,
    ENV_HOST,
    ENV_JOB,
    ENV_LANES,
    ENV_MSG_PACKETS,
    ENV_P4RUNTIME,
    ENV_PORT,
    ENV_PROFILE,
    ENV_RDMA_DEVICE,
    ENV_RDMA_ICRC,
    ENV_SLOTS,
    ENV_SWITCH,
    ENV_SWITCH_RANK,
    ENV_TRANSPORT,
    ENV_WORKERS,
    Aggregator,
    InaOptions,
    InaSetupError,
    chooser_from_env,
    parse_addr,
)
from dynamiccl.torchbackend.options import DEFAULT_COLLNET_BYTES as DEFAULT_COLLNET_BYTES
from dynamiccl.torchbackend.session import connect_peers, connect_session, remove_job
from dynamiccl.torchbackend.tensors import INA_DTYPES as INA_DTYPES
from dynamiccl.torchbackend.tensors import ina_allreduce_

# Warn, DEFAULT_COLLNET_BYTES and INA_DTYPES were this module's names without a place in
# __all__: imported as themselves above, they stay importable from here, still unlisted.
__all__ = [
    "BACKEND_NAME",
    "DEFAULT_CC_TARGET",
    "DEFAULT_DEADLINE",
    "ENV_AGENT_FROZEN",
    "ENV_AGENT_SAVE",
    "ENV_AGENT_STATE",
    "ENV_AGENT_SYNC_EVERY",
    "ENV_BIND",
    "ENV_CC_TARGET",
    "ENV_CHOOSER",
    "ENV_COLLNET",
    "ENV_COLLNET_BYTES",
    "ENV_DEADLINE",
    "ENV_DEVICE_ID",
    "ENV_GLOO_IFNAME",
    "ENV_HOST",
    "ENV_JOB",
    "ENV_LANES",
    "ENV_MSG_PACKETS",
    "ENV_P4RUNTIME",
    "ENV_PORT",
    "ENV_PROFILE",
    "ENV_RDMA_DEVICE",
    "ENV_RDMA_ICRC",
    "ENV_SLOTS",
    "ENV_SWITCH",
    "ENV_SWITCH_RANK",
    "ENV_TRANSPORT",
    "ENV_WORKERS",
    "GLOO_COLLECTIVES",
    "Aggregator",
    "AlwaysIna",
    "Chooser",
    "CollNetMember",
    "Exchange",
    "GroupExchange",
    "HostLayout",
    "InaOptions",
    "InaProcessGroup",
    "InaSetupError",
    "StaticChooser",
    "StoreExchange",
    "choose_for",
    "chooser_from_env",
    "connect_collnet",
    "connect_peers",
    "connect_session",
    "gloo_group",
    "gloo_interface",
    "host_key",
    "host_layout",
    "ina_action",
    "ina_allreduce_",
    "parse_addr",
    "register_backend",
    "remove_job",
    "resolve_action",
    "uses_ina",
]

log = logging.getLogger(__name__)
