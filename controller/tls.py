"""Mutual TLS for P4Runtime: the files, the rule for plain text, and why a peer refused.

A switch's P4Runtime server can install jobs, rewrite multicast groups and read every
register, so whoever reaches it controls the aggregation. inalab therefore serves and
speaks P4Runtime in plain text only on a loopback address (reachable from this machine
alone, as the emulations use it); any other address needs mutual TLS, both sides
presenting a certificate signed by the CA the other trusts (``CERT,KEY,CA``: PEM files,
as Stratum's ``-ca_cert_file/-server_cert_file/-server_key_file`` and gRPC's
``ssl_channel_credentials`` take them).

The server side (the soft switch's TLS front, :mod:`emulation.softswitch.tlsfront`) and
the client side (:class:`controller.client.P4RuntimeClient`) share this module:
:class:`TlsFiles` reads and checks the files once, :func:`require_tls` applies the
loopback rule, and :func:`explain_refusal` tells a client why a server would not talk to
it (gRPC itself only says the channel never became ready).
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = [
    "TLS_ENV",
    "TlsError",
    "TlsFiles",
    "TlsRequiredError",
    "explain_refusal",
    "grpc_channel",
    "is_loopback",
    "require_tls",
    "tls_argument",
]

TLS_ENV = "INALAB_P4RUNTIME_TLS"
"""Environment variable with ``CERT,KEY,CA`` for controllers that have no command line
(the ``"ina"`` torch backend)."""

_ALPN = ["h2"]  # gRPC runs over HTTP/2 and checks that TLS negotiated it
_PROBE_SECONDS = 3.0
_CLOSED_AFTER_HANDSHAKE = (
    "it refused this client's certificate (it closed the connection after the handshake; "
    "the switch's log names the reason)"
)


class TlsError(ValueError):
    """A TLS file is missing, unreadable or not what it should be."""


class TlsRequiredError(ValueError):
    """Plain-text P4Runtime on an address other hosts can reach."""


@dataclass(frozen=True)
class TlsFiles:
    """This side's certificate and key, and the CA that signs the other side's.

    Attributes:
        cert: PEM certificate (chain) presented to the peer.
        key: PEM private key of ``cert``.
        ca: PEM certificate(s) of the CA the peer's certificate must chain to.
    """

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def parse(cls, text: str) -> TlsFiles:
        """``CERT,KEY,CA`` into files, each checked to be a readable PEM of its kind.

        Raises:
            TlsError: not three paths, or a file that is not what its place says.
        """
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 3 or not all(parts):
            raise TlsError(f"{text!r} is not CERT,KEY,CA (three PEM files)")
        files = cls(*(Path(p) for p in parts))
        files.check()
        return files

    def check(self) -> None:
        """Read the three files and load them as OpenSSL would.

        Raises:
            TlsError: naming the file and what is wrong with it.
        """
        for name, path, marker in (
            ("certificate", self.cert, b"-----BEGIN CERTIFICATE-----"),
            ("key", self.key, b"PRIVATE KEY-----"),
            ("CA", self.ca, b"-----BEGIN CERTIFICATE-----"),
        ):
            if marker not in _read(path, name):
                raise TlsError(f"{name} {path}: not a PEM {name} (no {marker.decode()!r})")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            context.load_cert_chain(self.cert, self.key)
        except ssl.SSLError as exc:
            raise TlsError(
                f"certificate {self.cert} and key {self.key} do not go together: {_why(exc)}"
            ) from None
        try:
            context.load_verify_locations(cafile=self.ca)
        except ssl.SSLError as exc:
            raise TlsError(f"CA {self.ca}: {_why(exc)}") from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TlsFiles | None:
        """The files ``$INALAB_P4RUNTIME_TLS`` names, or None where it is unset or empty.

        Raises:
            TlsError: set, but not three PEM files of their kinds.
        """
        text = environ.get(TLS_ENV, "").strip()
        return cls.parse(text) if text else None

    def read(self) -> tuple[bytes, bytes, bytes]:
        """The three files' bytes: ``(cert, key, ca)``.

        Raises:
            TlsError: a file became unreadable.
        """
        return (_read(self.cert, "certificate"), _read(self.key, "key"), _read(self.ca, "CA"))

    def server_context(self) -> ssl.SSLContext:
        """A server context that demands a client certificate signed by ``ca``."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(self.cert, self.key)
        context.load_verify_locations(cafile=self.ca)
        context.set_alpn_protocols(_ALPN)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client context that presents ``cert`` and checks the server against ``ca``
        and the address it dials (the server's certificate names that IP or name)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        context.load_verify_locations(cafile=self.ca)
        context.set_alpn_protocols(_ALPN)
        return context

    def __str__(self) -> str:
        return f"{self.cert},{self.key},{self.ca}"


def tls_argument(text: str) -> TlsFiles:
    """``CERT,KEY,CA`` as an argparse ``type`` (``inalab switch --p4runtime-tls``,
    ``inalab ctl --tls``).

    Raises:
        argparse.ArgumentTypeError: not three PEM files of their kinds.
    """
    try:
        return TlsFiles.parse(text)
    except TlsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def grpc_channel(address: str, tls: TlsFiles | None) -> grpc.Channel:
    """A gRPC channel to ``address``: mutual TLS with ``tls``, else plain text.

    Raises:
        TlsError: a file became unreadable.
    """
    if tls is None:
        return grpc.insecure_channel(address)
    cert, key, ca = tls.read()
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(ca, key, cert))


