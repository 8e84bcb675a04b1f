"""emulation.bmv2 without bmv2: command lines, tool discovery, compiling, readiness.

bmv2 and p4c are replaced by stand-ins written here as executables on a private PATH:
``p4c-bm2-ss`` writes the files its options name (or fails as told), and
``simple_switch_grpc`` parses bmv2's options and serves a real P4Runtime server (the soft
switch's, which takes a pushed pipeline as bmv2's does) and a Thrift port, or misbehaves
as told by ``FAKE_BMV2``. So start, readiness, the pipeline push and stop run for real
here, over loopback sockets and without root; only bmv2's data plane is missing
(tests/integration/test_bmv2_mininet.py has it where bmv2 is installed).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.p4info import P4Info
from controller.registers import Bmv2Registers
from controller.switch import SwitchController
from emulation.bmv2 import (
    BMV2_LANES,
    BMV2_SLOTS,
    INSTALL_HINT,
    P4INFO_PATH,
    Bmv2Process,
    Bmv2Tools,
    Bmv2Unavailable,
    CompileError,
    check_bmv2_switch,
    compile_command,
    compile_program,
    compiled_p4info,
    find_bmv2,
    free_tcp_ports,
)
from emulation.mininet.nodes import bmv2_switch_class
from emulation.softswitch.process import SwitchStartError

SWITCH = Bmv2Tools(Path("/opt/bmv2/bin/simple_switch_grpc"))

FAKE_SWITCH = f"""\
#!{sys.executable}
# Stand-in for simple_switch_grpc: bmv2's options, a P4Runtime server, a Thrift port.
import os, signal, socket, sys, threading, time
print("fake simple_switch_grpc", *sys.argv[1:], flush=True)
mode = os.environ.get("FAKE_BMV2", "serve")
if mode == "exit":
    print("Error: interface s1-eth9 does not exist", flush=True)
    sys.exit(3)
own = sys.argv[1:sys.argv.index("--")]
target = sys.argv[sys.argv.index("--") + 1:]
grpc_addr = target[target.index("--grpc-server-addr") + 1]
held = []

def accept(server):
    while True:
        held.append(server.accept())

if mode != "no-thrift":
    thrift = socket.create_server(("0.0.0.0", int(own[own.index("--thrift-port") + 1])))
    threading.Thread(target=accept, args=(thrift,), daemon=True).start()
if mode == "no-grpc":
    time.sleep(3600)
if mode == "ignore-term":
    from concurrent import futures
    import grpc
    from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

    class Capabilities(p4runtime_pb2_grpc.P4RuntimeServicer):
        def Capabilities(self, request, context):
            return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version="1.4.1")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(Capabilities(), server)
    server.add_insecure_port(grpc_addr)
    server.start()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)
from emulation.softswitch.cli import main
sys.exit(main(["--listen", "127.0.0.1:0", "--device-id", own[own.index("--device-id") + 1],
               "--p4runtime", grpc_addr]))
"""

FAKE_P4C = f"""\
#!{sys.executable}
# Stand-in for p4c-bm2-ss: records each call, writes what -o and --p4runtime-files name
# (the P4Info: the committed one, which is what the real p4c derives from p4/).
import os, shutil, sys
args = sys.argv[1:]
with open(os.environ["FAKE_P4C_CALLS"], "a") as calls:
    calls.write(" ".join(args) + "\\n")
json_out, p4info_out = args[args.index("-o") + 1], args[args.index("--p4runtime-files") + 1]
mode = os.environ.get("FAKE_P4C", "ok")
if mode == "silent":
    sys.exit(0)
with open(json_out, "w") as f:
    f.write('{{"program": "%s"}}' % args[-1])
if mode == "fail":
    print(args[-1] + "(3): [--Werror=type-error] error: lane_07: no such register", file=sys.stderr)
    sys.exit(1)
shutil.copy("{P4INFO_PATH}", p4info_out)
"""


def _install(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with both stand-ins, alone on PATH (with the interpreter's)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _install(bin_dir, "simple_switch_grpc", FAKE_SWITCH)
    _install(bin_dir, "p4c-bm2-ss", FAKE_P4C)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}")
    monkeypatch.setenv("FAKE_P4C_CALLS", str(tmp_path / "p4c-calls"))
    return bin_dir


@pytest.fixture
def program(tmp_path: Path) -> Path:
    """A program of two files, one including the other."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "types.p4").write_text("typedef bit<32> lane_t;\n")
    main = src / "main.p4"
    main.write_text('#include "types.p4"\n')
    return main


