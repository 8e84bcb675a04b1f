"""Emulation: the software switch, its processes, and the benchmark that runs them."""

__all__: list[str] = []
