"""The decision layer: which algorithm (INA, ring or tree) runs each collective.

``dynamiccl.model`` predicts times (alpha-beta, NCCL's form, plus what the topology
adds), ``dynamiccl.policy`` chooses (a pure function and an online learner),
``dynamiccl.fit`` calibrates a profile from measurements, ``dynamiccl.tuner`` exports
decisions as an NCCL tuner rule file and ``dynamiccl.cli`` is ``inalab decide``. The
names below are the ones a training job needs; nothing here imports torch or numpy.
Measurements and the network (a :class:`TopologySummary`) arrive as plain data: the
emulation and the bench hand them over (``emulation.topology.summary`` reads topology
files, ``emulation.bench.calibrate`` measures); nothing in dynamiccl imports them.
"""

from dynamiccl.model import DEFAULT_PROFILE, Profile, TopologySummary
from dynamiccl.policy import Decision, Policy, choose

__all__ = [
    "DEFAULT_PROFILE",
    "Decision",
    "Policy",
    "Profile",
    "TopologySummary",
    "choose",
]