@pytest.fixture
def bmv2_json(tmp_path: Path) -> Path:
    """A compiled program for the stand-in (which does not read it)."""
    path = tmp_path / "ina.json"
    path.write_text("{}")
    return path


def _calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "p4c-calls"
    return path.read_text().splitlines() if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------------------- tools


def test_missing_switch_is_named_with_an_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Bmv2Unavailable) as err:
        find_bmv2()
    message = str(err.value)
    assert message.startswith("simple_switch_grpc (it runs the bmv2 switch) is not on PATH; ")
    assert INSTALL_HINT in message
    assert "apt-get install p4lang-bmv2 p4lang-p4c" in message
    assert "sudo" not in message


def test_missing_under_sudo_says_sudo_set_path_and_how_to_pass_yours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUDO_USER", "alice")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin")
    with pytest.raises(Bmv2Unavailable) as err:
        find_bmv2()
    message = str(err.value)
    assert message.startswith(
        f"simple_switch_grpc (it runs the bmv2 switch) is not on PATH ({tmp_path}:/usr/bin), "
        "which sudo (run by alice) sets to its own unless told otherwise: if alice's PATH "
        'has it, hand that on with `sudo .venv/bin/inalab emulate --p4-tools "$PATH" ...`'
    )
    assert message.endswith(f"if it is not installed, {INSTALL_HINT}")
    assert "\n" not in message


def test_a_search_path_given_is_named_and_searched_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_path: Path
) -> None:
    monkeypatch.setenv("SUDO_USER", "alice")  # PATH has the tools; not searched
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Bmv2Unavailable) as err:
        find_bmv2(path=f"{empty}{os.pathsep}{tmp_path / 'missing'}", origin="--p4-tools")
    message = str(err.value)
    assert message.startswith(
        f"simple_switch_grpc (it runs the bmv2 switch) is not in --p4-tools {empty}:"
    )
    assert "sudo" not in message and INSTALL_HINT in message
    monkeypatch.setenv("PATH", str(empty))
    found = find_bmv2(path=f"{empty}{os.pathsep}{fake_path}", origin="--p4-tools")
    assert found == Bmv2Tools(fake_path / "simple_switch_grpc", fake_path / "p4c-bm2-ss")


def test_missing_compiler_is_named_unless_not_needed(tmp_path: Path) -> None:
    switch = _install(tmp_path, "simple_switch_grpc", "#!/bin/sh\n")
    with pytest.raises(Bmv2Unavailable, match=r"^p4c-bm2-ss \(it compiles p4/ina.p4\)"):
        find_bmv2(path=str(tmp_path))
    assert find_bmv2(need_compiler=False, path=str(tmp_path)) == Bmv2Tools(switch, None)


def test_tools_found_on_path(fake_path: Path) -> None:
    assert find_bmv2() == Bmv2Tools(fake_path / "simple_switch_grpc", fake_path / "p4c-bm2-ss")


def test_a_process_without_tools_needs_them_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Bmv2Unavailable, match="simple_switch_grpc"):
        Bmv2Process(tmp_path, json_path=tmp_path / "ina.json")
    _install(tmp_path, "simple_switch_grpc", "#!/bin/sh\n")
    with pytest.raises(Bmv2Unavailable, match="p4c-bm2-ss"):
        Bmv2Process(tmp_path)  # no JSON given: it must compile
    assert Bmv2Process(tmp_path, json_path=tmp_path / "ina.json").tools.compiler is None


# ---------------------------------------------------------------------------- compiling


def test_compile_command() -> None:
    assert compile_command(
        Path("/usr/bin/p4c-bm2-ss"), Path("p4/ina.p4"), Path("b/ina.json"), Path("b/ina.txt")
    ) == [
        "/usr/bin/p4c-bm2-ss", "--std", "p4-16", "--target", "bmv2", "--arch", "v1model",
        "--p4runtime-files", "b/ina.txt", "-o", "b/ina.json", "p4/ina.p4",
    ]  # fmt: skip


