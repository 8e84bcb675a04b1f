"""simple_switch_grpc as a process (no Mininet, no root): it dies with its parent, and
what its P4Runtime server does with registers (the reason the controller uses Thrift).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import assert_child_dies_with_its_parent

from controller.client import P4RuntimeError
from controller.switch import SwitchController
from emulation.bmv2 import Bmv2Process

pytestmark = [pytest.mark.bmv2, pytest.mark.slow]


@pytest.fixture
def bmv2(tmp_path: Path) -> Iterator[Bmv2Process]:
    with Bmv2Process(tmp_path, name="s1") as proc:
        yield proc
    assert not proc.is_running()


def test_bmv2_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    assert_child_dies_with_its_parent(
        "from pathlib import Path\n"
        "from emulation.bmv2 import Bmv2Process\n"
        f"pid = Bmv2Process(Path({str(tmp_path)!r})).start().pid"
    )


def test_registers_go_over_thrift_because_p4runtime_refuses_them(bmv2: Bmv2Process) -> None:
    with bmv2.controller() as ctl:
        ctl.set_drops(0.25, 0.5)  # over Thrift
        assert ctl.drop_simulator.get() == pytest.approx((0.25, 0.5), abs=1e-9)
        # bmv2's own P4Runtime server, asked directly, does not serve register entries.
        plain = SwitchController.connect(bmv2.p4runtime_address, election_id=(0, 2))
        with plain:
            with pytest.raises(P4RuntimeError, match="UNIMPLEMENTED: Register writes"):
                plain.set_drops(0.1, 0.1)
            with pytest.raises(P4RuntimeError, match="UNIMPLEMENTED: Register reads"):
                plain.registers.read("Ingress.seq", [0])
