"""The exceptions of hostlib's collectives.

Layer: hostlib, the bottom floor (it imports nothing of ours). Every engine (INA and
point-to-point, Python and native), the sessions above them and the in-memory network
(``hostlib.transport.memory``) raise or catch these, so they live below all of them:
:class:`P2pError` is an :class:`InaError`, and a caller that catches ``InaError``
handles a failed collective of either kind. ``hostlib.ina`` and ``hostlib.p2p``
re-export them where they were defined before.
"""

from __future__ import annotations

__all__ = ["InaError", "InaTimeoutError", "P2pError", "P2pTimeoutError"]


class InaError(RuntimeError):
    """An INA collective could not complete."""


class InaTimeoutError(InaError):
    """The switch or a peer stopped answering for longer than the deadline."""


class P2pError(InaError):
    """A point-to-point collective could not complete (or peers disagree on the call)."""


class P2pTimeoutError(P2pError, InaTimeoutError):
    """A peer stopped answering for longer than the policy's deadline."""
