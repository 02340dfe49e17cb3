"""Parse etcd endpoint lists as users write them (`--etcd`, `--rdzv-endpoint`, YAML)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_PORT = 2379


@dataclass(frozen=True)
class EndpointAddress:
    host: str
    port: int
    secure: bool = False

    @property
    def url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.host}:{self.port}"


def parse_endpoints(text: str | list[str]) -> list[EndpointAddress]:
    """`http://h1:2379,h2:2379` or a list of such items -> addresses.

    A bare `host:port` is plain HTTP; `https://` asks for TLS.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    result = [_parse_one(item.strip()) for item in items if item.strip()]
    if not result:
        raise ValueError("no etcd endpoint given; expected e.g. 'http://127.0.0.1:2379'")
    return result


def _parse_one(item: str) -> EndpointAddress:
    parts = urlsplit(item if "://" in item else f"http://{item}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"etcd endpoint {item!r}: expected 'http://host:port' or 'https://host:port'")
    if parts.username or parts.password:  # a URL gets printed and logged; a password in it would leak
        raise ValueError(
            f"etcd endpoint {parts.scheme}://{parts.hostname}:...: put credentials in --etcd-user and "
            "$ELASTIC_ETCD_PASSWORD, not in the URL"
        )
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as err:
        raise ValueError(f"etcd endpoint {item!r}: bad port ({err})") from None
    return EndpointAddress(parts.hostname, port, parts.scheme == "https")
