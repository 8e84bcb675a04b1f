"""The few libbpf calls the eBPF data plane needs, through ctypes.

Why ctypes over the system's libbpf (``libbpf.so.1``, Debian's ``libbpf1``), rather than
the alternatives:

- raw ``bpf(2)`` syscalls would mean re-implementing the ELF loader (relocations, BTF
  for the spin lock's map, map creation), which is what libbpf is for;
- ``bpftool prog load`` with pinned maps works from the shell, but every map access from
  Python would then be a process or a pinned-path open, and pins outlive a killed run
  (cleanup by name, which we do not do);
- bcc compiles at run time with its own LLVM and Python bindings (the issue rules it
  out);
- ctypes needs no compiled extension and no new Python dependency; the object, its maps'
  file descriptors and the TC attachments live in the switch process and go with it.

libbpf 1.x reports errors as a negative errno from int-returning calls, and NULL with
``errno`` set from pointer-returning ones; both become :class:`LibbpfError` here.
The TC attachment is a TCX link where the kernel has TCX (Linux 6.6+:
``bpf_link_create`` with ``BPF_TCX_INGRESS``): the link is a file descriptor of the
switch process, so the program leaves the interface when the process ends, however it
ends (measured: a classic cls_bpf filter stayed attached, and kept aggregating, after
``kill -9`` of the switch). Where the kernel has no TCX (Debian 12's 6.1), it falls back
to a clsact filter (``bpf_tc_hook_create``/``bpf_tc_attach``), which creates the port's
clsact qdisc unless one exists; :meth:`TcAttachment.detach` removes only what it created,
and a warning says that a switch killed there leaves its filter behind.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BPF_ANY",
    "BPF_F_LOCK",
    "BpfMap",
    "BpfObject",
    "LibbpfError",
    "ProgramRun",
    "TcAttachment",
    "enable_run_time_stats",
    "libbpf",
    "possible_cpus",
    "run_program",
]

BPF_ANY = 0
BPF_NOEXIST = 1
BPF_F_LOCK = 4
"""Map update/lookup flag: copy the value under the value's ``bpf_spin_lock``."""

log = logging.getLogger(__name__)

_BPF_TC_INGRESS = 1
_BPF_TCX_INGRESS = 46
"""enum bpf_attach_type's BPF_TCX_INGRESS (uapi linux/bpf.h, Linux 6.6)."""
_LOG_BUF_BYTES = 16 << 20  # the verifier's log of a failed load, for the error message
_LOAD_ATTEMPTS = 5


class LibbpfError(OSError):
    """A libbpf call failed; ``errno`` and the call are in the message."""


class _TcHook(ctypes.Structure):
    # struct bpf_tc_hook (libbpf.h): size_t sz; int ifindex; enum attach_point; __u32
    # parent; size_t :0.
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("ifindex", ctypes.c_int),
        ("attach_point", ctypes.c_int),
        ("parent", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class _TcOpts(ctypes.Structure):
    # struct bpf_tc_opts: size_t sz; int prog_fd; __u32 flags, prog_id, handle,
    # priority; size_t :0.
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("prog_fd", ctypes.c_int),
        ("flags", ctypes.c_uint32),
        ("prog_id", ctypes.c_uint32),
        ("handle", ctypes.c_uint32),
        ("priority", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class _TestRunOpts(ctypes.Structure):
    # struct bpf_test_run_opts (bpf.h, libbpf 1.x).
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


class _SkbCtx(ctypes.Structure):
    # The head of struct __sk_buff up to ifindex: the fields a test run may set.
    _fields_ = [("zero", ctypes.c_uint32 * 10), ("ifindex", ctypes.c_uint32)]


@dataclass(frozen=True)
class ProgramRun:
    """One run of a program on a frame in the kernel (``BPF_PROG_TEST_RUN``)."""

    retval: int
    duration_ns: int
    data_out: bytes


def run_program(prog_fd: int, frame: bytes, ifindex: int = 1, repeat: int = 1) -> ProgramRun:
    """Run program ``prog_fd`` on ``frame`` as if it arrived on interface ``ifindex``
    (1, loopback, is the kernel's default device), ``repeat`` times; the kernel measures
    the program's own time (the average over the repetitions).

    Raises:
        LibbpfError: the kernel refused the run.
    """
    out = ctypes.create_string_buffer(len(frame) + 256)
    data = ctypes.create_string_buffer(frame, len(frame))
    ctx = _SkbCtx(ifindex=ifindex)
    opts = _TestRunOpts(
        sz=ctypes.sizeof(_TestRunOpts),
        data_in=ctypes.cast(data, ctypes.c_void_p), data_size_in=len(frame),
        data_out=ctypes.cast(out, ctypes.c_void_p), data_size_out=len(out),
        ctx_in=ctypes.cast(ctypes.pointer(ctx), ctypes.c_void_p), ctx_size_in=ctypes.sizeof(ctx),
        repeat=repeat,
    )  # fmt: skip
    _check(libbpf().bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)), "bpf_prog_test_run")
    return ProgramRun(opts.retval, opts.duration, out.raw[: opts.data_size_out])


