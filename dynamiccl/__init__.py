"""Per-collective choice of INA, ring or tree (filled by the dynamiccl issue)."""

__all__: list[str] = []
