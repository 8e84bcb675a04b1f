"""``emulation.mininet.linkcontrol``: a rank's link-rate request over a real Unix socket, served
by the emulator's loop (here with a recording ``set_rate`` instead of ``tc``)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from emulation.mininet.linkcontrol import ENV_LINK_CONTROL, LinkControlError, serve, set_link_rate


def test_a_request_runs_set_rate_and_is_answered(tmp_path: Path) -> None:
    rates: list[float] = []
    said: list[str] = []
    with serve(tmp_path / "links.sock", rates.append, said.append) as path:
        assert set_link_rate(100, {ENV_LINK_CONTROL: str(path)}) == 100.0
        assert set_link_rate(2.5, {ENV_LINK_CONTROL: str(path)}) == 2.5
    assert rates == [100.0, 2.5]
    assert said == ["# run: host links set to 100 Mbit/s (asked by a rank)",
                    "# run: host links set to 2.5 Mbit/s (asked by a rank)"]  # fmt: skip
    assert not path.exists()  # removed on exit


def test_a_refusal_reaches_the_rank_with_its_reason(tmp_path: Path) -> None:
    def refuse(mbit: float) -> None:
        raise ValueError("host links h1-s1 are unshaped")

    said: list[str] = []
    refused = pytest.raises(LinkControlError, match="refused rate 100 Mbit/s: host links h1-s1")
    with serve(tmp_path / "links.sock", refuse, said.append) as path, refused:
        set_link_rate(100, {ENV_LINK_CONTROL: str(path)})
    assert said == ["# run: host links not set to 100 Mbit/s: host links h1-s1 are unshaped"]


@pytest.mark.parametrize(
    ("line", "why"),
    [("speed 100", "unknown request"), ("rate fast", "not a rate"), ("rate -5", "not a positive")],
)
def test_malformed_requests_are_answered_not_run(tmp_path: Path, line: str, why: str) -> None:
    rates: list[float] = []
    with (
        serve(tmp_path / "links.sock", rates.append, lambda _: None) as path,
        socket.socket(socket.AF_UNIX) as sock,
    ):
        sock.connect(str(path))
        sock.sendall(line.encode() + b"\n")
        answer = sock.makefile().readline()
    assert answer.startswith(f"error {why}") and rates == []


def test_without_an_emulator_the_rank_is_told_where_it_works() -> None:
    with pytest.raises(LinkControlError, match="only under inalab emulate TOPOLOGY run"):
        set_link_rate(100, {})
    with pytest.raises(LinkControlError, match="did not answer"):
        set_link_rate(100, {ENV_LINK_CONTROL: "/nonexistent/links.sock"})
    with pytest.raises(ValueError, match="positive"):
        set_link_rate(0, {ENV_LINK_CONTROL: "/nonexistent/links.sock"})


def test_a_run_directory_too_long_for_a_socket_gets_one_elsewhere(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    rates: list[float] = []
    with serve(deep / "links.sock", rates.append, lambda _: None) as path:
        assert path.parent != deep and path.name == "links.sock"
        set_link_rate(10, {ENV_LINK_CONTROL: str(path)})
    assert rates == [10.0] and not path.parent.exists()
