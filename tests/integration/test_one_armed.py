"""Reduction servers (issue #22): ``inalab switch --one-armed eth0`` on machines of a
cluster (``tests/cluster.py``: namespaces on a Linux bridge, no Mininet), configured from
another machine over P4Runtime with mutual TLS (their management addresses are not
loopback), serving INA ranks that run as processes on four other machines, through one
aggregator or striped across two (``hostlib.session.StripedInaSession``).

What must hold: every rank gets the exact sum; the results reach the ranks as unicast
datagrams from the server's address; the server's other traffic (a TCP connection, ARP,
the P4Runtime connection itself) passes untouched while it aggregates; packets to the
server's INA port from an address that is no worker change no job's state; and an
aggregator killed mid-run ends every rank's run with an error naming it, within the
deadline, leaving nothing attached to its interface.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cluster import Cluster, one_armed_server
from ina_worker import inputs

from controller.switch import SwitchController, WorkerAddress
from controller.tls import TlsFiles
from emulation.softswitch.ebpf.lanes import lane_commands
from hostlib.protocol import INA_UDP_PORT, Header, PacketType, pack_header
from hostlib.session import stripe_bounds

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "ina_worker.py"
LANES = 256
SLOTS = 8
JOB = 5
RANKS = 4
AGG_OCTET = 100
AGGREGATORS = {"agg": AGG_OCTET, "agg2": 101, "agg3": 102, "agg4": 103}
"""agg and agg2 serve the module; agg3 and agg4 serve single tests (lossy links, a kill)."""
FAULTS = "loss=0.05,dup=0.05,reorder=0.1,ingress"
"""An aggregator's link, both ways (every INA frame crosses it): emulated by its program."""
FORGED_SLOTS = (0, 1, 2)
"""The slots the forged packets name (set 0): a slot read over TLS is ~260 RPCs."""
WORKER_MBIT, AGG_MBIT = 1000.0, 4000.0
"""HTB on every machine's link: the aggregator's faster, as in real deployments."""

