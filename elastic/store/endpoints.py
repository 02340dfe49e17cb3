"""Parse etcd endpoint lists as users write them (`--etcd`, `--rdzv-endpoint`, YAML).

Every malformed endpoint is one `EndpointError` line saying which item is wrong and how to write it, raised
before any connection is tried: `elastic --etcd ''` or `--etcd 127.0.0.1:99999` must not end in a traceback
or in a 16-second wait for an etcd that cannot exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from elastic.errors import PermanentError
from elastic.spec.excerpt import show

DEFAULT_PORT = 2379
# A DNS name (at most 253 characters) or an IP address; IPv6 comes without its brackets from urlsplit.
_HOST = re.compile(r"[A-Za-z0-9_.-]{1,253}|[0-9A-Fa-f:.]{2,45}")
_FORM = "write 'http://host:port' or 'https://host:port', e.g. 'http://127.0.0.1:2379'"


class EndpointError(PermanentError, ValueError):
    """An etcd endpoint that cannot be used as written (a ValueError too: callers caught ValueError before)."""


@dataclass(frozen=True)
class EndpointAddress:
    host: str
    port: int
    secure: bool = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.secure else 'http'}://{host}:{self.port}"


def parse_endpoints(text: str | list[str]) -> list[EndpointAddress]:
    """`http://h1:2379,h2:2379` or a list of such items -> addresses.

    A bare `host:port` is plain HTTP; `https://` asks for TLS; a host without a port gets 2379.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    result = [_parse_one(item.strip()) for item in items if item.strip()]
    if not result:
        raise EndpointError(f"no etcd endpoint given (--etcd / $ELASTIC_ETCD is empty); {_FORM}")
    return result


def _parse_one(item: str) -> EndpointAddress:
    where = f"etcd endpoint {show(item)}"
    try:
        parts = urlsplit(item if "://" in item else f"http://{item}")
        port = parts.port
    except ValueError as err:  # 'http://[::1:2379' (unclosed bracket), a port out of 0-65535, 'h:x'
        raise EndpointError(f"{where}: {_port_or_url(str(err))}; {_FORM}") from None
    if parts.scheme not in ("http", "https"):
        raise EndpointError(f"{where}: scheme {show(parts.scheme)} is not http or https; {_FORM}")
    if not parts.hostname:
        raise EndpointError(f"{where}: no host; {_FORM}")
    if not _HOST.fullmatch(parts.hostname):
        raise EndpointError(f"{where}: the host is not a DNS name or an IP address; {_FORM}")
    if parts.username or parts.password:  # a URL gets printed and logged; a password in it would leak
        raise EndpointError(
            f"etcd endpoint {parts.scheme}://{parts.hostname}:...: put credentials in --etcd-user and "
            "$ELASTIC_ETCD_PASSWORD, not in the URL"
        )
    if port == 0:
        raise EndpointError(f"{where}: port 0 is not a port etcd can listen on; {_FORM}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise EndpointError(f"{where}: an endpoint has no path, query or fragment; {_FORM}")
    return EndpointAddress(parts.hostname, port or DEFAULT_PORT, parts.scheme == "https")


def _port_or_url(error: str) -> str:
    """urllib's reason in the user's words."""
    if "out of range" in error:
        return "the port is not in 1-65535"
    if "IPv6" in error:
        return "an IPv6 address needs its closing ']' (e.g. 'http://[::1]:2379')"
    return "the port is not a number"