def test_compile_writes_json_and_p4info_and_caches_by_source(
    fake_path: Path, program: Path, tmp_path: Path
) -> None:
    out = tmp_path / "build"
    first = compile_program(out, program)
    assert first.parent == out and first.name.startswith("main-") and first.suffix == ".json"
    assert first.read_text() == f'{{"program": "{program}"}}'
    assert compiled_p4info(first) == first.with_suffix(".p4info.txt")
    assert compiled_p4info(first).read_text() == P4INFO_PATH.read_text()
    assert len(_calls(tmp_path)) == 1
    assert _calls(tmp_path)[0].endswith(f"-o {out}/{first.stem}.partial.json {program}")

    assert compile_program(out, program) == first
    assert len(_calls(tmp_path)) == 1  # cached

    (program.parent / "types.p4").write_text("typedef bit<16> lane_t;\n")  # an included file
    second = compile_program(out, program)
    assert second != first and second.exists() and first.exists()
    assert len(_calls(tmp_path)) == 2


def test_compile_failure_quotes_stderr_and_caches_nothing(
    fake_path: Path, program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "build"
    monkeypatch.setenv("FAKE_P4C", "fail")
    with pytest.raises(CompileError) as err:
        compile_program(out, program)
    assert err.value.returncode == 1
    assert str(err.value).startswith(f"{fake_path / 'p4c-bm2-ss'} exited with status 1: ")
    assert "main.p4(3): [--Werror=type-error] error: lane_07: no such register" in str(err.value)
    assert list(out.iterdir()) == []  # the partial JSON it wrote is gone

    monkeypatch.setenv("FAKE_P4C", "ok")
    assert compile_program(out, program).exists()  # and the next compile runs
    assert len(_calls(tmp_path)) == 2


def test_compile_that_writes_nothing_is_an_error(
    fake_path: Path, program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_P4C", "silent")
    with pytest.raises(CompileError, match="wrote no output"):
        compile_program(tmp_path / "build", program)


def test_compiler_that_cannot_run(program: Path, tmp_path: Path) -> None:
    not_executable = tmp_path / "p4c-bm2-ss"
    not_executable.write_text("")
    with pytest.raises(CompileError, match="could not be run") as err:
        compile_program(tmp_path / "build", program, compiler=not_executable)
    assert err.value.returncode is None


# ---------------------------------------------------------------------------- command line


def test_argv_has_bmv2_options_then_the_target_options() -> None:
    proc = Bmv2Process(
        Path("/run/x"), name="s1", interfaces={2: "s1-eth2", 1: "s1-eth1"}, device_id=7,
        json_path=Path("/run/x/ina.json"), tools=SWITCH,
    )  # fmt: skip
    assert proc.build_argv(50051, 9090) == [
        "/opt/bmv2/bin/simple_switch_grpc", "--device-id", "7",
        "-i", "1@s1-eth1", "-i", "2@s1-eth2", "--thrift-port", "9090",
        "--no-p4", "--", "--grpc-server-addr", "127.0.0.1:50051",
    ]  # fmt: skip
    assert proc.argv == []  # nothing ran


def test_argv_with_pcap_packet_log_and_cpu_port(tmp_path: Path) -> None:
    proc = Bmv2Process(
        tmp_path, name="s1", interfaces={1: "s1-eth1"}, json_path=tmp_path / "ina.json",
        pcap=True, log=True, host="0.0.0.0", cpu_port=255, tools=SWITCH,
    )  # fmt: skip
    assert proc.build_argv(4000, 4001) == [
        "/opt/bmv2/bin/simple_switch_grpc", "--device-id", "0", "-i", "1@s1-eth1",
        "--thrift-port", "4001", f"--pcap={tmp_path / 'pcaps'}", "--log-console",
        "--no-p4", "--", "--grpc-server-addr", "0.0.0.0:4000", "--cpu-port", "255",
    ]  # fmt: skip
    assert not (tmp_path / "pcaps").exists()  # building the command creates nothing


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interfaces": {511: "s1-eth1"}}, "switch port 511 outside 0..510"),
        ({"interfaces": {-1: "s1-eth1"}}, "switch port -1"),
        ({"interfaces": {1: "s1-eth1", 2: "s1-eth1"}}, "an interface is given for two ports"),
        ({"cpu_port": 0}, "cpu port 0 outside 1..510"),
        ({"cpu_port": 511}, "cpu port 511"),
        ({"interfaces": {64: "s1-eth1"}, "cpu_port": 64}, "cpu port 64 is also an interface"),
        ({"grpc_port": 65536}, "grpc port 65536 outside"),
        ({"thrift_port": -1}, "thrift port -1 outside"),
        ({"grpc_port": 9090, "thrift_port": 9090}, "both on port 9090"),
        ({"device_id": -1}, "device id -1"),
    ],
)
def test_bad_ports_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Bmv2Process(Path("/run/x"), json_path=Path("ina.json"), tools=SWITCH, **kwargs)


