"""p4runtime-shell against the soft switch: a third-party P4Runtime client, unmodified.

Each session runs in a subprocess (``python -c``): p4runtime-shell keeps its client in
module globals, prints as it builds messages, and exits or blocks the interpreter when
its setup fails. The script prints one ``RESULT <json>`` line with what it read back;
the test checks it, and checks the switch itself with the controller library.

Behaviour of p4runtime-shell 0.0.6 these tests rely on: ``setup(verbose=...)`` also sets
``canonical_bytestrings`` (the two options are one enum member), so ``verbose=False``
sends zero-padded bytestrings; setup waits 2 s for an arbitration answer and only prints
that it is not primary; ``teardown()`` joins its stream thread with no timeout, so the
server must end the StreamChannel when the client half-closes; a Write failing with
UNKNOWN becomes ``P4RuntimeWriteException`` listing ``(index, p4.v1.Error)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers import bound_udp_sockets, switch_thread

from controller.client import NotPrimaryError
from controller.switch import SwitchController
from emulation.softswitch.pipeline import Pipeline
from emulation.softswitch.server import SwitchServer
from hostlib.protocol import (
    HEADER_SIZE,
    SWITCH_DROPS,
    SWITCH_STATS,
    Header,
    PacketType,
    pack_header,
    unpack_header,
)

LANES = 4
SLOTS = 16
JOB = 5
MGID = 3
SHELL_TIMEOUT = 60.0

PRELUDE = """
import json
import p4runtime_sh.shell as sh
from p4runtime_sh.p4runtime import P4RuntimeWriteException
from google.rpc import code_pb2

def number(data):
    return int.from_bytes(data, "big")

def row(entry, fields, params):
    out = {{f: number(entry.match[f].exact.value) for f in fields}}
    out["action"] = entry.action.action_name
    out.update({{p: number(entry.action[p].value) for p in params}})
    return out

sh.setup(
    device_id={device_id},
    grpc_addr={address!r},
    election_id={election!r},
    config=None,
    verbose={verbose!r},
)
"""


@pytest.fixture
def switch() -> Iterator[SwitchServer]:
    with switch_thread(Pipeline(LANES, SLOTS), join_timeout=5.0) as server:
        yield server


def address_of(server: SwitchServer) -> str:
    host, port = server.p4runtime_addr
    return f"{host}:{port}"


def run_shell(
    server: SwitchServer,
    body: str,
    *,
    election: tuple[int, int] = (0, 1),
    device_id: int = 0,
    verbose: bool = True,
) -> subprocess.CompletedProcess[str]:
    prelude = PRELUDE.format(
        device_id=device_id, address=address_of(server), election=election, verbose=verbose
    )
    script = prelude + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=SHELL_TIMEOUT,
        check=False,
    )


def result_of(proc: subprocess.CompletedProcess[str]) -> Any:
    """The JSON the script printed on its ``RESULT`` line."""
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0][len("RESULT ") :])


SESSION = """
result = {{}}
try:
    job = sh.TableEntry("Ingress.jobs.jobs")(action="Ingress.jobs.set_job")
    job.match["job_id"] = "{job}"
    job.action["num_workers"] = "1"
    job.action["slot_base"] = "2"
    job.action["slot_count"] = "4"
    job.action["mgid"] = "{mgid}"
    job.insert()

    worker = sh.TableEntry("Ingress.workers.workers")(action="Ingress.workers.worker_hit")
    worker.match["job_id"] = "{job}"
    worker.match["rank"] = "0"
    worker.match["ipv4_src"] = "{ip}"
    worker.match["udp_src_port"] = "{port}"
    worker.insert()

    replica = sh.TableEntry("Egress.replicas.replicas")(
        action="Egress.replicas.set_destination"
    )
    replica.match["job_id"] = "{job}"
    replica.match["egress_rid"] = "0"
    replica.match["egress_port"] = "0"
    replica.action["dst_mac"] = "00:00:00:00:00:00"
    replica.action["dst_ip"] = "{ip}"
    replica.action["dst_port"] = "{port}"
    replica.insert()

    sh.MulticastGroupEntry({mgid}).add(0, 0).insert()

    try:
        job.insert()
    except P4RuntimeWriteException as exc:
        result["duplicate"] = [
            [index, code_pb2.Code.Name(error.canonical_code)] for index, error in exc.errors
        ]

    jobs = list(sh.TableEntry("Ingress.jobs.jobs").read())
    result["jobs"] = [
        row(e, ["job_id"], ["num_workers", "slot_base", "slot_count", "mgid"]) for e in jobs
    ]
    result["job_id_bytes"] = [e.match["job_id"].exact.value.hex() for e in jobs]
    result["workers"] = [
        row(e, ["job_id", "rank", "ipv4_src", "udp_src_port"], [])
        for e in sh.TableEntry("Ingress.workers.workers").read()
    ]
    result["groups"] = {{
        str(g.group_id): [[r.egress_port, r.instance] for r in g.replicas]
        for g in sh.MulticastGroupEntry().read()
    }}
    result["ina_stats"] = [
        [c.index, c.packet_count] for c in sh.CounterEntry("Ingress.ina_stats").read()
    ]
    drops = sh.CounterEntry("Ingress.drops")
    drops.index = {unknown_job}
    result["unknown_job"] = [[c.index, c.packet_count] for c in drops.read()]
finally:
    sh.teardown()