pytestmark = [
    pytest.mark.root,
    pytest.mark.ebpf,
    pytest.mark.engine_neutral,  # a deployment: the engines' own tests run twice
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(
        ["bash", str(REPO / "examples" / "make-certs.sh"), str(d),
         "switch:" + ",".join(f"10.77.0.{o}" for o in AGGREGATORS.values()), "ctl"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return {
        name: TlsFiles.parse(f"{d / name}.crt,{d / name}.key,{d / 'ca.crt'}")
        for name in ("switch", "ctl")
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    machines = {f"w{r}": r + 1 for r in range(RANKS)} | AGGREGATORS | {"intruder": 66}
    rates = {name: WORKER_MBIT for name in machines} | dict.fromkeys(AGGREGATORS, AGG_MBIT)
    with Cluster(machines, rates=rates) as c:
        yield c


@contextlib.contextmanager
def _serving(machine: Any, pki: dict[str, TlsFiles], run: Path,
             *extra: str) -> Iterator[dict[str, Any]]:  # fmt: skip
    """``inalab switch --one-armed eth0`` on ``machine`` (and ``extra`` arguments); its
    ready file's content, with its log and process; it must end cleanly or killed."""
    with one_armed_server(machine, run, str(pki["switch"]), "-v", "--lanes", str(LANES),
                          "--slots", "64", *extra) as info:  # fmt: skip
        yield info
    code = info["proc"].returncode
    assert code in (0, -signal.SIGKILL), info["log"].read_text()


@pytest.fixture(scope="module")
def server(
    cluster: Cluster, pki: dict[str, TlsFiles], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    with _serving(cluster["agg"], pki, tmp_path_factory.mktemp("agg")) as info:
        yield info


@pytest.fixture(scope="module")
def server2(
    cluster: Cluster, pki: dict[str, TlsFiles], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    with _serving(cluster["agg2"], pki, tmp_path_factory.mktemp("agg2")) as info:
        yield info


def _controller(server: dict[str, Any], pki: dict[str, TlsFiles]) -> SwitchController:
    return SwitchController.connect(server["p4runtime"], tls=pki["ctl"], timeout=10)


def _workers(cluster: Cluster, k: int = 0) -> list[WorkerAddress]:
    """The ranks' addresses for aggregator ``k`` (a port per aggregator)."""
    return [WorkerAddress(cluster[f"w{r}"].ip, 41000 + 100 * k + r) for r in range(RANKS)]


def _start_ranks(cluster: Cluster, servers: list[dict[str, Any]], calls: int, elements: int,
                 dtype: str, deadline: float = 20.0) -> list[subprocess.Popen[str]]:  # fmt: skip
    """tests/ina_worker.py on each worker machine, striped when given two servers."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = []
    for r in range(RANKS):
        machine = cluster[f"w{r}"]
        binds = [[a.ip, a.udp_port] for a in (_workers(cluster, k)[r] for k in range(len(servers)))]
        switches = [s["data"] for s in servers]
        striped = len(servers) > 1
        spec = {"bind": binds if striped else binds[0],
                "switch": switches if striped else switches[0], "job": JOB,
                "rank": r, "workers": RANKS, "lanes": LANES, "slots": SLOTS,
                "elements": elements, "dtype": dtype, "calls": calls, "seed": 7,
                "deadline": deadline}  # fmt: skip
        procs.append(subprocess.Popen(
            machine.command([sys.executable, str(WORKER), json.dumps(spec)]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        ))  # fmt: skip
    return procs


def _reports(procs: list[subprocess.Popen[str]], ok: bool = True) -> list[dict[str, Any]]:
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == (0 if ok else 3), (stdout, stderr)
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


def _run_ranks(cluster: Cluster, server: dict[str, Any], calls: int, elements: int,
               dtype: str) -> list[dict[str, Any]]:  # fmt: skip
    return _reports(_start_ranks(cluster, [server], calls, elements, dtype))


def _expected(calls: int, elements: int, dtype: str) -> list[np.ndarray]:
    out = []
    for c in range(calls):
        xs = [inputs(7, r, c, elements, dtype).astype(np.int64) for r in range(RANKS)]
        out.append(np.sum(xs, axis=0).astype(np.int32))
    return out


def test_the_ready_file_names_the_servers_ina_address(
    server: dict[str, Any], cluster: Cluster
) -> None:
    assert server["data"] == [cluster["agg"].ip, INA_UDP_PORT]
    assert server["interfaces"] == {"1": "eth0"}
    assert server["p4runtime_tls"] is True


def test_ranks_on_other_machines_get_exact_sums_while_tcp_to_the_server_works(
    cluster: Cluster, server: dict[str, Any], pki: dict[str, TlsFiles]
) -> None:
    workers = _workers(cluster)
    echo = _tcp_echo_server(cluster["agg"])
    try:
        with _controller(server, pki) as ctl:
            ctl.add_job(JOB, workers, SLOTS)
            before = ctl.counters()
            pings = _TcpPinger(cluster["agg"].ip)
            pings.start()
            try:
                outs = _run_ranks(cluster, server, calls=3, elements=100_003, dtype="int32")
            finally:
                pings.stop()
            after = ctl.counters()
            ctl.remove_job(JOB)
    finally:
        echo.kill()
        echo.wait()
    want = [hashlib.sha256(x.tobytes()).hexdigest() for x in _expected(3, 100_003, "int32")]
    for out in outs:
        assert out["sha256"] == want, out
    assert pings.rounds >= 3 and pings.failures == 0, (pings.rounds, pings.failures)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    packets = 3 * -(-100_003 // LANES)
    assert delta["completed"] == packets, delta
    assert delta["results_sent"] >= RANKS * packets, delta
    assert delta.get("drop_bad_source", 0) == 0, delta
    log = server["log"].read_text()
    assert "P4Runtime: 10.77.0.254:" in log and "connected as ctl" in log, log


def test_ranks_get_exact_sums_striped_across_two_aggregators(
    cluster: Cluster,
    server: dict[str, Any],
    server2: dict[str, Any],
    pki: dict[str, TlsFiles],
) -> None:
    calls, elements = 3, 100_003
    servers = [server, server2]
    echoes = [_tcp_echo_server(cluster[name]) for name in ("agg", "agg2")]
    pings = [_TcpPinger(cluster[name].ip) for name in ("agg", "agg2")]
    try:
        with _controller(server, pki) as ctl, _controller(server2, pki) as ctl2:
            ctls = [ctl, ctl2]
            for k, c in enumerate(ctls):
                c.add_job(JOB, _workers(cluster, k), SLOTS)
            before = [c.counters() for c in ctls]
            for p in pings:
                p.start()
            try:
                outs = _reports(_start_ranks(cluster, servers, calls, elements, "int32"))
            finally:
                for p in pings:
                    p.stop()
            after = [c.counters() for c in ctls]
            for c in ctls:
                c.remove_job(JOB)
    finally:
        for echo in echoes:
            echo.kill()
            echo.wait()
    want = [hashlib.sha256(x.tobytes()).hexdigest() for x in _expected(calls, elements, "int32")]
    for out in outs:
        assert out["sha256"] == want, out
    for p in pings:
        assert p.rounds >= 3 and p.failures == 0, (p.rounds, p.failures)
    for k in range(2):  # each aggregator completed exactly its stripe's packets
        lo, hi = stripe_bounds(elements, LANES, 2, k)
        delta = {key: after[k][key] - before[k].get(key, 0) for key in after[k]}
        assert delta["completed"] == calls * -(-(hi - lo) // LANES), (k, delta)
        assert delta.get("drop_bad_source", 0) == 0, (k, delta)


@pytest.mark.timeout(240)
def test_an_aggregator_killed_mid_run_fails_every_rank_naming_it(
    cluster: Cluster,
    server: dict[str, Any],
    pki: dict[str, TlsFiles],
    tmp_path: Path,
) -> None:
    """kill -9 of the second aggregator's switch: every rank's call ends with the
    error naming it within the deadline, every rank process exits, and nothing stays on
    the dead server's interface (its program went with its process: an INA datagram to
    it then reaches its host's socket)."""
    deadline = 3.0
    agg3 = cluster["agg3"]
    with _serving(agg3, pki, tmp_path) as server3:
        with _controller(server, pki) as ctl, _controller(server3, pki) as ctl3:
            for k, c in enumerate((ctl, ctl3)):
                c.add_job(JOB, _workers(cluster, k), SLOTS)
            try:
                procs = _start_ranks(cluster, [server, server3], 10_000, 50_000, "int32",
                                     deadline=deadline)  # fmt: skip
                start = ctl3.counters()["completed"]
                waited = time.monotonic() + 60
                while ctl3.counters()["completed"] < start + 50:  # calls through both
                    assert time.monotonic() < waited and all(p.poll() is None for p in procs)
                    time.sleep(0.05)
                server3["proc"].send_signal(signal.SIGKILL)
                killed = time.monotonic()
                outs = _reports(procs, ok=False)
                took = time.monotonic() - killed
            finally:
                ctl.remove_job(JOB)
        assert server3["proc"].wait(timeout=10) == -signal.SIGKILL
    where = f"aggregator 2 of 2 ({agg3.ip}:{INA_UDP_PORT})"
    for out in outs:
        assert where in out["error"] and "no result from switch" in out["error"], out
        assert out["calls_done"] > 0 and out["failed_after"] <= deadline + 1.0, out
    assert took <= 2 * deadline + 5.0, took
    # Nothing left on agg3's eth0: no clsact filter, and INA datagrams reach its stack.
    filters = subprocess.run(agg3.command(["tc", "filter", "show", "dev", "eth0", "ingress"]),
                             capture_output=True, text=True, check=False)  # fmt: skip
    assert "bpf" not in filters.stdout, filters.stdout
    script = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"s.bind(('{agg3.ip}', {INA_UDP_PORT})); s.settimeout(10)\n"
        "print(len(s.recvfrom(65536)[0]), flush=True)\n"
    )
    listener = subprocess.Popen(agg3.command([sys.executable, "-c", script]),
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(1.0)
    packet = pack_header(Header(PacketType.DATA, JOB, 0, 0, 0, 1, 4, 0)) + bytes(16)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(5):
            s.sendto(packet, (agg3.ip, INA_UDP_PORT))
            time.sleep(0.1)
    stdout, _ = listener.communicate(timeout=20)
    assert listener.returncode == 0 and int(stdout) == len(packet), stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_loss_duplication_and_reordering_on_the_aggregators_links_change_no_bit(
    cluster: Cluster,
    server: dict[str, Any],
    server2: dict[str, Any],
    pki: dict[str, TlsFiles],
    tmp_path: Path,
    dtype: str,
) -> None:
    """The same calls striped across two lossless aggregators, then across two whose
    links lose, duplicate and reorder 5%, 5% and 10% of the frames each way: every rank's
    results are the same bits."""
    calls, elements = 3, 60_001

    def run(servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        with _controller(servers[0], pki) as c0, _controller(servers[1], pki) as c1:
            for k, c in enumerate((c0, c1)):
                c.add_job(JOB, _workers(cluster, k), SLOTS)
            try:
                return _reports(_start_ranks(cluster, servers, calls, elements, dtype))
            finally:
                for c in (c0, c1):
                    c.remove_job(JOB)

    clean = run([server, server2])
    with contextlib.ExitStack() as stack:
        lossy = []
        for name in ("agg3", "agg4"):
            machine = cluster[name]
            shown = subprocess.run(machine.command(["tc", "class", "show", "dev", "eth0"]),
                                   capture_output=True, text=True, check=True).stdout  # fmt: skip
            if "5:4" not in shown:  # the lanes the program holds frames back in, once
                for command in lane_commands("eth0"):
                    subprocess.run(machine.command(command), check=True, capture_output=True)
            stats = tmp_path / f"{name}-links.json"
            lossy.append(stack.enter_context(_serving(
                machine, pki, tmp_path / name, "--link", f"1:{FAULTS}", "--link-stats",
                str(stats))))  # fmt: skip
        faulty = run(lossy)
    assert len({tuple(r["sha256"]) for r in clean}) == 1, clean
    for got in faulty:
        assert got["sha256"] == clean[0]["sha256"], got
    if dtype == "int32":
        want = [x.tobytes() for x in _expected(calls, elements, dtype)]
        assert clean[0]["sha256"] == [hashlib.sha256(b).hexdigest() for b in want]
    assert sum(r["retransmissions"] for r in faulty) > 0
    for name in ("agg3", "agg4"):  # the links did lose, copy and hold back frames
        counts = json.loads((tmp_path / f"{name}-links.json").read_text())["ports"]["1"]
        for way in ("ingress", "egress"):
            c = counts[way]
            assert c["lost"] > 0 and c["duplicated"] > 0, (name, way, c)
        assert counts["egress"]["reordered"] > 0, (name, counts)


def test_forged_and_malformed_packets_change_no_jobs_state(
    cluster: Cluster, server: dict[str, Any], pki: dict[str, TlsFiles]
) -> None:
    workers = _workers(cluster)
    with _controller(server, pki) as ctl:
        ctl.add_job(JOB, workers, SLOTS)
        try:
            before_slots = [ctl.read_slot(JOB, s, 0) for s in FORGED_SLOTS]
            before = ctl.counters()
            # From a machine that is no worker: well-formed DATA as each rank, a RESULT,
            # a short datagram, and a wrong lane count; and from a worker's address but
            # another port.
            script = _forger_script(server["data"], JOB, LANES)
            subprocess.run(cluster["intruder"].command([sys.executable, "-c", script]),
                           check=True, timeout=60, capture_output=True)  # fmt: skip
            subprocess.run(cluster["w0"].command([sys.executable, "-c", script]),
                           check=True, timeout=60, capture_output=True)  # fmt: skip
            time.sleep(0.5)
            after = ctl.counters()
            after_slots = [ctl.read_slot(JOB, s, 0) for s in FORGED_SLOTS]
        finally:
            ctl.remove_job(JOB)
    assert after_slots == before_slots  # no register of a named slot changed
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["aggregated"] == 0 and delta["completed"] == 0, delta
    assert delta["results_sent"] == 0, delta
    dropped = sum(v for k, v in delta.items() if k.startswith("drop_"))
    assert dropped == delta["received"] > 0, delta


# ----------------------------------------------------------------- helpers
def _forger_script(switch: list[Any], job: int, lanes: int) -> str:
    packets = []
    payload = np.arange(lanes, dtype=">i4").tobytes()
    for rank in range(RANKS):
        h = Header(PacketType.DATA, job, rank, 0, 0, 1, lanes, rank)
        packets.append(pack_header(h) + payload)
    packets.append(pack_header(Header(PacketType.RESULT, job, 0, 1, 0, 1, lanes, 0)) + payload)
    packets.append(b"\x00" * 5)
    packets.append(pack_header(Header(PacketType.DATA, job, 0, 2, 0, 1, lanes - 1, 0))
                   + payload[:-4])  # fmt: skip
    return (
        "import socket\n"
        f"packets = {packets!r}\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.bind(('', 41999))\n"
        f"for p in packets * 3: s.sendto(p, ({switch[0]!r}, {switch[1]}))\n"
    )


def _tcp_echo_server(machine: Any) -> subprocess.Popen[bytes]:
    script = (
        "import socket, threading\n"
        "srv = socket.create_server(('0.0.0.0', 7007))\n"
        "while True:\n"
        "    c, _ = srv.accept()\n"
        "    def echo(c=c):\n"
        "        while (d := c.recv(65536)): c.sendall(d)\n"
        "    threading.Thread(target=echo, daemon=True).start()\n"
    )
    proc = subprocess.Popen(machine.command([sys.executable, "-c", script]))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection((machine.ip, 7007), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the echo server did not start")


class _TcpPinger(threading.Thread):
    """One TCP connection to the server, kept busy with echoes while the ranks run."""

    def __init__(self, ip: str) -> None:
        super().__init__(daemon=True)
        self.conn = socket.create_connection((ip, 7007), timeout=5)
        self.rounds = 0
        self.failures = 0
        self._done = threading.Event()

    def run(self) -> None:
        message = os.urandom(32 * 1024)
        while not self._done.is_set():
            try:
                self.conn.sendall(message)
                got = b""
                while len(got) < len(message):
                    chunk = self.conn.recv(len(message) - len(got))
                    if not chunk:
                        raise ConnectionError("closed")
                    got += chunk
                if got != message:
                    self.failures += 1
                self.rounds += 1
            except OSError:
                self.failures += 1
                return
            time.sleep(0.05)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)
        self.conn.close()


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    ("machines", "aggregators"), [(4, 1), (4, 2), (2, 1)], ids=["4x1-1", "4x1-2", "2x2-1"]
)
def test_torchrun_ranks_on_the_machines_train_ddp_through_the_servers(
    cluster: Cluster,
    server: dict[str, Any],
    server2: dict[str, Any],
    pki: dict[str, TlsFiles],
    machines: int,
    aggregators: int,
) -> None:
    """The README's deployment: torchrun on each worker machine (static rendezvous at
    machine w0), the ``"ina"`` backend told only the servers' data and P4Runtime
    addresses and the controller's certificate; each rank binds the address its routes
    use toward each server, and rank 0 installs the job on each over mutual TLS. Four
    machines of one rank, or two of two (``--nproc-per-node 2``): then CollNet, each
    machine's first rank the server's worker, its second adding in shared memory."""
    servers = [server, server2][:aggregators]
    per_machine = RANKS // machines
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "INALAB_SWITCH": ",".join("{}:{}".format(*s["data"]) for s in servers),
        "INALAB_P4RUNTIME": ",".join(s["p4runtime"] for s in servers),
        "INALAB_P4RUNTIME_TLS": str(pki["ctl"]),
        "INALAB_JOB": "1",
        "INALAB_SLOTS": str(SLOTS),
    }
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    before = []
    for s in servers:
        with _controller(s, pki) as ctl:
            before.append(ctl.counters()["completed"])
    names = ["agg", "agg2"][:aggregators]
    echoes = [_tcp_echo_server(cluster[name]) for name in names]
    pings = [_TcpPinger(cluster[name].ip) for name in names]  # busy throughout the job
    procs = []
    try:
        for p in pings:
            p.start()
        for r in range(machines):
            argv = [torchrun, "--nnodes", str(machines), "--nproc-per-node", str(per_machine),
                    "--node-rank", str(r), "--master-addr", cluster["w0"].ip,
                    "--master-port", "29500", str(REPO / "examples" / "ddp_digits.py"),
                    "--epochs", "2"]  # fmt: skip
            procs.append(subprocess.Popen(cluster[f"w{r}"].command(argv),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env))  # fmt: skip
        reports = []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=400)
            assert proc.returncode == 0, stderr[:6000]
            reports += [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    finally:
        for p in pings:
            p.stop()
        for echo in echoes:
            echo.kill()
            echo.wait()
    for p in pings:
        assert p.rounds >= 10 and p.failures == 0, (p.rounds, p.failures)
    assert sorted(r["rank"] for r in reports) == list(range(RANKS)), reports
    for r in reports:
        # One model trained twice from one seed: INA's float32 sums are within its bound
        # of Gloo's, which leaves the accuracy on 360 test digits where Gloo's is.
        assert abs(r["ina"]["accuracy"] - r["gloo"]["accuracy"]) <= 0.02, r
        assert r["ina"]["accuracy"] > 0.5, r
        # torchrun numbers a machine's ranks in a row: its first is the server's worker.
        head = r["rank"] % per_machine == 0
        assert r["collnet"] == (per_machine > 1) and (r["ina_packets"] > 0) == head, r
    completed = 0
    for s, was in zip(servers, before, strict=True):
        with _controller(s, pki) as ctl:
            assert ctl.installed_jobs() == []  # rank 0 removed its job at shutdown
            done = ctl.counters()["completed"] - was
            assert done > 0, s  # every aggregator took its stripes
            completed += done
    rank0 = next(r for r in reports if r["rank"] == 0)
    assert completed == rank0["ina_packets"], (completed, rank0)
    # Every machine's head unlinked the segment its ranks shared.
    for r in range(machines):
        count = "ls /dev/shm | grep -c inalab-cn-job1- || true"
        left = cluster[f"w{r}"].command(["sh", "-c", count])
        assert subprocess.run(left, capture_output=True, text=True).stdout.strip() == "0"
