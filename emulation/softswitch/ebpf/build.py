"""Compile ``ina.bpf.c`` with clang at first use, cached by what goes into it.

The object for a lane count is built from the C source, the header
:func:`~emulation.softswitch.ebpf.layout.render_header` generates from
``hostlib/protocol.py``, and clang; a digest of the three names the cached object
(``$XDG_CACHE_HOME/inalab/ebpf/ina-<lanes>-<digest>.o``), so a changed source, protocol
constant or compiler rebuilds, and switches of one run (or later runs) compile once.
Outputs appear atomically: concurrent first uses by several switches are safe.

Flags, as the eBPF probe of this machine found them (shared/EBPF-PROBE.md): ``-O2 -g
-target bpf -mcpu=v3`` (``-g``: a map value with ``bpf_spin_lock`` needs BTF; v3 for
32-bit jumps and atomics) and the multiarch include directory for ``asm/types.h``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

from emulation.softswitch.ebpf.layout import render_header

__all__ = [
    "HEADERS",
    "INSTALL_HINT",
    "SOURCE",
    "EbpfBuildError",
    "EbpfUnavailable",
    "build_program",
    "cache_dir",
    "clang_command",
    "find_clang",
]

SOURCE = Path(__file__).with_name("ina.bpf.c")
"""The program, kept in the repository beside this module."""

HEADERS = tuple(
    Path(__file__).with_name(name)
    for name in ("roce.bpf.h", "forward.bpf.h", "sharing.bpf.h", "onearmed.bpf.h")
)
"""The files ``SOURCE`` includes from beside it (part of the cached object's identity)."""

INSTALL_HINT = "install clang and libbpf (Debian/Ubuntu: apt-get install clang llvm libbpf-dev)"


class EbpfUnavailable(RuntimeError):
    """This machine cannot build or load the eBPF data plane; the message says why."""


class EbpfBuildError(RuntimeError):
    """clang refused the program; the message quotes its output."""


def find_clang() -> Path:
    """clang on PATH.

    Raises:
        EbpfUnavailable: none (with :data:`INSTALL_HINT`).
    """
    found = shutil.which("clang")
    if found is None:
        raise EbpfUnavailable(f"clang is not on PATH: {INSTALL_HINT}")
    return Path(found)


def cache_dir() -> Path:
    """Where compiled objects are kept: ``$XDG_CACHE_HOME/inalab/ebpf`` (default
    ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inalab" / "ebpf"


def clang_command(
    clang: Path, include_dir: Path, output: Path, defines: Sequence[str] = ()
) -> list[str]:
    """The clang command compiling :data:`SOURCE` with the generated header in
    ``include_dir`` (and ``-D`` each of ``defines``)."""
    arch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    return [
        str(clang), "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror",
        *(f"-D{d}" for d in defines),
        "-I", str(include_dir), "-I", f"/usr/include/{arch}",
        "-c", str(SOURCE), "-o", str(output),
    ]  # fmt: skip


def build_program(
    lanes: int,
    directory: Path | None = None,
    clang: Path | None = None,
    defines: Sequence[str] = (),
) -> Path:
    """The compiled object for ``lanes`` lanes, from the cache or compiled now.

    Args:
        lanes: int32 lanes per packet.
        directory: the cache (default :func:`cache_dir`).
        clang: the compiler (default: on PATH).
        defines: preprocessor macros (``INA_NO_LOCK``: the test-only build without the
            slot lock).

    Raises:
        ValueError: lanes out of range.
        EbpfUnavailable: no clang.
        EbpfBuildError: clang failed.
    """
    header = render_header(lanes)
    clang = clang or find_clang()
    directory = directory or cache_dir()
    digest = hashlib.sha256()
    identity = _clang_identity(clang)
    sources = [path.read_bytes() for path in (SOURCE, *HEADERS)]
    for part in (*sources, header.encode(), identity, " ".join(defines).encode()):
        digest.update(part + b"\0")
    target = directory / f"ina-{lanes}-{digest.hexdigest()[:16]}.o"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
        (Path(tmp) / "ina_gen.h").write_text(header)
        output = Path(tmp) / "ina.o"
        command = clang_command(clang, Path(tmp), output, defines)
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise EbpfBuildError(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr}")
        os.replace(output, target)
    return target


def _clang_identity(clang: Path) -> bytes:
    """Which clang build compiles: its path, size and modification time."""
    stat = clang.resolve().stat()
    return f"{clang.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
