"""The cluster recipe of ``docs/cluster.md`` run as written (issue #38): its lines for
the certificates, the aggregator (``sudo .venv/bin/inalab switch --one-armed eth0 ...``)
and the workers (``export INALAB_...`` then ``torchrun ... train.py``), on a cluster of
network namespaces (``tests/cluster.py``) whose hostname resolves to loopback, as
Debian's ``/etc/hosts`` makes it, and with no ``GLOO_SOCKET_IFNAME``: the ``"ina"``
backend's Gloo side must find the interface toward the master by itself.

Only the page's placeholders are filled in: the aggregator's address, ``R``,
``WORKER0`` and ``train.py`` (``examples/ddp_digits.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "cluster.md"
NET = 79
DOC_AGGREGATOR = "10.0.0.100"
WORKERS = 4

pytestmark = [
    pytest.mark.root,
    pytest.mark.ebpf,
    pytest.mark.slow,
    pytest.mark.engine_neutral,  # a deployment: the engines' own tests run twice
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
    pytest.mark.skipif(shutil.which("sudo") is None, reason="needs sudo (the page's lines)"),
]


def _block(containing: str) -> str:
    """The fenced code block of the page that contains ``containing``, continuation
    lines joined."""
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", PAGE.read_text(), re.DOTALL | re.M):
        if containing in block:
            return block.replace("\\\n", " ")
    raise AssertionError(f"{PAGE.name} has no code block with {containing!r}")


def _lines(block: str) -> list[str]:
    """A block's commands, comments dropped."""
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    machines = {f"w{r}": r + 1 for r in range(WORKERS)} | {"agg": 100}
    with Cluster(machines, net=NET) as c:
        yield c


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where the page's lines run: the repository root as a user has it (its virtual
    environment and examples), with the certificates made there."""
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    (tmp_path / "examples").symlink_to(REPO / "examples")
    return tmp_path


def _wait_for_port(ip: str, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            with socket.create_connection((ip, port), timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)


@pytest.mark.timeout(600)
def test_the_cluster_recipe_trains_as_written(cluster: Cluster, workdir: Path) -> None:
    agg = cluster["agg"].ip
    w0 = cluster["w0"]
    resolved = subprocess.run(w0.command(["getent", "hosts", socket.gethostname()]),
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert resolved.startswith("127."), resolved  # the case the recipe must survive
    certs, switch = _lines(_block("make-certs.sh"))
    subprocess.run(["bash", "-euo", "pipefail", "-c", certs.replace(DOC_AGGREGATOR, agg)],
                   cwd=workdir, check=True, capture_output=True, timeout=60)  # fmt: skip
    log = workdir / "aggregator.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLOO_", "INALAB_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    with log.open("wb") as out:
        server = subprocess.Popen(
            cluster["agg"].command(["bash", "-c", f"exec {switch.replace(DOC_AGGREGATOR, agg)}"]),
            cwd=workdir, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
    try:
        _wait_for_port(agg, 9559, server, log)
        reports = _train(cluster, workdir, env)
    finally:
        server.send_signal(signal.SIGTERM)  # sudo hands it on to inalab switch
        server.wait(timeout=60)
    assert sorted(r["rank"] for r in reports) == list(range(WORKERS)), reports
    for r in reports:
        assert r["ina_packets"] > 0 and r["ina"]["accuracy"] > 0.5, r
        assert abs(r["ina"]["accuracy"] - r["gloo"]["accuracy"]) <= 0.02, r
    # What the page says an operator reads when the server stops.
    assert "inalab switch: stopped; counters: " in log.read_text(), log.read_text()


def _train(cluster: Cluster, workdir: Path, env: dict[str, str]) -> list[dict[str, object]]:
    """The workers' block on every worker machine, its placeholders filled in; each
    rank's report line."""
    block = _block("torchrun --nnodes 4 --nproc-per-node 1")
    script = " && ".join(_lines(block.replace(DOC_AGGREGATOR, cluster["agg"].ip)))
    script = script.replace("--master-addr WORKER0", f"--master-addr {cluster['w0'].ip}")
    script = script.replace(" train.py", f" {REPO / 'examples' / 'ddp_digits.py'} --epochs 1")
    procs = []
    for r in range(WORKERS):
        mine = script.replace("--node-rank R ", f"--node-rank {r} ")
        procs.append(subprocess.Popen(
            cluster[f"w{r}"].command(["bash", "-euo", "pipefail", "-c", mine]), cwd=workdir,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        ))  # fmt: skip
    reports = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=420)
            assert proc.returncode == 0, stderr[-6000:]
            reports += [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    finally:
        for proc in procs:
            _stop_session(proc)
    return reports


def _stop_session(proc: subprocess.Popen[str]) -> None:
    """End a worker machine's shell and torchrun (its session) if still running:
    SIGTERM, which torchrun hands on to the ranks it started in sessions of their own,
    then SIGKILL."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
