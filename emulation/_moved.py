"""Module paths that issue #39 moved into ``emulation``'s subfolders, still importable.

``import emulation.network`` (or ``from emulation.emulate import ...``) gives the module
at its new home, the same object, with a :class:`DeprecationWarning` naming that home.
The old paths have no files: a finder on :data:`sys.meta_path` answers for exactly the
names in :data:`MOVED`, so the folder shows only where things are now.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    "emulation.topology_summary": "emulation.topology.summary",
    "emulation.convergence": "emulation.topology.convergence",
    **{
        f"emulation.{name}": f"emulation.mininet.{name}"
        for name in (
            "check",
            "datapaths",
            "emulate",
            "hostrun",
            "linkcontrol",
            "network",
            "overrides",
            "registry",
            "run",
        )
    },
}
"""Old module path -> where the module lives now."""


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED`; loading it imports the new one and returns it."""

    def find_spec(
        self,
        fullname: str,
        path: object = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"module {spec.name} moved to {new}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when :meth:`create_module` imported it under its new name."""


def install() -> None:
    """Put the finder on :data:`sys.meta_path`, once per interpreter."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
