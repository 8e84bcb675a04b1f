"""P4Runtime controller for INA switches: the control plane, which only configures.

``P4Info`` indexes a pipeline's P4Info by name and id and encodes values; the entry
builders turn names into P4Runtime messages, checked before anything is sent;
``P4RuntimeClient`` (one per switch) carries them and raises typed errors.
"""

from controller.client import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    NotPrimaryError,
    P4RuntimeClient,
    P4RuntimeError,
    PermissionDeniedError,
    SwitchUnreachableError,
    UpdateError,
)
from controller.entries import (
    counter_entry,
    delete,
    entity,
    insert,
    modify,
    multicast_group_entry,
    register_entry,
    table_entry,
)
from controller.p4info import (
    DEFAULT_P4INFO_PATH,
    EncodingError,
    P4Info,
    P4InfoError,
    decode_value,
    encode_value,
)

__all__ = [
    "DEFAULT_P4INFO_PATH",
    "AlreadyExistsError",
    "EncodingError",
    "InvalidArgumentError",
    "NotFoundError",
    "NotPrimaryError",
    "P4Info",
    "P4InfoError",
    "P4RuntimeClient",
    "P4RuntimeError",
    "PermissionDeniedError",
    "SwitchUnreachableError",
    "UpdateError",
    "counter_entry",
    "decode_value",
    "delete",
    "encode_value",
    "entity",
    "insert",
    "modify",
    "multicast_group_entry",
    "register_entry",
    "table_entry",
]