_lib: ctypes.CDLL | None = None


def libbpf() -> ctypes.CDLL:
    """The system's libbpf, with the signatures used here declared (loaded once).

    Raises:
        LibbpfError: no libbpf.so.1 (install libbpf1 / libbpf-dev).
    """
    global _lib
    if _lib is not None:
        return _lib
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise LibbpfError(errno.ENOENT, f"cannot load libbpf ({name}): {exc}") from None
    p, i, u32, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
    sz = ctypes.c_size_t
    signatures = {
        "bpf_object__open_file": (p, [ctypes.c_char_p, p]),
        "bpf_object__load": (i, [p]),
        "bpf_object__close": (None, [p]),
        "bpf_object__find_map_by_name": (p, [p, ctypes.c_char_p]),
        "bpf_object__find_program_by_name": (p, [p, ctypes.c_char_p]),
        "bpf_map__set_max_entries": (i, [p, u32]),
        "bpf_map__fd": (i, [p]),
        "bpf_program__fd": (i, [p]),
        "bpf_program__set_log_buf": (i, [p, ctypes.c_char_p, sz]),
        "bpf_program__set_log_level": (i, [p, u32]),
        "bpf_map_update_elem": (i, [i, p, p, u64]),
        "bpf_map_lookup_elem_flags": (i, [i, p, p, u64]),
        "bpf_map_delete_elem": (i, [i, p]),
        "bpf_map_get_next_key": (i, [i, p, p]),
        "libbpf_num_possible_cpus": (i, []),
        "bpf_tc_hook_create": (i, [p]),
        "bpf_tc_hook_destroy": (i, [p]),
        "bpf_tc_attach": (i, [p, p]),
        "bpf_tc_detach": (i, [p, p]),
        "bpf_link_create": (i, [i, i, u32, p]),
        "bpf_prog_test_run_opts": (i, [i, p]),
        "bpf_enable_stats": (i, [u32]),
    }
    for fn, (restype, argtypes) in signatures.items():
        getattr(lib, fn).restype = restype
        getattr(lib, fn).argtypes = argtypes
    _lib = lib
    return lib


def _check(result: int, what: str) -> int:
    if result < 0:
        raise LibbpfError(-result, f"{what}: {os.strerror(-result)}")
    return result


def _check_ptr(result: int | None, what: str) -> int:
    if not result:
        err = ctypes.get_errno() or errno.EINVAL
        raise LibbpfError(err, f"{what}: {os.strerror(err)}")
    return result


_BPF_STATS_RUN_TIME = 0
"""enum bpf_stats_type's only member (uapi linux/bpf.h, Linux 5.8)."""


def enable_run_time_stats() -> int:
    """Have the kernel time every BPF program's runs (``run_time_ns`` and ``run_cnt`` in
    a program's ``/proc/PID/fdinfo``, ``bpftool prog``) while the returned file
    descriptor is open: ``BPF_ENABLE_STATS``, which, unlike the ``kernel.
    bpf_stats_enabled`` sysctl, changes nothing that outlives this process. Costs two
    clock reads per program run. Close the descriptor to stop.

    Raises:
        LibbpfError: no libbpf, or the kernel refused (not root: EPERM; before 5.8).
    """
    return _check(libbpf().bpf_enable_stats(_BPF_STATS_RUN_TIME), "bpf_enable_stats")


def possible_cpus() -> int:
    """CPUs a per-CPU map holds a value for (libbpf's count of possible CPUs)."""
    return _check(libbpf().libbpf_num_possible_cpus(), "libbpf_num_possible_cpus")


