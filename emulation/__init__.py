"""Emulation: the switch targets, the topology data, the Mininet network, and the bench.

- ``softswitch/``, ``tnamodel/``, ``bmv2.py``: the switch targets (the Python pipeline
  and its eBPF data plane, the TNA model, bmv2);
- ``topology/``: topologies as data, loaded from files;
- ``mininet/``: a topology brought up in Mininet, and ``inalab emulate``;
- ``bench/``: the benchmarks;
- ``cli.py``: the ``inalab`` command.

docs/architecture.md draws the layers. Module paths from before this layout still
import, with a DeprecationWarning (:mod:`emulation._moved`).
"""

from emulation._moved import install as _install_moved

_install_moved()

__all__: list[str] = []