def _read(path: Path, name: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsError(f"{name} {path}: {exc.strerror or exc}") from None


def _why(exc: ssl.SSLError) -> str:
    """OpenSSL's reason in words (``CERTIFICATE_VERIFY_FAILED`` -> 'certificate verify
    failed'), with the verification detail when there is one."""
    detail = getattr(exc, "verify_message", None)
    reason = (exc.reason or str(exc)).replace("_", " ").lower()
    return f"{reason}: {detail}" if detail else reason


def split_host(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) into its parts.

    Raises:
        ValueError: no port.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (``127.0.0.0/8``,
    ``::1``, ``localhost``); a name that does not resolve here is not."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(ipaddress.ip_address(f[4][0]).is_loopback for f in found)


def require_tls(address: str, tls: TlsFiles | None, role: str) -> None:
    """Refuse plain-text P4Runtime on a non-loopback ``address``.

    Args:
        address: ``host:port`` served or dialled.
        tls: the files, or None for plain text.
        role: the option that gives them, for the message (``--p4runtime-tls``).

    Raises:
        TlsRequiredError: ``tls`` is None and ``address`` is not loopback.
    """
    if tls is not None:
        return
    host, _ = split_host(address)
    if not is_loopback(host):
        raise TlsRequiredError(
            f"P4Runtime at {address} is reachable from other hosts: plain text is allowed "
            f"on loopback only; give {role} CERT,KEY,CA (mutual TLS)"
        )


def explain_refusal(address: str, tls: TlsFiles | None, timeout: float = _PROBE_SECONDS) -> str:
    """Why the P4Runtime server at ``address`` did not accept this client, found by one
    TLS (or plain) handshake of our own; '' if nothing explains it (the server is down
    or slow, which the caller's own message says).
    """
    try:
        host, port = split_host(address)
        raw = socket.create_connection((host, port), timeout=timeout)
    except (OSError, ValueError):
        return ""
    with raw:
        raw.settimeout(timeout)
        if tls is None:
            return _plain_probe(raw)
        try:
            with tls.client_context().wrap_socket(raw, server_hostname=host) as conn:
                # TLS 1.3 sends the server's verdict on our certificate after the
                # handshake: a read shows it (an alert), or the server waits for us (ok).
                try:
                    if conn.recv(1) == b"":
                        return _CLOSED_AFTER_HANDSHAKE
                except TimeoutError:
                    return ""
                except ConnectionError:
                    return _CLOSED_AFTER_HANDSHAKE
                return ""
        except ssl.SSLCertVerificationError as exc:
            return f"this client does not trust the server's certificate: {_why(exc)}"
        except ssl.SSLError as exc:
            reason = exc.reason or ""
            plain = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE")
            if reason in plain or "PACKET_LENGTH" in reason:
                return "it does not speak TLS (a plain-text server: drop --tls)"
            if "ALERT" in reason:
                return f"it refused this client's certificate ({_why(exc)})"
            return f"TLS failed: {_why(exc)}"
        except (ConnectionError, OSError) as exc:
            return f"it closed the connection during the TLS handshake ({exc})"


def _plain_probe(raw: socket.socket) -> str:
    """A plain-text client: does the server answer HTTP/2, or close on it (TLS)?"""
    try:
        raw.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        answer = raw.recv(16)
    except TimeoutError:
        return ""
    except OSError as exc:
        answer = b""
        if not isinstance(exc, ConnectionError):
            return ""
    if not answer or answer[:1] == b"\x15":  # closed, or a TLS alert record
        return f"it requires TLS: give --tls CERT,KEY,CA (or {TLS_ENV} for the torch backend)"
    return ""