@dataclass(frozen=True)
class BpfMap:
    """One map of a loaded object, by its file descriptor, with its key and value sizes."""

    name: str
    fd: int
    key_size: int
    value_size: int

    def update(self, key: Any, value: Any, flags: int = BPF_ANY) -> None:
        """Write ``value`` (a ctypes object of the value's size) at ``key`` (a ctypes
        object of the key's size).

        Raises:
            ValueError: a key or value of the wrong size.
            LibbpfError: the kernel refused (a full hash map: E2BIG).
        """
        self._sizes(key, value)
        lib = libbpf()
        rc = lib.bpf_map_update_elem(self.fd, ctypes.byref(key), ctypes.byref(value), flags)
        _check(rc, f"update of map {self.name}")

    def lookup(self, key: Any, value: Any, flags: int = 0) -> bool:
        """Read the value at ``key`` into ``value``; False if there is none.

        Raises:
            ValueError: a key or value of the wrong size.
            LibbpfError: anything but a missing key.
        """
        self._sizes(key, value)
        lib = libbpf()
        rc = lib.bpf_map_lookup_elem_flags(self.fd, ctypes.byref(key), ctypes.byref(value), flags)
        if rc == -errno.ENOENT:
            return False
        _check(rc, f"lookup in map {self.name}")
        return True

    def delete(self, key: Any) -> bool:
        """Delete ``key``; False if it was not there.

        Raises:
            LibbpfError: anything but a missing key.
        """
        rc = libbpf().bpf_map_delete_elem(self.fd, ctypes.byref(key))
        if rc == -errno.ENOENT:
            return False
        _check(rc, f"delete in map {self.name}")
        return True

    def keys(self, key_type: type) -> Iterator[Any]:
        """Every key of a hash map (a snapshot as the kernel walks it)."""
        lib = libbpf()
        current = None
        while True:
            following = key_type()
            prev = ctypes.byref(current) if current is not None else None
            rc = lib.bpf_map_get_next_key(self.fd, prev, ctypes.byref(following))
            if rc == -errno.ENOENT:
                return
            _check(rc, f"walk of map {self.name}")
            yield following
            current = following

    def _sizes(self, key: Any, value: Any) -> None:
        if ctypes.sizeof(key) != self.key_size:
            raise ValueError(f"map {self.name}: {ctypes.sizeof(key)}-byte key, not {self.key_size}")
        if ctypes.sizeof(value) < self.value_size:
            raise ValueError(f"map {self.name}: value buffer under {self.value_size} bytes")


class BpfObject:
    """A compiled eBPF object loaded into the kernel: its programs' and maps' fds.

    Args:
        path: the ELF object (``build.build_program``).
        max_entries: map name -> size to set before loading (arrays sized at run time).

    Raises:
        LibbpfError: libbpf cannot open it, or the kernel refused it; a verifier refusal
            carries the end of the verifier's log.
    """

    def __init__(self, path: Path, max_entries: dict[str, int] | None = None) -> None:
        self.path = Path(path)
        self._max_entries = dict(max_entries or {})
        self._obj = 0
        self._log = ctypes.create_string_buffer(0)
        self._open_and_load(verbose=False)

    def _open_and_load(self, verbose: bool, attempt: int = 1) -> None:
        lib = libbpf()
        self._obj = _check_ptr(lib.bpf_object__open_file(str(self.path).encode(), None),
                               f"bpf_object__open_file({self.path})")  # fmt: skip
        try:
            for name, size in self._max_entries.items():
                _check(lib.bpf_map__set_max_entries(self._map_ptr(name), size),
                       f"bpf_map__set_max_entries({name}, {size})")  # fmt: skip
            if verbose:
                self._log = ctypes.create_string_buffer(_LOG_BUF_BYTES)
                for prog in self._programs():
                    lib.bpf_program__set_log_buf(prog, self._log, _LOG_BUF_BYTES)
                    lib.bpf_program__set_log_level(prog, 1)
            rc = lib.bpf_object__load(self._obj)
            if rc == -errno.EAGAIN and attempt < _LOAD_ATTEMPTS:
                # The verifier gives up when a signal is pending (a profiler, a resize):
                # libbpf retried a few times already; so does this, from a fresh open.
                self.close()
                time.sleep(0.05 * attempt)
                self._open_and_load(verbose, attempt + 1)
                return
            if rc < 0:
                if not verbose:  # load again with the verifier's log, for the message
                    self.close()
                    self._open_and_load(verbose=True)
                tail = self._log.value.decode(errors="replace")[-3000:]
                raise LibbpfError(-rc, f"loading {self.path}: {os.strerror(-rc)}\n{tail}")
        except BaseException:
            self.close()
            raise

    def _programs(self) -> list[int]:
        prog = libbpf().bpf_object__find_program_by_name(self._obj, b"ina_port")
        return [prog] if prog else []

    def _map_ptr(self, name: str) -> int:
        return _check_ptr(libbpf().bpf_object__find_map_by_name(self._obj, name.encode()),
                          f"no map {name} in {self.path}")  # fmt: skip

    def program_fd(self, name: str) -> int:
        """The fd of program ``name``.

        Raises:
            LibbpfError: no such program.
        """
        lib = libbpf()
        prog = _check_ptr(lib.bpf_object__find_program_by_name(self._obj, name.encode()),
                          f"no program {name} in {self.path}")  # fmt: skip
        return _check(lib.bpf_program__fd(prog), f"bpf_program__fd({name})")

    def map(self, name: str, key_size: int, value_size: int) -> BpfMap:
        """Map ``name`` with the key and value sizes the caller's structs have.

        Raises:
            LibbpfError: no such map.
        """
        fd = _check(libbpf().bpf_map__fd(self._map_ptr(name)), f"bpf_map__fd({name})")
        return BpfMap(name, fd, key_size, value_size)

    def close(self) -> None:
        """Release the object: its maps and programs go once nothing holds them (a TC
        attachment holds the program until it is detached)."""
        if self._obj:
            libbpf().bpf_object__close(self._obj)
            self._obj = 0


