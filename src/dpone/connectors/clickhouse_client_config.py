"""clickhouse-client's configuration file: credentials and TLS, never on a command line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from xml.sax.saxutils import escape

from dpone.ports.clickhouse_request import Credentials


@contextmanager
def client_config(
    credentials: Credentials, *, secure: bool = False, ca_file: str | None = None
) -> Iterator[tuple[str, int]]:
    """clickhouse-client's configuration holding ``credentials``: ``(path, fd)``.

    The configuration lives in an anonymous memory file (``memfd_create``): it has no
    name in any file system, so nothing holding the password is left behind whatever
    ends dpone (SIGKILL included); it is gone once the last process holding it exits.
    The child reads it as ``/dev/fd/N`` (pass ``fd`` with ``pass_fds``): the Debian
    clickhouse-client 18.16 accepts that path, any extension is not needed.
    """
    fd = os.memfd_create("dpone-client-config", os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)  # reachable only through /proc by this user anyway; say so
        # With --secure the client verifies the server's certificate (strict) against
        # ca_file, or without one against the system's trust store; extendedVerification
        # makes it check that the certificate names the host (Poco skips that otherwise),
        # and a refused certificate is rejected, never accepted after a prompt.
        tls = (
            ""
            if not secure
            else (
                "<openSSL><client><verificationMode>strict</verificationMode>"
                "<extendedVerification>true</extendedVerification>"
                "<invalidCertificateHandler><name>RejectCertificateHandler</name>"
                "</invalidCertificateHandler>"
                + (f"<caConfig>{escape(ca_file)}</caConfig>" if ca_file else "")
                + "<loadDefaultCAFile>"
                + ("false" if ca_file else "true")
                + "</loadDefaultCAFile></client></openSSL>"
            )
        )
        data = memoryview(
            (
                f"<config><user>{escape(credentials.user)}</user>"
                f"<password>{escape(credentials.password)}</password>{tls}</config>\n"
            ).encode()
        )
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
        yield f"/dev/fd/{fd}", fd
    finally:
        os.close(fd)
