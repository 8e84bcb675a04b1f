"""P4Runtime behind mutual TLS (issue #22, item 4): real switch processes, real
certificates from ``examples/make-certs.sh`` (openssl), real gRPC and ``inalab ctl``.

A controller with a certificate from the switch's CA configures the switch and an
allreduce runs through it; a plain-text client, a certificate from another CA, a
certificate made for a server, and a controller that does not trust the switch are
refused, each with its reason in the switch's log (one line, naming the peer) and in the
controller's error. Plain text on a non-loopback address is refused on both sides.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import worker_addresses

from controller.client import SwitchUnreachableError
from controller.switch import SwitchController
from controller.tls import TlsError, TlsFiles, TlsRequiredError, explain_refusal, require_tls
from emulation.softswitch import SoftSwitchProcess
from hostlib import InaSession, JobSpec
from hostlib.transport.udp import UdpTransport

REPO = Path(__file__).resolve().parents[2]
MAKE_CERTS = REPO / "examples" / "make-certs.sh"
CLI = [sys.executable, "-m", "emulation.cli"]

pytestmark = [
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
    pytest.mark.engine_neutral,  # the control plane: the engines' own tests run twice
]


def _make(dir: Path, *names: str) -> None:
    subprocess.run(
        ["bash", str(MAKE_CERTS), str(dir), "switch:127.0.0.1", *names],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    """The switch's and a controller's files from one CA; a controller of another CA."""
    good, other = tmp_path_factory.mktemp("pki"), tmp_path_factory.mktemp("other-pki")
    _make(good, "ctl")
    _make(other, "ctl")

    def files(d: Path, name: str, ca: Path | None = None) -> TlsFiles:
        return TlsFiles.parse(f"{d / name}.crt,{d / name}.key,{ca or d / 'ca.crt'}")

    return {
        "switch": files(good, "switch"),
        "ctl": files(good, "ctl"),
        # signed by another CA, presented to this switch
        "foreign": files(other, "ctl", ca=good / "ca.crt"),
        # this CA's server certificate, used as a client's (wrong purpose)
        "server_as_client": files(good, "switch"),
        # a good certificate, but trusting another CA for the switch
        "distrustful": files(good, "ctl", ca=other / "ca.crt"),
    }


@pytest.fixture(scope="module")
def tls_switch(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, TlsFiles]
) -> Any:
    run_dir = tmp_path_factory.mktemp("tls-switch")
    with SoftSwitchProcess(
        run_dir, lanes=8, slots=64, tls=pki["switch"], controller_tls=pki["ctl"]
    ) as sw:
        yield sw
    assert sw.returncode == 0, sw.log_path.read_text()


def _ctl(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "ctl", "--timeout", "3", *argv], capture_output=True, text=True, timeout=60,
        check=False, env=env,
    )  # fmt: skip


def _refusals(sw: SoftSwitchProcess) -> list[str]:
    return [line for line in sw.log_path.read_text().splitlines() if "P4Runtime: refused" in line]


def test_a_controller_with_a_certificate_installs_a_job_and_an_allreduce_runs(
    tls_switch: SoftSwitchProcess,
) -> None:
    assert tls_switch.ready_info["p4runtime_tls"] is True
    transports = [UdpTransport(("127.0.0.1", 0)) for _ in range(3)]
    try:
        with tls_switch.controller() as ctl:
            job = ctl.add_job(41, worker_addresses(t.local_addr for t in transports), 8)
            assert job.job_id == 41
            lanes = ctl.lanes
        sessions = [
            InaSession(JobSpec(41, r, 3, tls_switch.data_addr, lanes, 8), t)
            for r, t in enumerate(transports)
        ]
        inputs = [np.arange(1000, dtype=np.int32) * (r + 1) for r in range(3)]
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda r: sessions[r].allreduce(inputs[r]), range(3)))
        for got in results:
            np.testing.assert_array_equal(got, np.arange(1000, dtype=np.int32) * 6)
        for s in sessions:
            s.close()
    finally:
        for t in transports:
            t.close()
        with tls_switch.controller() as ctl:
            ctl.remove_job(41)
    log = tls_switch.log_path.read_text()
    assert re.search(r"P4Runtime: 127\.0\.0\.1:\d+ connected as ctl", log), log


def test_inalab_ctl_with_tls_writes_and_reads(
    tls_switch: SoftSwitchProcess, pki: dict[str, TlsFiles], tmp_path: Path
) -> None:
    manifest = tmp_path / "ready.json"
    shutil.copy(tls_switch.ready_path, manifest)
    add = _ctl("--manifest", str(manifest), "--tls", str(pki["ctl"]), "add-job", "--job", "7",
               "--slots", "4", "127.0.0.1:40001", "127.0.0.1:40002")  # fmt: skip
    assert add.returncode == 0, add.stderr
    # The same files from the environment (as the torch backend takes them).
    env = {**os.environ, "INALAB_P4RUNTIME_TLS": str(pki["ctl"])}
    jobs = _ctl("--manifest", str(manifest), "jobs", env=env)
    assert jobs.returncode == 0 and re.search(r"^\s+7\s+2\s", jobs.stdout, re.M), jobs
    assert _ctl("--manifest", str(manifest), "remove-job", "--job", "7", env=env).returncode == 0


@pytest.mark.parametrize(
    ("client", "says", "logged"),
    [
        (None, "requires TLS: give --tls", "plain text, not TLS"),
        ("foreign", "refused this client's certificate",
         "client certificate not trusted: unable to get local issuer certificate"),
        ("server_as_client", "refused this client's certificate",
         "client certificate not trusted: unsuitable certificate purpose"),
        ("distrustful", "does not trust the server's certificate", None),
    ],
)  # fmt: skip
def test_a_client_the_switch_does_not_take_is_refused_and_told_why(
    tls_switch: SoftSwitchProcess,
    pki: dict[str, TlsFiles],
    client: str | None,
    says: str,
    logged: str | None,
) -> None:
    before = len(_refusals(tls_switch))
    argv = ["--switch", tls_switch.p4runtime_address]
    if client is not None:
        argv += ["--tls", str(pki[client])]
    out = _ctl(*argv, "jobs")
    assert out.returncode == 1, out
    assert says in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr  # one line, no gRPC log lines
    refusals = _refusals(tls_switch)[before:]
    if logged is None:  # the client hung up first: the switch may see it or not
        return
    assert refusals, tls_switch.log_path.read_text()
    assert all(re.search(r"refused 127\.0\.0\.1:\d+: ", line) for line in refusals)
    assert any(logged in line for line in refusals), refusals
    # The library's error names the same reason.
    with pytest.raises(SwitchUnreachableError, match=re.escape(says)):
        SwitchController.connect(
            tls_switch.p4runtime_address, timeout=1.0,
            tls=None if client is None else pki[client],
        )  # fmt: skip


def test_tls_to_a_plain_text_switch_says_so(tmp_path: Path, pki: dict[str, TlsFiles]) -> None:
    with SoftSwitchProcess(tmp_path, lanes=8, slots=8) as plain:
        assert plain.ready_info["p4runtime_tls"] is False
        why = explain_refusal(plain.p4runtime_address, pki["ctl"])
        assert "does not speak TLS" in why
        with pytest.raises(SwitchUnreachableError, match="does not speak TLS"):
            SwitchController.connect(plain.p4runtime_address, timeout=1.0, tls=pki["ctl"])
        # ... and a plain controller is served, as every emulation on loopback is.
        with plain.controller() as ctl:
            assert ctl.installed_jobs() == []


def test_plain_text_beyond_loopback_is_refused_on_both_sides() -> None:
    with pytest.raises(TlsRequiredError, match="give --tls CERT,KEY,CA"):
        SwitchController.connect("10.99.0.1:9559", timeout=1.0)
    for loopback in ("127.0.0.1:9559", "127.3.2.1:1", "localhost:9559", "[::1]:9559"):
        require_tls(loopback, None, "--tls")
    out = subprocess.run(
        [*CLI, "switch", "--p4runtime", "0.0.0.0:0"], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "plain text is allowed on loopback only; give --p4runtime-tls" in out.stderr
    out = _ctl("--switch", "10.99.0.1:9559", "jobs")
    assert out.returncode == 1 and "give --tls CERT,KEY,CA" in out.stderr, out


def test_bad_tls_files_get_one_line(tmp_path: Path, pki: dict[str, TlsFiles]) -> None:
    good = pki["ctl"]
    with pytest.raises(TlsError, match="not CERT,KEY,CA"):
        TlsFiles.parse(f"{good.cert},{good.key}")
    with pytest.raises(TlsError, match="No such file"):
        TlsFiles.parse(f"{tmp_path / 'missing.crt'},{good.key},{good.ca}")
    with pytest.raises(TlsError, match="not a PEM key"):
        TlsFiles.parse(f"{good.cert},{good.cert},{good.ca}")
    with pytest.raises(TlsError, match="do not go together"):
        TlsFiles.parse(f"{good.cert},{pki['switch'].key},{good.ca}")
    out = _ctl("--tls", f"{good.cert},{good.cert},{good.ca}", "jobs")
    assert out.returncode == 2 and "not a PEM key" in out.stderr, out
    out = subprocess.run(
        [*CLI, "switch", "--p4runtime-tls", "a,b"], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "is not CERT,KEY,CA" in out.stderr, out


def test_the_torch_backend_takes_its_files_from_the_environment(
    pki: dict[str, TlsFiles],
) -> None:
    from dynamiccl.torch_backend import InaOptions, InaSetupError

    base = {"INALAB_SWITCH": "10.0.0.9:9099", "INALAB_JOB": "3",
            "INALAB_P4RUNTIME": "10.0.0.9:9559"}  # fmt: skip
    options = InaOptions.from_env({**base, "INALAB_P4RUNTIME_TLS": str(pki["ctl"])})
    assert options.p4runtime_tls == pki["ctl"]
    assert InaOptions.from_env(base).p4runtime_tls is None
    with pytest.raises(InaSetupError, match="not CERT,KEY,CA"):
        InaOptions.from_env({**base, "INALAB_P4RUNTIME_TLS": "only-one.pem"})