class TcAttachment:
    """A program attached as an ingress classifier (direct action) on one interface: a
    TCX link where the kernel has TCX, else a clsact filter (the module's docstring).

    Raises:
        LibbpfError: the attachment failed (no such interface, not root).
    """

    def __init__(self, ifindex: int, prog_fd: int) -> None:
        self.ifindex = ifindex
        self._attached = False
        self._link_fd = libbpf().bpf_link_create(prog_fd, ifindex, _BPF_TCX_INGRESS, None)
        if self._link_fd >= 0:
            self.kind = "tcx"
        elif self._link_fd in (-errno.EINVAL, -errno.EOPNOTSUPP):  # no TCX: Linux < 6.6
            self.kind = "clsact"
            self._attach_clsact(prog_fd)
        else:
            _check(self._link_fd, f"bpf_link_create(ifindex {ifindex}, BPF_TCX_INGRESS)")
        self._attached = True

    def _attach_clsact(self, prog_fd: int) -> None:
        lib, ifindex = libbpf(), self.ifindex
        log.warning(
            "ifindex %d: no TCX in this kernel, attached as a clsact filter: a switch that "
            "is killed leaves it attached (tc filter del dev IFACE ingress)",
            ifindex,
        )
        self._hook = _TcHook(sz=ctypes.sizeof(_TcHook), ifindex=ifindex,
                             attach_point=_BPF_TC_INGRESS)  # fmt: skip
        rc = lib.bpf_tc_hook_create(ctypes.byref(self._hook))
        # An existing clsact qdisc is someone else's: attach to it, never remove it.
        self._own_hook = rc == 0
        if rc < 0 and rc != -errno.EEXIST:
            _check(rc, f"bpf_tc_hook_create(ifindex {ifindex})")
        self._opts = _TcOpts(sz=ctypes.sizeof(_TcOpts), prog_fd=prog_fd)
        rc = lib.bpf_tc_attach(ctypes.byref(self._hook), ctypes.byref(self._opts))
        if rc < 0:
            if self._own_hook:
                lib.bpf_tc_hook_destroy(ctypes.byref(self._hook))
            _check(rc, f"bpf_tc_attach(ifindex {ifindex})")

    def detach(self) -> None:
        """Close the TCX link, or remove the clsact filter (and the qdisc if it was
        created here); idempotent. An interface already gone (ENODEV) took both with it."""
        if not self._attached:
            return
        self._attached = False
        if self.kind == "tcx":
            os.close(self._link_fd)
            return
        lib = libbpf()
        if self._own_hook:
            rc = lib.bpf_tc_hook_destroy(ctypes.byref(self._hook))
        else:
            opts = _TcOpts(sz=ctypes.sizeof(_TcOpts), handle=self._opts.handle,
                           priority=self._opts.priority)  # fmt: skip
            rc = lib.bpf_tc_detach(ctypes.byref(self._hook), ctypes.byref(opts))
        if rc < 0 and rc not in (-errno.ENODEV, -errno.ENOENT, -errno.EINVAL):
            _check(rc, f"detaching from ifindex {self.ifindex}")