def test_free_tcp_ports_are_distinct_and_bindable() -> None:
    ports = free_tcp_ports(8)
    assert len(set(ports)) == 8 and all(1024 <= p <= 65535 for p in ports)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))
    assert free_tcp_ports(0) == []


# ---------------------------------------------------------------------------- the switch node


@pytest.mark.parametrize(
    ("lanes", "slots", "forward_only", "message"),
    [
        (32, 64, False, r"64 lanes per packet \(LANES_PER_PACKET in p4/configuration.p4\), not 32"),
        (128, 64, False, "not 128: set lanes: 64 or use kind: soft"),
        (64, BMV2_SLOTS + 1, False, f"pool has {BMV2_SLOTS} slots per set; {BMV2_SLOTS + 1}"),
        (64, 0, False, "slots per set; 0 asked for"),
        (64, 64, True, "cannot be a forward-only switch: p4/ina.p4 recognises INA by UDP"),
    ],
)
def test_what_bmv2_cannot_be_is_refused(
    lanes: int, slots: int, forward_only: bool, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_bmv2_switch(lanes, slots, forward_only)


def test_what_bmv2_can_be() -> None:
    check_bmv2_switch(BMV2_LANES, 1, False)
    check_bmv2_switch(BMV2_LANES, BMV2_SLOTS, False)


def test_switch_class_needs_the_tools_on_path_unless_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Bmv2Unavailable, match="simple_switch_grpc"):
        bmv2_switch_class()
    assert bmv2_switch_class(SWITCH).__name__ == "Bmv2MininetSwitch"  # PATH not searched


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"lanes": 32}, "not 32"),
        ({"forward_only": True}, "forward-only"),
        ({"links": {1: "delay=5ms,loss=0"}}, "cannot delay or drop on its ports"),
    ],
)
def test_switch_node_refuses_before_mininet_starts_anything(
    fake_path: Path, tmp_path: Path, params: dict[str, Any], message: str
) -> None:
    # The check comes before Mininet's Node starts a shell (which needs root and mnexec).
    cls = bmv2_switch_class()
    assert cls.__name__ == "Bmv2MininetSwitch"
    with pytest.raises(ValueError, match=message):
        cls("s1", run_dir=tmp_path, slots=1024, **params)


# ---------------------------------------------------------------------------- lifecycle


@pytest.fixture
def bmv2(fake_path: Path, tmp_path: Path) -> Iterator[Bmv2Process]:
    """A started stand-in, compiled at start from p4/ina.p4 by the stand-in compiler."""
    proc = Bmv2Process(tmp_path / "run", name="s1", device_id=5)
    with proc:
        yield proc
    assert not proc.is_running()


def test_start_compiles_launches_and_proves_readiness(bmv2: Bmv2Process, tmp_path: Path) -> None:
    run = tmp_path / "run"
    info = bmv2.ready_info
    grpc_port = int(bmv2.p4runtime_address.rpartition(":")[2])
    thrift_port = int(bmv2.thrift_address.rpartition(":")[2])
    assert grpc_port != thrift_port
    assert bmv2.argv == bmv2.build_argv(grpc_port, thrift_port)  # the ports it picked
    assert info == {
        "kind": "bmv2", "data": None, "interfaces": {},
        "p4runtime": f"127.0.0.1:{grpc_port}", "thrift": f"127.0.0.1:{thrift_port}",
        "device_id": 5, "pid": bmv2.pid, "lanes": BMV2_LANES, "slots": BMV2_SLOTS,
        "json": info["json"], "p4info": str(compiled_p4info(Path(info["json"]))),
        "log": str(run / "s1.log"),
        "pcap": None,
    }  # fmt: skip
    assert Path(info["json"]).parent == run / "build" and Path(info["json"]).exists()
    # bmv2's stdout and stderr are the log.
    assert (run / "s1.log").read_text().startswith("fake simple_switch_grpc --device-id 5")


def test_a_given_p4info_is_pushed_instead_of_the_compiled_one(
    fake_path: Path, tmp_path: Path
) -> None:
    given = tmp_path / "mine.p4info.txtpb"
    given.write_text(P4INFO_PATH.read_text())
    with Bmv2Process(tmp_path / "run", p4info_path=given) as proc:
        assert proc.ready_info["p4info"] == str(given)
        assert proc.p4info_path == given


