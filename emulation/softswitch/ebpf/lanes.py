"""The reordering lanes of a switch port: the queue the eBPF program holds frames back in.

TC has no timer a program could hold a frame with, and this kernel has no netem; what
holds frames here is the link's shaper. A port whose link reorders frames has its link's
HTB class (``5:1`` under the root ``5:``, as Mininet's TCLink makes it) split into two
lanes that borrow all of its rate: frames in order (``5:3``, priority 0) and frames held
back (``5:4``, priority 1). HTB lends the class's rate to the lane of lower priority
first, so a held-back frame leaves only when the in-order lane has nothing to send, and
every frame queued meanwhile overtakes it; on an idle link nothing is there to overtake
it. The program puts every frame out of such a port in one lane by ``skb->priority`` (a
frame in neither would go to HTB's unshaped direct queue). The link's rate stays its
class's, so ``tc class change ... classid 5:1`` still changes it.

Why not a second class beside ``5:1`` (simpler to add): a class of its own has tokens of
its own, so it sends while ``5:1`` waits for its tokens: the held frames would jump the
queue, and the link would carry more than its rate. Why not the CPU's receive queue
(putting the frame back with ``bpf_clone_redirect(..., BPF_F_INGRESS)``): frames reach a
switch one at a time and are taken one at a time, so measured, not one held-back frame
in several hundred was overtaken.

The emulation makes the lanes (:func:`lane_commands`, after the link's own shaping) and
they go with the interface; the switch refuses a reordering link on a port without them
(:func:`has_lanes`) rather than count frames as held back that nothing holds.
"""

from __future__ import annotations

import subprocess

__all__ = ["LANE_HELD", "LANE_IN_ORDER", "LANE_QUANTUM", "has_lanes", "lane_commands"]

LANE_IN_ORDER = 0x50003
"""HTB class ``5:3`` (as ``skb->priority``): the lane of frames in order."""

LANE_HELD = 0x50004
"""HTB class ``5:4``: the lane of frames held back."""

LANE_QUANTUM = 60000
"""Bytes a lane sends per round: above a jumbo frame (9014 B), as the link's class."""

_CEIL = "100gbit"  # a lane borrows all its link class lends, whatever its rate becomes
_OWN = "rate 1kbit burst 1600"  # HTB wants a rate; borrowing is what a lane lives on


def _handle(classid: int) -> str:
    return f"{classid >> 16:x}:{classid & 0xFFFF:x}"


def lane_commands(interface: str, queue: int | None = None) -> list[list[str]]:
    """The ``tc`` commands (argument lists) that give ``interface``'s link class
    ``5:1`` its two lanes, each with a pfifo of ``queue`` packets when given (the link's
    ``queue``; else the interface's default).

    Raises:
        ValueError: ``queue`` below 1.
    """
    if queue is not None and queue < 1:
        raise ValueError(f"queue {queue} is not at least 1")
    commands = []
    for prio, classid in enumerate((LANE_IN_ORDER, LANE_HELD)):
        lane = _handle(classid)
        commands.append(
            ["tc", "class", "add", "dev", interface, "parent", "5:1", "classid", lane, "htb",
             *_OWN.split(), "ceil", _CEIL, "cburst", str(LANE_QUANTUM),
             "quantum", str(LANE_QUANTUM), "prio", str(prio)]
        )  # fmt: skip
        if queue is not None:
            handle = f"{(classid & 0xFFFF) + 0x10:x}:"
            commands.append(["tc", "qdisc", "add", "dev", interface, "parent", lane,
                             "handle", handle, "pfifo", "limit", str(queue)])  # fmt: skip
    return commands


def has_lanes(interface: str) -> bool:
    """Whether ``interface`` has both lanes (asks ``tc``).

    Raises:
        OSError: ``tc`` cannot be run.
    """
    found = 0
    for classid in (LANE_IN_ORDER, LANE_HELD):
        lane = _handle(classid)
        out = subprocess.run(["tc", "class", "show", "dev", interface, "classid", lane],
                             capture_output=True, text=True, check=False).stdout  # fmt: skip
        found += f"class htb {lane} parent 5:1 " in out
    return found == 2