print("RESULT " + json.dumps(result))
"""


def send_data(sock: Any, to: tuple[str, int], job_id: int, slot: int) -> None:
    header = pack_header(Header(PacketType.DATA, job_id, 0, slot, 0, 1, LANES, 0))
    sock.sendto(header + np.arange(1, LANES + 1, dtype=">i4").tobytes(), to)


@pytest.mark.parametrize("canonical", [True, False], ids=["canonical", "padded"])
def test_shell_session_installs_a_job(switch: SwitchServer, canonical: bool) -> None:
    unknown_job = SWITCH_DROPS.index("unknown_job")
    with bound_udp_sockets(1) as (sock,):
        ip, port = sock.getsockname()
        send_data(sock, switch.data_addr, 77, 0)  # no job 77: counted as unknown_job
        deadline = time.monotonic() + 5.0
        while switch.counters()["drop_unknown_job"] != 1:
            assert time.monotonic() < deadline, "the switch never counted the datagram"
            time.sleep(0.01)
        body = SESSION.format(job=JOB, mgid=MGID, ip=ip, port=port, unknown_job=unknown_job)
        result = result_of(run_shell(switch, body, verbose=canonical))

        assert result["duplicate"] == [[0, "ALREADY_EXISTS"]]
        params = {"num_workers": 1, "slot_base": 2, "slot_count": 4, "mgid": MGID}
        assert result["jobs"] == [{"job_id": JOB, "action": "Ingress.jobs.set_job", **params}]
        assert result["job_id_bytes"] == ["05"]  # read back canonical, however written
        ip_value = int.from_bytes(bytes(map(int, ip.split("."))), "big")
        assert result["workers"] == [
            {
                "job_id": JOB,
                "rank": 0,
                "ipv4_src": ip_value,
                "udp_src_port": port,
                "action": "Ingress.workers.worker_hit",
            }
        ]
        assert result["groups"] == {str(MGID): [[0, 0]]}
        assert result["ina_stats"] == [[0, 1]] + [[i, 0] for i in range(1, len(SWITCH_STATS))]
        assert result["unknown_job"] == [[unknown_job, 1]]

        # The shell's writes landed: the controller library reads them back ...
        with SwitchController.connect(address_of(switch), timeout=5.0) as ctl:
            (installed,) = ctl.installed_jobs()
            assert (installed.job_id, installed.entry.mgid, installed.group) == (
                JOB,
                MGID,
                ((0, 0),),
            )
            assert [(w.rank, w.ip, w.udp_port) for w in installed.workers] == [(0, ip, port)]
            assert [(r.rid, r.ip, r.udp_port) for r in installed.replicas] == [(0, ip, port)]
            # ... and the data plane runs the job: one worker completes a slot alone.
            send_data(sock, switch.data_addr, JOB, 1)
            data = sock.recv(4096)
            assert ctl.counters()["completed"] == 1
        header = unpack_header(data)
        assert (header.ptype, header.job_id, header.slot) == (PacketType.RESULT, JOB, 1)
        assert np.frombuffer(data, ">i4", offset=HEADER_SIZE).tolist() == [1, 2, 3, 4]


BACKUP = """
try:
    print("READ", len(list(sh.TableEntry("Ingress.jobs.jobs").read())))
    job = sh.TableEntry("Ingress.jobs.jobs")(action="Ingress.jobs.set_job")
    job.match["job_id"] = "1"
    for name, value in (("num_workers", "1"), ("slot_base", "0"), ("slot_count", "1")):
        job.action[name] = value
    job.action["mgid"] = "1"
    job.insert()
finally:
    sh.teardown()
"""


def test_shell_below_the_primary_cannot_write(switch: SwitchServer) -> None:
    with SwitchController.connect(address_of(switch), election_id=(0, 10), timeout=5.0) as ctl:
        proc = run_shell(switch, BACKUP, election=(0, 1))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "You are not the primary client" in proc.stdout
        assert "READ 0" in proc.stdout  # a backup reads
        assert "PERMISSION_DENIED" in proc.stderr  # the insert raised
        assert ctl.is_primary
        assert ctl.installed_jobs() == []


TAKEOVER = """
job = sh.TableEntry("Ingress.jobs.jobs")(action="Ingress.jobs.set_job")
job.match["job_id"] = "1"
for name, value in (("num_workers", "1"), ("slot_base", "0"), ("slot_count", "1")):
    job.action[name] = value
job.action["mgid"] = "1"
job.insert()
sh.teardown()
print("RESULT {}")
"""


def test_shell_above_the_primary_takes_over_and_mastership_must_be_taken_back(
    switch: SwitchServer,
) -> None:
    with SwitchController.connect(address_of(switch), election_id=(0, 1), timeout=5.0) as ctl:
        result_of(run_shell(switch, TAKEOVER, election=(0, 5)))
        # The shell's teardown half-closed its stream. P4Runtime's rule: the primary is the
        # holder of the highest id ever seen, so nobody is now, and (0, 1) stays a backup.
        time.sleep(0.2)
        assert not ctl.is_primary
        with pytest.raises(NotPrimaryError):
            ctl.jobs.delete(1)
        assert not ctl.client.rearbitrate((0, 4))  # below the shell's: still nobody
        assert ctl.client.rearbitrate((0, 5))  # at least the highest seen: primary again
        assert [j.entry.job_id for j in ctl.installed_jobs()] == [1]
        ctl.jobs.delete(1)


def test_shell_setup_on_an_unknown_device_fails(switch: SwitchServer) -> None:
    proc = run_shell(switch, "print('AFTER SETUP')\n", device_id=3)
    assert proc.returncode == 1
    assert "AFTER SETUP" not in proc.stdout
    assert "NOT_FOUND" in proc.stderr
    assert "Failed to establish session" in proc.stderr
