"""P4Runtime controller for INA switches (filled by the P4/controller issue)."""

__all__: list[str] = []
