"""The eBPF data plane: the INA pipeline as a TC classifier on the switch's ports.

A room of its own behind the soft switch's :class:`~emulation.softswitch.pipeline.
Pipeline` table API (STYLE.md): ``ina.bpf.c`` is the program, ``layout.py`` the constants
and map structs it shares with Python (generated into its header from
``hostlib/protocol.py``), ``build.py`` compiles it with clang (cached by source hash),
``libbpf.py`` loads it and reaches its maps through ctypes, ``lanes.py`` the HTB
lanes its links hold frames back in (reordering), ``dataplane.py`` is
:class:`EbpfDataplane` (the control plane's view, every table write mirrored into the
maps) and ``server.py`` the switch on ports (``inalab switch --datapath ebpf``).

Importing this package loads nothing into the kernel and needs neither clang nor libbpf;
:func:`ebpf_unavailable` says whether this machine can run it.
"""

from __future__ import annotations

import os
import shutil

__all__ = ["ebpf_unavailable"]


def ebpf_unavailable() -> str | None:
    """Why the eBPF data plane cannot run here (None: it can): it needs root (loading
    programs, attaching to interfaces), clang (to compile) and libbpf (to load)."""
    from emulation.softswitch.ebpf.build import INSTALL_HINT
    from emulation.softswitch.ebpf.libbpf import LibbpfError, libbpf

    if os.geteuid() != 0:
        return "the eBPF data plane needs root (CAP_BPF and CAP_NET_ADMIN)"
    if shutil.which("clang") is None:
        return f"the eBPF data plane needs clang: {INSTALL_HINT}"
    try:
        libbpf()
    except LibbpfError as exc:
        return f"the eBPF data plane needs libbpf ({exc}): {INSTALL_HINT}"
    return None
