"""The worker side of inalab: wire protocol, quantization, transports, collectives.

Import what a worker needs from here; ``hostlib.protocol`` is the wire format shared
with the switches.
"""

from hostlib.ina import InaAllreduce, InaError, InaTimeoutError, JobSpec, RetryPolicy
from hostlib.session import InaSession

__all__ = [
    "InaAllreduce",
    "InaError",
    "InaSession",
    "InaTimeoutError",
    "JobSpec",
    "RetryPolicy",
]
