"""Who this process is to etcd: TLS files and user/password, from flags, the environment or --rdzv-conf.

Why one type: every `elastic` command, the rendezvous handler, the controller's agents and the example's
progress reporter must connect with the same settings, and the secrets among them must never reach a
command line (every local user can read `ps`), a log line or etcd itself. Child processes get them
through their environment (`env()`), which only their own user can read.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from elastic.errors import StoreUnavailableError
from elastic.store.endpoints import EndpointAddress

if TYPE_CHECKING:
    import grpc

# The environment variable, the `elastic` flag and the --rdzv-conf key of each setting.
ENV_VARS = {
    "ca_cert": "ELASTIC_ETCD_CACERT",
    "cert": "ELASTIC_ETCD_CERT",
    "key": "ELASTIC_ETCD_KEY",
    "user": "ELASTIC_ETCD_USER",
    "password": "ELASTIC_ETCD_PASSWORD",
}
FLAGS = {
    "ca_cert": "--etcd-cacert",
    "cert": "--etcd-cert",
    "key": "--etcd-key",
    "user": "--etcd-user",
    "password": "--etcd-password",
}
FILE_NAMES = {"ca_cert": "CA certificate", "cert": "client certificate", "key": "client key"}


class StoreAccessError(StoreUnavailableError):
    """etcd refused this client (TLS, credentials, permissions), or its settings cannot work: retrying
    will not help, so this is raised at once rather than after the retry bound."""


def setting_name(name: str) -> str:
    """How a user may have given a setting, for error messages: `--etcd-cacert ($ELASTIC_ETCD_CACERT)`."""
    return f"{FLAGS[name]} (${ENV_VARS[name]}, --rdzv-conf {name})"


@dataclass(frozen=True)
class EtcdAuth:
    """TLS files (paths) and etcd user/password; every field optional. `repr` never shows the password."""

    ca_cert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EtcdAuth:
        environ = os.environ if environ is None else environ
        return cls(**{name: environ.get(var) or None for name, var in ENV_VARS.items()})

    def override(self, **values: str | None) -> EtcdAuth:
        """These settings with each given non-empty value instead (a flag or conf key beats the environment)."""
        return replace(self, **{name: value for name, value in values.items() if value})

    def env(self) -> dict[str, str]:
        """The environment that gives a child process these settings (never its command line)."""
        return {ENV_VARS[f.name]: value for f in fields(self) if (value := getattr(self, f.name))}

    @property
    def uses_tls(self) -> bool:
        return bool(self.ca_cert or self.cert or self.key)

    def check(self, addresses: Sequence[EndpointAddress]) -> None:
        """Refuse, before anything is sent, settings that would leak a secret or cannot work."""
        plain = ", ".join(a.url for a in addresses if not a.secure)
        if self.password and plain:
            raise StoreAccessError(
                f"refusing to send the etcd password over plain http ({plain}): use https:// endpoints "
                f"(with {setting_name('ca_cert')} if etcd's certificate is not signed by a system CA)"
            )
        if self.uses_tls and plain:
            raise StoreAccessError(f"TLS files are set but etcd endpoint(s) {plain} are plain http: use https://")
        if bool(self.user) != bool(self.password):
            missing = "password" if self.user else "user"
            raise StoreAccessError(f"an etcd user needs a password and the reverse: set {setting_name(missing)}")
        if bool(self.cert) != bool(self.key):
            missing = "key" if self.cert else "cert"
            raise StoreAccessError(f"a client certificate needs its key and the reverse: set {setting_name(missing)}")
        for name, what in FILE_NAMES.items():
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise StoreAccessError(f"etcd {what} {path} ({setting_name(name)}) does not exist")
        self._check_pem()

    def _check_pem(self) -> None:
        """Let OpenSSL read the files now: a bad one is one clear line here, not a failed handshake later."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            if self.ca_cert:
                context.load_verify_locations(cafile=self.ca_cert)
        except (ssl.SSLError, OSError) as err:
            raise StoreAccessError(f"etcd CA certificate {self.ca_cert} is not a readable PEM file: {err}") from None
        try:
            if self.cert:
                context.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as err:
            raise StoreAccessError(
                f"etcd client certificate {self.cert} with key {self.key}: not a readable PEM pair "
                f"(or the key does not match the certificate): {err}"
            ) from None

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC TLS credentials; without a CA file, the system's trusted CAs verify etcd (like etcdctl)."""

        import grpc  # here, not above: a training process reads these settings and must not import gRPC

        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(read(self.ca_cert), read(self.key), read(self.cert))

    def ssl_context(self) -> ssl.SSLContext:
        """The same TLS settings for an HTTPS connection (the gateway): etcd's certificate checked against the
        CA file, or the system's CAs without one, and this client's certificate where one is set."""
        context = ssl.create_default_context(cafile=self.ca_cert)
        if self.cert:
            context.load_cert_chain(self.cert, self.key)
        return context
