"""The cost model of the decision layer: predicted seconds of one collective per algorithm.

Pure arithmetic on a :class:`Profile` (calibrated alpha/beta numbers, JSON on disk) and a
:class:`TopologySummary` (what the network adds: link bandwidth, delay, contention at
switch-to-switch links, loss, whether the switch can aggregate). Nothing here measures,
imports torch or touches a socket.

The form is NCCL's (``src/graph/tuning.cc``): ``time = steps * alpha + bytes * beta``
with, for an allreduce of ``S`` bytes over ``n`` workers,

- ``ring``: ``2(n-1)`` steps, each ``alpha + (S/n) * beta`` (reduce-scatter then
  allgather; every worker moves ``2(n-1)S/n`` bytes each way);
- ``tree``: ``2 * ceil(log2 n)`` steps (up then down a binary tree, pipelined) and
  ``TREE_BYTE_FACTOR * S`` bytes: NCCL's double binary tree makes each rank an inner node
  (two children) in one tree and a leaf in the other, each tree carries half the data,
  so a rank's link carries ``3S/2 + S/2 = 2S`` each way; NCCL writes the same as
  ``algBw = busBw * 0.5`` for Tree;
- ``ina``: one step (up to the switch and back) and ``S`` bytes each way, independent of
  ``n``, but never faster than the switch absorbs contributions (``fan_in * S /
  switch_rate``, ``fan_in`` the most contributions one aggregating switch sums), than the
  window allows (``slots`` packets of ``packet_bytes`` per round trip ``alpha``), and
  unavailable (infinite cost) without slots, with more than :data:`MAX_WORKERS` workers,
  or when no switch can aggregate for the job.

The network is a floor under the software: the per-byte time is the larger of the
profile's ``beta`` (what the hosts and switch manage, e.g. on loopback) and the wire's
(the slowest worker link, multiplied by how many streams of the algorithm share the
worst switch-to-switch link); each step also pays the round trip between a worker and
the job's switch (``2 * delay``). Loss ``p`` (the profile's and the worst path's) makes
every byte cost ``1/(1-p)`` and each lost packet of a window stall for a timeout.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from hostlib.protocol import MAX_WORKERS

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "DEFAULT_PROFILE",
    "PROFILE_SCHEMA",
    "SUMMARY_SCHEMA",
    "TREE_BYTE_FACTOR",
    "AlgoParams",
    "Estimate",
    "MeasuredLinks",
    "Profile",
    "ProfileError",
    "SummaryError",
    "TopologySummary",
    "byte_coefficient",
    "estimate",
    "estimate_all",
    "read_json",
    "steps",
]

ALGORITHMS = ("ina", "ring", "tree")
"""The algorithms the model knows, in the order they are reported."""

COLLECTIVES = ("allreduce",)
"""Collectives the model covers: the one INA accelerates (the switch only sums)."""

TREE_BYTE_FACTOR = 2.0
"""Bytes a tree rank moves each way per byte of the message (see the module docstring)."""

PROFILE_SCHEMA = 1
"""Version of the profile JSON; :meth:`Profile.load` refuses any other."""

SUMMARY_SCHEMA = 1
"""Version of the topology summary JSON; :meth:`TopologySummary.load` refuses any other."""


class ProfileError(ValueError):
    """A profile that cannot be read or has invalid numbers; the message says where."""


class SummaryError(ValueError):
    """A topology summary that cannot be read or has invalid values; the message says where."""


@dataclass(frozen=True)
class AlgoParams:
    """One algorithm's calibrated constants.

    Attributes:
        alpha: seconds per step (software and protocol latency of one exchange).
        beta: seconds per byte each worker moves (1 / the achieved bytes/s).
    """

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ProfileError(f"{name} must be a finite number >= 0, got {value!r}")

    @property
    def bandwidth(self) -> float:
        """Bytes per second, 1/beta (infinite when beta is 0)."""
        return math.inf if self.beta == 0 else 1.0 / self.beta


@dataclass(frozen=True)
class MeasuredLinks:
    """The emulated links a profile was calibrated across (``inalab emulate TOPOLOGY
    calibrate``), as applied: after ``--bw``, ``--delay``, ``--link-loss``, ``--jitter``.

    Their bandwidth, delay and loss are inside the profile's alpha and beta, so a
    decision with the profile already pays them. The bench records them from the
    topology it emulated (``emulation.topology.summary.measured_links``).

    Attributes:
        topology: the topology's name.
        job: the job whose ranks were measured (None: all hosts, a topology without jobs).
        bw_mbit: the slowest shaped link on the job's paths, Mbit/s (None: unshaped).
        delay_ms: the worst worker's one-way delay to the job's switch, ms.
        loss: the worst worker path's loss probability, each way.
        jitter_ms: the largest delay jitter on those paths, ms.
    """

    topology: str
    job: int | None
    bw_mbit: float | None
    delay_ms: float
    loss: float
    jitter_ms: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.topology, str):
            raise ProfileError(f"links.topology must be a name, got {self.topology!r}")
        if self.job is not None and (isinstance(self.job, bool) or not isinstance(self.job, int)):
            raise ProfileError(f"links.job must be a job id or null, got {self.job!r}")
        numbers = {"delay_ms": self.delay_ms, "loss": self.loss, "jitter_ms": self.jitter_ms}
        if self.bw_mbit is not None:
            numbers["bw_mbit"] = self.bw_mbit
        for name, value in numbers.items():
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not (ok and math.isfinite(value) and value >= 0):
                raise ProfileError(f"links.{name} must be a finite number >= 0, got {value!r}")
        if self.bw_mbit is not None and self.bw_mbit <= 0:
            raise ProfileError(f"links.bw_mbit must be positive, got {self.bw_mbit!r}")
        if self.loss >= 1:
            raise ProfileError(f"links.loss must be in [0, 1), got {self.loss!r}")

    @property
    def where(self) -> str:
        """``star4 job 1``: the network and job measured."""
        return self.topology + (f" job {self.job}" if self.job is not None else "")

    def describe(self) -> str:
        """The links for a person, e.g. ``100 Mbit/s, 2 ms one way, loss 0``."""
        bw = "unshaped" if self.bw_mbit is None else f"{self.bw_mbit:g} Mbit/s"
        jitter = f" (jitter {self.jitter_ms:g} ms)" if self.jitter_ms else ""
        return f"{bw}, {self.delay_ms:g} ms one way{jitter}, loss {self.loss:g}"

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> MeasuredLinks:
        """Read the ``links`` object of a profile.

        Raises:
            ProfileError: not an object, missing or unknown keys, bad numbers.
        """
        names = [f.name for f in fields(cls)]
        required = set(names) - {"jitter_ms"}
        if not isinstance(doc, Mapping) or not required <= set(doc) <= set(names):
            raise ProfileError(f"{where}: 'links' must have the keys {', '.join(names)}")
        try:
            return cls(**doc)
        except ProfileError as exc:
            raise ProfileError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class Profile:
    """The model's parameters: per-algorithm alpha/beta and the INA switch's limits.

    Attributes:
        ina, ring, tree: each algorithm's :class:`AlgoParams`.
        switch_rate: contribution bytes per second one aggregating switch absorbs.
        loss: packet loss probability the calibration did not see (added to the path's).
        timeout: seconds a lost packet stalls its window slot (one retransmission timeout).
        packet_bytes: payload bytes per packet (how many packets a message is).
        window: packets a worker keeps in flight (how many losses overlap).
        source: where the numbers come from, shown with every decision.
        links: the emulated links the numbers were measured across (None: loopback, or
            not recorded); the JSON omits the key when None.
        workers: the worker counts the numbers were measured with, ascending (None: not
            recorded, as in profiles of older inalab versions); the JSON omits the key
            when None. The ranks of a calibration share the machine's cores, so the
            numbers hold for these counts; ``inalab decide`` warns for others.
    """

    ina: AlgoParams
    ring: AlgoParams
    tree: AlgoParams
    switch_rate: float
    loss: float = 0.0
    timeout: float = 0.02
    packet_bytes: int = 8192
    window: int = 32
    source: str = "unspecified"
    links: MeasuredLinks | None = None
    workers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.links is not None and not isinstance(self.links, MeasuredLinks):
            raise ProfileError(f"links must be MeasuredLinks or None, got {self.links!r}")
        if not (math.isfinite(self.switch_rate) and self.switch_rate > 0):
            raise ProfileError(f"switch_rate must be positive, got {self.switch_rate!r}")
        if not 0.0 <= self.loss < 1.0:
            raise ProfileError(f"loss must be in [0, 1), got {self.loss!r}")
        if not (math.isfinite(self.timeout) and self.timeout >= 0):
            raise ProfileError(f"timeout must be >= 0, got {self.timeout!r}")
        for name in ("packet_bytes", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProfileError(f"{name} must be a positive integer, got {value!r}")
        if self.workers is not None and (
            not isinstance(self.workers, tuple)
            or not self.workers
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.workers)
            or list(self.workers) != sorted(set(self.workers))
        ):
            raise ProfileError(f"workers must be ascending positive integers, got {self.workers!r}")

    def params(self, algorithm: str) -> AlgoParams:
        """The constants of ``algorithm``.

        Raises:
            ValueError: not one of :data:`ALGORITHMS`.
        """
        _check_algorithm(algorithm)
        params: AlgoParams = getattr(self, algorithm)
        return params

    def with_params(self, algorithm: str, params: AlgoParams) -> Profile:
        """A copy with ``algorithm``'s constants replaced."""
        _check_algorithm(algorithm)
        ina, ring, tree = (params if a == algorithm else self.params(a) for a in ALGORITHMS)
        return replace(self, ina=ina, ring=ring, tree=tree)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document :meth:`save` writes."""
        doc = asdict(self)
        algos = {a: doc.pop(a) for a in ALGORITHMS}
        for key in ("links", "workers"):
            if doc[key] is None:
                del doc[key]  # such a profile stays readable by older inalab versions
        return {"schema": PROFILE_SCHEMA, "algorithms": algos, **doc}

    @classmethod
    def from_dict(cls, doc: Any, where: str = "profile") -> Profile:
        """Build a profile from :meth:`to_dict`'s document.

        Raises:
            ProfileError: wrong schema version, missing or unknown keys, bad numbers.
        """
        if not isinstance(doc, Mapping):
            raise ProfileError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        if doc.get("schema") != PROFILE_SCHEMA:
            raise ProfileError(
                f"{where}: schema {doc.get('schema')!r} is not {PROFILE_SCHEMA} "
                "(a profile written by another inalab version?)"
            )
        scalars = {f.name for f in fields(cls)} - set(ALGORITHMS)
        unknown = sorted(set(doc) - scalars - {"schema", "algorithms"})
        if unknown:
            raise ProfileError(f"{where}: unknown key(s) {', '.join(unknown)}")
        algos = doc.get("algorithms")
        if not isinstance(algos, Mapping) or set(algos) != set(ALGORITHMS):
            raise ProfileError(f"{where}: 'algorithms' must map each of {', '.join(ALGORITHMS)}")
        if "switch_rate" not in doc:
            raise ProfileError(f"{where}: missing key 'switch_rate'")
        ina, ring, tree = (_algo_params(algos[a], f"{where}: algorithms.{a}") for a in ALGORITHMS)
        values = {k: doc[k] for k in scalars if k in doc}
        if values.get("links") is not None:
            values["links"] = MeasuredLinks.from_dict(values["links"], where)
        if isinstance(values.get("workers"), list):
            values["workers"] = tuple(values["workers"])
        try:
            return cls(ina, ring, tree, **values)
        except (ProfileError, TypeError) as exc:
            raise ProfileError(f"{where}: {exc}") from None

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON (see :meth:`to_dict`).

        Raises:
            OSError: the file cannot be written.
        """
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """Read a profile written by :meth:`save`.

        Raises:
            ProfileError: the file cannot be read, is not JSON or not a valid profile.
        """
        return cls.from_dict(read_json(path, "profile", ProfileError), where=str(path))


def read_json(path: str | Path, what: str, error: type[ValueError]) -> Any:
    """The JSON document in ``path``; ``error`` with one line (``cannot read WHAT PATH:
    why`` or ``PATH: not JSON: why``) when it cannot be read or parsed.

    Raises:
        error: as above.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read {what} {file}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise error(f"{file}: not JSON: {exc}") from None


def _algo_params(doc: Any, where: str) -> AlgoParams:
    if not isinstance(doc, Mapping) or set(doc) != {"alpha", "beta"}:
        raise ProfileError(f"{where}: expected {{'alpha': seconds, 'beta': seconds/byte}}")
    try:
        return AlgoParams(alpha=doc["alpha"], beta=doc["beta"])
    except ProfileError as exc:
        raise ProfileError(f"{where}: {exc}") from None


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")


_DEFAULT_PROFILE_FILE = "default_profile.json"
"""The built-in profile's file in the ``dynamiccl`` package (package data)."""


def _builtin_profile() -> Profile:
    text = resources.files("dynamiccl").joinpath(_DEFAULT_PROFILE_FILE).read_text("utf-8")
    return Profile.from_dict(json.loads(text), where=f"dynamiccl/{_DEFAULT_PROFILE_FILE}")


DEFAULT_PROFILE = _builtin_profile()
"""The profile of ``inalab decide``, ``inalab bench --algos auto`` and the PyTorch
backend's dynamiccl chooser without one of their own: hostlib's own algorithms measured
on inalab's loopback set-up (the Python soft switch for INA, hostlib's ring and tree over
UDP), so out of the box decisions describe this testbed's software, not Gloo's C++ ring
or a GPU cluster. Its ``source`` starts with ``built-in:`` and names the machine, so
every output that shows it says which numbers it used. Calibrate (``inalab calibrate``)
for anything else: on another machine these are only an order of magnitude.

``default_profile.json`` is ``inalab calibrate --workers 4 -e 16M`` (4K..16M, x4, 3 timed
calls, float32, 2048 lanes, 32 slots) unchanged but for its ``source`` and its
``workers`` (which calibrate did not record yet; the source says 4): on a 2-core AMD
EPYC VM (Debian 12, Python 3.11) on 2026-11-24, while a CI run shared the machine.
That load makes times vary: three runs in a row fitted the ring's beta at 21.0, 8.0 and
10.6 ns/byte; this is the median run (the median of all three algorithms' betas too).
Its fit, measured -> fitted, 4 workers::

    algo   64 KiB          1 MiB          16 MiB
    ina    5.9 -> 2.8 ms   21 -> 22 ms    272 -> 324 ms
    ring   4.5 -> 2.5 ms   18 -> 18 ms    297 -> 269 ms
    tree   2.7 -> 1.9 ms   35 -> 24 ms    355 -> 372 ms

(mean |error| 17% over all 21 points). It predicts the ring at 64 MiB in 1.07 s; five
``inalab bench`` runs of it on that machine, under the same load, measured 0.90 to 2.26 s
(median 1.67 s; the slow ones retransmitted thousands of packets). The
switch rate is the fit's rule (4 contributions per INA beta: the soft switch is INA's
bottleneck); loss 0, the timeout (hostlib's 20 ms) and the packet and window (the
bench's) are the fit's base. On loopback the tree wins small messages and the ring
large ones, by little; behind a shaped topology (``--topology``) the wire becomes the
floor and INA's single step and ``S`` bytes win on slow links.
"""


@dataclass(frozen=True)
class TopologySummary:
    """What the network adds to the model for one job: plain data, so dynamiccl decides
    for a network it never loads (``emulation.topology.summary`` derives one from a
    topology file; :meth:`to_dict` and :meth:`load` are its JSON, ``inalab decide
    --summary``).

    Attributes:
        link_bandwidth: bytes/s of the slowest worker link, None for unshaped.
        delay: seconds one way between a worker and the job's switch (the worst worker).
        hops: switches on the worst worker's path to the job's switch (1 = directly).
        oversubscription: the worst switch-to-switch link's demand over capacity: the
            access bandwidth of the worker hosts beneath it over its own (>= 1; 1 when
            non-blocking or with one switch).
        contention: how many streams of the slowest worker link's rate each algorithm
            puts on its worst link, relative to that link's capacity (>= 1): ``ina``
            counts every contribution routed to an aggregating switch (a forwarding
            leaf passes all of its hosts' streams up; an aggregating leaf sends one),
            ``ring`` and ``tree`` cross a switch-to-switch link with one stream each way
            when ranks follow the topology's order.
        loss: the worst worker path's loss probability (each direction).
        switch_reachable: some switch can aggregate for the job.
        fan_in: the most contributions one aggregating switch sums (None: the workers).
        slots: the job's free switch slots, None when unknown (assumed enough).
    """

    link_bandwidth: float | None = None
    delay: float = 0.0
    hops: int = 1
    oversubscription: float = 1.0
    contention: Mapping[str, float] = field(default_factory=dict)
    loss: float = 0.0
    switch_reachable: bool = True
    fan_in: int | None = None
    slots: int | None = None

    def contention_of(self, algorithm: str) -> float:
        return max(1.0, float(self.contention.get(algorithm, 1.0)))

    def to_dict(self) -> dict[str, Any]:
        """The JSON document :meth:`from_dict` reads: every field, and the schema."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["contention"] = dict(self.contention)
        return {"schema": SUMMARY_SCHEMA, **doc}

    @classmethod
    def from_dict(cls, doc: Any, where: str = "summary") -> TopologySummary:
        """Build a summary from :meth:`to_dict`'s document; an omitted field keeps its
        default (the default is no network: loopback).

        Raises:
            SummaryError: not an object, wrong schema version, unknown keys, or a value
                out of its range (the message names the key).
        """
        if not isinstance(doc, Mapping):
            raise SummaryError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        if doc.get("schema") != SUMMARY_SCHEMA:
            raise SummaryError(
                f"{where}: schema {doc.get('schema')!r} is not {SUMMARY_SCHEMA} "
                "(a summary written by another inalab version?)"
            )
        unknown = sorted(set(doc) - set(_SUMMARY_VALUES) - {"schema"})
        contention = doc.get("contention")
        if isinstance(contention, Mapping):
            unknown += sorted(f"contention.{a}" for a in set(contention) - set(ALGORITHMS))
        if unknown:
            raise SummaryError(f"{where}: unknown key(s) {', '.join(unknown)}")
        values = {k: v for k, v in doc.items() if k != "schema"}
        for name, value in values.items():
            valid, expected = _SUMMARY_VALUES[name]
            if not valid(value):
                raise SummaryError(f"{where}: {name} must be {expected}, got {value!r}")
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> TopologySummary:
        """Read a summary written from :meth:`to_dict` (e.g. by
        ``emulation.topology.summary.summary_json``).

        Raises:
            SummaryError: the file cannot be read, is not JSON or not a valid summary.
        """
        return cls.from_dict(read_json(path, "summary", SummaryError), where=str(path))


def _is_number(value: Any, lo: float, *, above: bool = False) -> bool:
    """A finite int or float (not a bool) >= ``lo`` (> ``lo`` when ``above``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and (value > lo if above else value >= lo)


def _is_count(value: Any, lo: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo


_SUMMARY_VALUES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "link_bandwidth": (
        lambda v: v is None or _is_number(v, 0, above=True),
        "null (unshaped) or bytes/s > 0",
    ),
    "delay": (lambda v: _is_number(v, 0), "seconds >= 0"),
    "hops": (lambda v: _is_count(v, 0), "an integer >= 0"),
    "oversubscription": (lambda v: _is_number(v, 1), "a number >= 1"),
    "contention": (
        lambda v: isinstance(v, Mapping) and all(_is_number(v[a], 1) for a in v),
        f"an object of numbers >= 1 for any of {', '.join(ALGORITHMS)}",
    ),
    "loss": (lambda v: _is_number(v, 0) and v < 1, "a probability in [0, 1)"),
    "switch_reachable": (lambda v: isinstance(v, bool), "true or false"),
    "fan_in": (lambda v: v is None or _is_count(v, 1), "null or an integer >= 1"),
    "slots": (lambda v: v is None or _is_count(v, 0), "null or an integer >= 0"),
}
"""Each :class:`TopologySummary` field's check in :meth:`TopologySummary.from_dict` and
what a valid JSON value is (a test keeps the keys the fields)."""


@dataclass(frozen=True)
class Estimate:
    """One algorithm's predicted time and its parts.

    Attributes:
        algorithm: the algorithm.
        seconds: the total (``math.inf``: not available, ``bound`` says why).
        latency: steps times (alpha + round trip).
        transfer: bytes times the per-byte time, inflated for loss.
        stalls: expected retransmission timeouts.
        bound: what sets the per-byte time: ``software`` (the profile's beta), ``wire``,
            ``switch`` (aggregation rate), ``window`` (too few slots), or why the
            algorithm is unavailable.
    """

    algorithm: str
    seconds: float
    latency: float = 0.0
    transfer: float = 0.0
    stalls: float = 0.0
    bound: str = "software"

    @property
    def available(self) -> bool:
        return math.isfinite(self.seconds)


def steps(algorithm: str, workers: int) -> int:
    """Latency steps of an allreduce over ``workers`` (the alpha multiplier).

    Raises:
        ValueError: unknown algorithm or fewer than 1 worker.
    """
    _check_algorithm(algorithm)
    _check_workers(workers)
    if workers == 1:
        return 0 if algorithm != "ina" else 1
    if algorithm == "ring":
        return 2 * (workers - 1)
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(workers))
    return 1


def byte_coefficient(algorithm: str, workers: int) -> float:
    """Bytes a worker moves each way per byte of the message (the beta multiplier).

    Raises:
        ValueError: unknown algorithm or fewer than 1 worker.
    """
    _check_algorithm(algorithm)
    _check_workers(workers)
    if workers == 1:
        return 0.0 if algorithm != "ina" else 1.0
    if algorithm == "ring":
        return 2.0 * (workers - 1) / workers
    if algorithm == "tree":
        return TREE_BYTE_FACTOR
    return 1.0


def _check_workers(workers: int) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")


def _ina_unavailable(workers: int, topo: TopologySummary, ina_available: bool) -> str | None:
    if not ina_available:
        return "unavailable: INA disabled for this job"
    if not topo.switch_reachable:
        return "unavailable: no switch can aggregate for the job"
    if topo.slots is not None and topo.slots <= 0:
        return "unavailable: no free switch slots"
    if workers > MAX_WORKERS:
        return f"unavailable: {workers} workers, the switch's bitmap holds {MAX_WORKERS}"
    return None


def estimate(
    algorithm: str,
    size_bytes: int,
    workers: int,
    profile: Profile,
    topology: TopologySummary | None = None,
    *,
    ina_available: bool = True,
) -> Estimate:
    """Predicted time of one allreduce of ``size_bytes`` with ``algorithm``.

    Args:
        algorithm: one of :data:`ALGORITHMS`.
        size_bytes: the message, bytes (> 0).
        workers: ranks taking part (>= 1).
        profile: the calibrated constants.
        topology: what the network adds; None for the calibration set-up itself.
        ina_available: False when the job may not use the switch (INA is then infinite).

    Raises:
        ValueError: unknown algorithm, non-positive size or workers.
    """
    _check_algorithm(algorithm)
    _check_workers(workers)
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes <= 0:
        raise ValueError(f"size must be a positive number of bytes, got {size_bytes!r}")
    topo = topology if topology is not None else TopologySummary()
    params = profile.params(algorithm)
    if algorithm == "ina":
        why = _ina_unavailable(workers, topo, ina_available)
        if why is not None:
            return Estimate(algorithm, math.inf, bound=why)
    nsteps = steps(algorithm, workers)
    coeff = byte_coefficient(algorithm, workers)
    latency = nsteps * (params.alpha + 2.0 * topo.delay)
    # The slowest of the per-byte limits sets the pace: these are throughputs, not sums.
    limits = {"software": params.beta}
    if topo.link_bandwidth is not None:
        limits["wire"] = topo.contention_of(algorithm) / topo.link_bandwidth
    if algorithm == "ina":
        fan_in = topo.fan_in if topo.fan_in is not None else workers
        limits["switch"] = fan_in / profile.switch_rate
        if topo.slots is not None:
            rtt = params.alpha + 2.0 * topo.delay
            limits["window"] = rtt / (min(topo.slots, profile.window) * profile.packet_bytes)
    bound = max(limits, key=lambda k: limits[k])
    moved = coeff * size_bytes
    loss = 1.0 - (1.0 - profile.loss) * (1.0 - topo.loss)
    transfer = moved * limits[bound] / (1.0 - loss)
    packets = math.ceil(moved / profile.packet_bytes) if moved else 0
    # A lost packet stalls its slot for a timeout; a window's losses overlap.
    stalls = packets * loss * profile.timeout / profile.window
    return Estimate(algorithm, latency + transfer + stalls, latency, transfer, stalls, bound)


def estimate_all(
    size_bytes: int,
    workers: int,
    profile: Profile,
    topology: TopologySummary | None = None,
    *,
    ina_available: bool = True,
) -> dict[str, Estimate]:
    """:func:`estimate` for every algorithm, in :data:`ALGORITHMS` order."""
    return {
        a: estimate(a, size_bytes, workers, profile, topology, ina_available=ina_available)
        for a in ALGORITHMS
    }
