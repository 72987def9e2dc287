"""A real TLS terminator (Debian's stunnel4) in front of a ClickHouse server's ports.

Certificates are made by the ``openssl`` command for the run: a test CA, a server
certificate it signed for ``127.0.0.1``, the same certificate already expired, and a
second CA that signed nothing the terminator serves (a wrong CA). Three services:

- ``https``: HTTPS to the HTTP port, with the valid certificate;
- ``https_expired``: HTTPS to the HTTP port, with the expired certificate;
- ``native``: TLS to the native port (the client transport's ``--secure``);
- ``https_other_host`` and ``native_other_host``: the same two with a certificate the
  test CA signed for another host name (``other.example``).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVICES = ("https", "https_expired", "native", "https_other_host", "native_other_host")


@dataclass(frozen=True)
class Terminator:
    """The ports stunnel accepts TLS on, and the CA files a client may trust."""

    ports: dict[str, int]
    ca_file: Path
    wrong_ca_file: Path


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def make_certificates(root: Path) -> None:
    """ca.pem, wrong-ca.pem, server.pem / server.key (127.0.0.1), expired.pem."""
    for ca in ("ca", "wrong-ca"):
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.pem",
            "-days",
            "2",
            "-subj",
            f"/CN=dpone test {ca}",
            cwd=root,
        )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
        cwd=root,
    )
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    (root / "other.ext").write_text("subjectAltName=DNS:other.example\n")
    for name, days, ext in (
        ("server", "2", "san.ext"),
        ("expired", "-1", "san.ext"),
        ("other", "2", "other.ext"),
    ):
        _openssl(
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            days,
            "-extfile",
            ext,
            cwd=root,
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


@contextlib.contextmanager
def tls_terminator(root: Path, http_port: int, tcp_port: int) -> Iterator[Terminator]:
    """stunnel in front of ``http_port`` and ``tcp_port``, stopped after."""
    binary = shutil.which("stunnel4") or shutil.which("stunnel")
    if binary is None:
        pytest.fail("stunnel4 is not installed (apt-get install stunnel4); .ci/run installs it")
    root.mkdir(parents=True, exist_ok=True)
    make_certificates(root)
    ports = {name: _free_port() for name in SERVICES}
    backends = {
        "https": http_port,
        "https_expired": http_port,
        "native": tcp_port,
        "https_other_host": http_port,
        "native_other_host": tcp_port,
    }
    certs = {
        "https": "server.pem",
        "https_expired": "expired.pem",
        "native": "server.pem",
        "https_other_host": "other.pem",
        "native_other_host": "other.pem",
    }
    sections = "".join(
        f"[{name}]\naccept = 127.0.0.1:{ports[name]}\nconnect = 127.0.0.1:{backends[name]}\n"
        f"cert = {root / certs[name]}\nkey = {root / 'server.key'}\n"
        for name in SERVICES
    )
    config = root / "stunnel.conf"
    config.write_text(f"foreground = yes\npid =\ndebug = 4\n{sections}")
    log = open(root / "stunnel.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen([binary, str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not all(_listening(p) for p in ports.values()):
            assert process.poll() is None, (root / "stunnel.log").read_text()
            assert time.monotonic() < deadline, "stunnel did not listen in 20 s"
            time.sleep(0.1)
        yield Terminator(ports, root / "ca.pem", root / "wrong-ca.pem")
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