def test_first_controller_pushes_the_pipeline_and_later_ones_read_it(
    bmv2: Bmv2Process, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    connect = SwitchController.connect

    def spy(address: str, **kwargs: Any) -> SwitchController:
        seen.append({"address": address, **kwargs})
        return connect(address, **kwargs)

    monkeypatch.setattr(SwitchController, "connect", spy)
    with bmv2.controller() as ctl:
        assert ctl.is_primary
        assert (ctl.lanes, ctl.slots_per_set) == (BMV2_LANES, BMV2_SLOTS)
        assert isinstance(ctl.registers, Bmv2Registers)  # registers over Thrift
    with bmv2.controller(election_id=(0, 2)) as ctl:
        assert ctl.is_primary
    first, second = seen
    p4info, config = first.pop("pipeline")
    assert p4info.message == P4Info.load(P4INFO_PATH).message
    assert config == Path(bmv2.ready_info["json"]).read_bytes()
    assert first == {
        "address": bmv2.p4runtime_address, "device_id": 5, "election_id": (0, 1),
        "timeout": 10.0, "thrift": bmv2.thrift_address,
    }  # fmt: skip
    assert second["pipeline"] is None and second["election_id"] == (0, 2)


def test_stop_ends_the_recorded_pid(bmv2: Bmv2Process) -> None:
    pid = bmv2.pid
    assert _alive(pid)
    assert bmv2.stop() == 0  # the stand-in exits 0 on SIGTERM; bmv2 dies of it (-15)
    assert not _alive(pid) and not bmv2.is_running()
    assert bmv2.stop() == 0  # idempotent


def test_a_switch_ignoring_sigterm_is_killed(
    fake_path: Path, tmp_path: Path, bmv2_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_BMV2", "ignore-term")
    proc = Bmv2Process(tmp_path, json_path=bmv2_json).start()
    assert proc.stop(timeout=0.5) == -signal.SIGKILL
    assert not _alive(proc.pid)


def test_a_switch_that_exits_is_reported_with_its_log(
    fake_path: Path, tmp_path: Path, bmv2_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_BMV2", "exit")
    proc = Bmv2Process(tmp_path, name="s1", interfaces={9: "s1-eth9"}, json_path=bmv2_json)
    with pytest.raises(SwitchStartError) as err:
        proc.start()
    assert str(err.value).startswith(
        f"simple_switch_grpc exited with status 3; log {tmp_path}/s1.log"
    )
    assert "Error: interface s1-eth9 does not exist" in str(err.value)
    assert proc.returncode == 3


@pytest.mark.parametrize(
    ("mode", "timeout", "waiting_for"),
    [
        ("no-grpc", 1.0, "does not listen on its P4Runtime port"),
        # P4Runtime answers first (the stand-in's takes a second or two to start).
        (
            "no-thrift",
            8.0,
            "listen on its Thrift port .* build simple_switch_grpc with --with-thrift",
        ),
    ],
)
@pytest.mark.slow
def test_a_switch_not_ready_in_time_is_stopped_and_says_what_was_missing(
    fake_path: Path,
    tmp_path: Path,
    bmv2_json: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    timeout: float,
    waiting_for: str,
) -> None:
    monkeypatch.setenv("FAKE_BMV2", mode)
    proc = Bmv2Process(tmp_path, json_path=bmv2_json, start_timeout=timeout)
    with pytest.raises(SwitchStartError, match=f"not ready after {timeout}s: pid .* {waiting_for}"):
        proc.start()
    assert proc.returncode is not None and not _alive(proc.pid)


class _Capabilities(p4runtime_pb2_grpc.P4RuntimeServicer):
    def Capabilities(self, request: Any, context: Any) -> Any:
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version="1.4.1")


def test_another_servers_answer_on_its_port_is_not_readiness(
    fake_path: Path, tmp_path: Path, bmv2_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The port was free when chosen, then someone else took it: that server answers
    # Capabilities, but it is not this switch.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(_Capabilities(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
            stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=5)  # it answers
        monkeypatch.setenv("FAKE_BMV2", "no-grpc")
        proc = Bmv2Process(tmp_path, json_path=bmv2_json, grpc_port=port, start_timeout=1.0)
        with pytest.raises(SwitchStartError, match=f"its P4Runtime port {port}"):
            proc.start()
    finally:
        server.stop(None)


def test_accessors_before_start(tmp_path: Path) -> None:
    proc = Bmv2Process(tmp_path, json_path=tmp_path / "ina.json", tools=SWITCH)
    for name in ("pid", "p4runtime_address", "thrift_address", "ready_info"):
        with pytest.raises(RuntimeError, match="not started"):
            getattr(proc, name)
    assert proc.stop() is None and not proc.is_running()
