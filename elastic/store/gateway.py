"""The same etcd calls over etcd's HTTP/JSON gateway (`/v3/...`), on plain sockets: the wire of a process
that forks.

Why a second wire: a training process forks (DataLoader workers, `multiprocessing.Pool`, `subprocess`), and a
gRPC channel in a forking process is a hazard either way. With gRPC's fork support on, a fork while one of its
threads holds a lock left the child waiting forever in `Channel._postfork_child` (issue 44); with it off, the
child inherits a half-copied gRPC core. Here nothing installs a fork handler, no lock is held across I/O
(the connection pool's lock guards a list, never a request), and a forked child that never calls this store
touches nothing of it: a fork at any instant inherits no lock the child will take (docs/design.md, "Fork
safety").

What it costs: a request per call on a kept-alive HTTP/1.1 connection (about the gRPC client's latency here),
and one HTTP stream per watch with a thread reading it (a training process holds one or two). etcd serves
the gateway on its client URL by default, in 3.4 and 3.5 alike.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import socket
import ssl
import threading
from collections.abc import Sequence
from typing import Any

from elastic.errors import StoreUnavailableError
from elastic.store.auth import StoreAccessError, setting_name
from elastic.store.base import StoreBase
from elastic.store.ops import (
    Compare,
    Delete,
    Entry,
    ModRevisionIs,
    Op,
    Put,
    TxnResult,
    UnchangedSince,
    as_bytes,
    prefix_range_end,
    txn_subject,
)
from elastic.store.watch import PrefixWatch, WatchEvent

log = logging.getLogger(__name__)

# gRPC status codes as the gateway reports them (its JSON error's "code").
STATUS_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 10: "ABORTED",
    11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}
# etcd's answers that a later try (or another member) may not give: no leader, a timed-out proposal, a token
# that expired (a new one is fetched before the retry).
TRANSIENT_STATUSES = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL"}
TRANSIENT_MESSAGES = ("timed out", "deadline exceeded", "leader", "invalid auth token", "too many requests")

# What etcd answers a request through its gateway that shows a client certificate with a CommonName.
COMMON_NAME_REFUSED = "CommonName of client sending a request against gateway"

# A watch stream that brought nothing for this long is opened again from its next revision: how a watch
# notices an etcd that froze or a connection that silently died (gRPC's keep-alive pings do this there).
WATCH_IDLE_SECONDS = 15.0


class GatewayUnreachableError(Exception):
    """No answer, a broken connection, or an answer that says to try again (transient)."""


class GatewayRefusalError(Exception):
    """etcd's final answer to this call (permission, a lost lease, a bad request)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class GatewayStore(StoreBase):
    """A connection to one etcd cluster over its HTTP/JSON gateway (see the module docstring)."""

    transient_errors = (GatewayUnreachableError,)
    refusal_errors = (GatewayRefusalError,)

    def _setup(self) -> None:
        self._pool_lock = threading.Lock()  # guards the two fields below, never held across I/O
        self._idle: list[http.client.HTTPConnection] = []
        self._endpoint = 0  # index into addresses of the endpoint new connections go to
        self._token: str | None = None
        self._closed = False
        # One TLS context for every connection (reading the files once), made on the first https connection.
        self._tls: ssl.SSLContext | None = None

    # --- connections ---

    def _new_connection(self, timeout: float | None) -> http.client.HTTPConnection:
        with self._pool_lock:
            address = self.addresses[self._endpoint % len(self.addresses)]
        if not address.secure:
            return http.client.HTTPConnection(address.host, address.port, timeout=timeout)
        if self._tls is None:
            self._tls = self.auth.ssl_context()
        return http.client.HTTPSConnection(address.host, address.port, timeout=timeout, context=self._tls)

    def _fail_endpoint(self) -> None:
        """The endpoint in use did not answer: new connections go to the next one."""
        with self._pool_lock:
            self._endpoint += 1

    def _take(self) -> http.client.HTTPConnection | None:
        with self._pool_lock:
            return self._idle.pop() if self._idle else None

    def _give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._pool_lock:
            if not self._closed:
                self._idle.append(connection)
                return
        connection.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.auth.user:
            headers["Authorization"] = self._token or self._authenticate()
        return headers

    def _authenticate(self) -> str:
        answer = self._exchange("/v3/auth/authenticate", {"name": self.auth.user, "password": self.auth.password},
                                headers={"Content-Type": "application/json"})
        self._token = str(answer["token"])
        return self._token

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request (one attempt), signed in as the auth settings say."""
        return self._exchange(path, body, self._headers())

    def _exchange(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """One request on a pooled connection; a pooled connection the server had closed meanwhile is replaced
        once at no cost, a new one that fails marks its endpoint failed."""
        payload = json.dumps(body)
        pooled = self._take()
        if pooled is not None:
            try:
                return self._send(pooled, path, payload, headers)
            except (OSError, http.client.HTTPException):
                pass  # a kept-alive connection etcd closed: once more on a new one
        try:
            return self._send(self._new_connection(self.timeout), path, payload, headers)
        except (OSError, http.client.HTTPException) as err:
            self._fail_endpoint()
            raise GatewayUnreachableError(f"{type(err).__name__}: {err}") from err

    def _send(self, connection: http.client.HTTPConnection, path: str, payload: str,
              headers: dict[str, str]) -> dict[str, Any]:
        try:
            connection.request("POST", path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except BaseException:
            connection.close()
            raise
        self._give_back(connection)
        return self.answer(response.status, data)

    def answer(self, status: int, data: bytes) -> dict[str, Any]:
        """An answer as JSON, or the error it carries (`_answer`); an expired sign-in is forgotten here, for
        calls and watches alike, so that the retry signs in again."""
        try:
            return _answer(status, data)
        except GatewayUnreachableError as err:
            if "invalid auth token" in str(err):
                self._token = None
            raise

    def _new_watch_hub(self) -> GatewayWatchHub:
        return GatewayWatchHub(self)

    def close(self) -> None:
        with self._pool_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        for stream in self._close_streams():
            if stream is not None:
                stream.close()

    def tls_failure(self, err: BaseException) -> str | None:
        cause = err.__cause__
        if isinstance(cause, ssl.SSLError):
            return f"{cause.reason or cause} (check --etcd-cacert and --etcd-cert/--etcd-key)"
        return None

    def refused(self, what: str, err: BaseException) -> StoreUnavailableError:
        assert isinstance(err, GatewayRefusalError)
        if COMMON_NAME_REFUSED in err.message:
            return StoreAccessError(
                f"etcd at {self.endpoints_text} refused {what}: {err.message}: agents and training processes "
                "reach etcd through its HTTP gateway, where etcd takes no user from a client certificate and "
                "refuses one that names a user; give the workers a client certificate without a CommonName "
                f"({setting_name('cert')}) and the user's password, or no client certificate (README 'TLS and "
                "auth')")
        return self.refusal(what, err.status, err.message)

    # --- key/value ---

    def get(self, key: str) -> Entry | None:
        answer = self._call(f"get {key}", self._post, "/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs", [])
        return _entry(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        body = {"key": _b64(prefix), "range_end": _b64(prefix_range_end(prefix.encode())),
                "sort_order": "ASCEND", "sort_target": "KEY"}
        answer = self._call(f"get --prefix {prefix}", self._post, "/v3/kv/range", body)
        return [_entry(kv) for kv in answer.get("kvs", [])], _revision(answer)

    def get_ranges(self, ranges: Sequence[tuple[str, str]]) -> tuple[list[Entry], int]:
        reads = [{"request_range": {"key": _b64(start), "range_end": _b64(end)}} for start, end in ranges]
        answer = self._call("get " + ", ".join(f"{start}..{end}" for start, end in ranges), self._post,
                            "/v3/kv/txn", {"success": reads})
        entries = [_entry(kv) for response in answer.get("responses", [])
                   for kv in response.get("response_range", {}).get("kvs", [])]
        return entries, _revision(answer)

    def put(self, key: str, value: bytes | str, lease: int | None = None) -> int:
        answer = self._call(f"put {key}", self._post, "/v3/kv/put", _put(Put(key, value, lease)))
        return _revision(answer)

    def delete(self, key: str) -> bool:
        answer = self._call(f"delete {key}", self._post, "/v3/kv/deleterange", {"key": _b64(key)})
        return int(answer.get("deleted", 0)) > 0

    def delete_prefix(self, prefix: str) -> int:
        body = {"key": _b64(prefix), "range_end": _b64(prefix_range_end(prefix.encode()))}
        return int(self._call(f"delete --prefix {prefix}", self._post, "/v3/kv/deleterange", body).get("deleted", 0))

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        body = {"compare": [_compare(c) for c in compare], "success": [_op(o) for o in success],
                "failure": [_op(o) for o in failure]}
        answer = self._call(txn_subject(compare, success, failure), self._post, "/v3/kv/txn", body)
        return TxnResult(bool(answer.get("succeeded", False)), _revision(answer))

    # --- leases ---

    def grant(self, ttl: int) -> int:
        return int(self._call(f"lease grant {ttl}", self._post, "/v3/lease/grant", {"TTL": ttl})["ID"])

    def refresh_once(self, lease_id: int) -> int:
        answer = self._attempt(self._post, "/v3/lease/keepalive", {"ID": str(lease_id)})
        if "error" in answer:  # the keep-alive is a stream: its errors come in its body
            raise GatewayUnreachableError(str(answer["error"]))
        return int(answer.get("result", answer).get("TTL", 0))

    def revoke(self, lease_id: int) -> None:
        def run() -> None:
            try:
                self._post("/v3/lease/revoke", {"ID": str(lease_id)})
            except GatewayRefusalError as err:
                if err.status != "NOT_FOUND":
                    raise

        self._call(f"lease revoke {lease_id:x}", run)

    def lease_ttl(self, lease_id: int) -> int:
        return int(self._call("lease timetolive", self._post, "/v3/lease/timetolive", {"ID": str(lease_id)})["TTL"])


class GatewayWatchHub:
    """Each watch of a `GatewayStore` on an HTTP stream of its own, read by a thread of its own; a broken or
    idle stream is opened again from the watch's next revision (another endpoint if this one failed)."""

    def __init__(self, store: GatewayStore) -> None:
        self.store = store
        self._lock = threading.Lock()  # guards _open; never held across I/O
        self._open: dict[int, http.client.HTTPConnection | None] = {}  # by id(watch): its stream's connection
        self._closed = threading.Event()
        self.streams_opened = 0

    def add(self, watch: PrefixWatch) -> None:
        with self._lock:
            self._open[id(watch)] = None
        threading.Thread(target=self._follow, args=(watch,), name="etcd-gateway-watch", daemon=True).start()

    def remove(self, watch: PrefixWatch) -> None:
        with self._lock:
            connection = self._open.pop(id(watch), None)
        _shut(connection)

    def close(self) -> None:
        """The connection closes: its watches end, each told so (never left waiting on a stream that is gone)."""
        self._closed.set()
        with self._lock:
            connections, self._open = list(self._open.values()), {}
        for connection in connections:
            _shut(connection)

    def _following(self, watch: PrefixWatch) -> bool:
        with self._lock:
            return id(watch) in self._open and not self._closed.is_set()

    def _follow(self, watch: PrefixWatch) -> None:
        backoff = 0.05
        while self._following(watch):
            try:
                if self._stream_once(watch):
                    return  # compacted: the watch was ended with the error
                backoff = 0.05
            except (OSError, http.client.HTTPException, GatewayUnreachableError, ValueError) as err:
                if not self._following(watch):
                    break
                if not isinstance(err, TimeoutError):
                    self.store._fail_endpoint()
                log.debug("watch stream on %s broke (%s); resuming at revision %d", watch.prefix, err,
                          watch.next_revision)
            if not self._following(watch):
                break
            watch.reconnects += 1
            self._closed.wait(backoff)
            backoff = min(backoff * 2, 1.0)
        if self._closed.is_set() and not watch.stopped:
            watch._end(StoreUnavailableError(f"the etcd connection of the watch on {watch.prefix} was closed"))

    def _stream_once(self, watch: PrefixWatch) -> bool:
        """Read one stream until it breaks or idles; True when the watch has ended (compacted)."""
        connection = self.store._new_connection(WATCH_IDLE_SECONDS)
        with self._lock:
            if id(watch) not in self._open or self._closed.is_set():
                connection.close()
                return False
            self._open[id(watch)] = connection
            self.streams_opened += 1
        try:
            create = {"key": _b64(watch.prefix), "range_end": _b64(watch.range_end),
                      "start_revision": str(watch.next_revision)}
            connection.request("POST", "/v3/watch", body=json.dumps({"create_request": create}),
                               headers=self.store._headers())
            response = connection.getresponse()
            if response.status != 200:
                self.store.answer(response.status, response.read())  # raises what etcd said
            while line := response.readline():
                answer = json.loads(line)
                if "error" in answer:
                    raise GatewayUnreachableError(str(answer["error"]))
                result = answer.get("result", {})
                if result.get("compact_revision") and int(result["compact_revision"]) > 0:
                    watch._compacted(int(result["compact_revision"]))
                    return True
                if result.get("canceled"):
                    raise ValueError(f"etcd cancelled the watch on {watch.prefix}: {result.get('cancel_reason')}")
                if result.get("created"):
                    watch._created(_revision(result))
                events = result.get("events")
                if events:
                    watch._deliver([_event(e) for e in events])
            return False
        finally:
            with self._lock:
                if self._open.get(id(watch)) is connection:
                    self._open[id(watch)] = None
            connection.close()


# --- the wire format: proto3 JSON, bytes as base64, 64-bit integers as strings, defaults left out ---


def _shut(connection: http.client.HTTPConnection | None) -> None:
    """End a stream another thread is reading: its read returns at once."""
    if connection is not None and connection.sock is not None:
        with contextlib.suppress(OSError):  # already closed
            connection.sock.shutdown(socket.SHUT_RDWR)


def _answer(status: int, data: bytes) -> dict[str, Any]:
    """A gateway answer as JSON, or the error it carries (transient or final)."""
    try:
        answer = json.loads(data) if data else {}
    except ValueError:
        answer = {"message": data[:200].decode(errors="replace")}
    if status == 200:
        return answer
    name = STATUS_NAMES.get(int(answer.get("code", 2)), "UNKNOWN")
    message = str(answer.get("message") or answer.get("error") or f"HTTP {status}")
    if status in (502, 503, 504) or name in TRANSIENT_STATUSES or any(m in message for m in TRANSIENT_MESSAGES):
        raise GatewayUnreachableError(f"{name}: {message}")
    raise GatewayRefusalError(name, message)


def _b64(value: bytes | str) -> str:
    return base64.b64encode(as_bytes(value)).decode()


def _unb64(value: str | None) -> bytes:
    return base64.b64decode(value) if value else b""


def _revision(answer: dict[str, Any]) -> int:
    return int(answer.get("header", {}).get("revision", 0))


def _entry(kv: dict[str, Any]) -> Entry:
    return Entry(_unb64(kv["key"]).decode(), _unb64(kv.get("value")), int(kv.get("mod_revision", 0)),
                 int(kv.get("create_revision", 0)), int(kv.get("lease", 0)))


def _event(raw: dict[str, Any]) -> WatchEvent:
    kv = raw["kv"]
    return WatchEvent("delete" if raw.get("type") == "DELETE" else "put", _unb64(kv["key"]).decode(),
                      _unb64(kv.get("value")), int(kv.get("mod_revision", 0)))


def _compare(c: Compare) -> dict[str, Any]:
    if isinstance(c, ModRevisionIs):
        return {"key": _b64(c.key), "target": "MOD", "result": "EQUAL", "mod_revision": str(c.revision)}
    if isinstance(c, UnchangedSince):
        return {"key": _b64(c.prefix), "range_end": _b64(prefix_range_end(c.prefix.encode())), "target": "MOD",
                "result": "LESS", "mod_revision": str(c.revision + 1)}
    return {"key": _b64(c.key), "target": "VALUE", "result": "EQUAL", "value": _b64(c.value)}


def _put(o: Put) -> dict[str, Any]:
    body = {"key": _b64(o.key), "value": _b64(o.value)}
    if o.lease:
        body["lease"] = str(o.lease)
    return body


def _op(o: Op) -> dict[str, Any]:
    if isinstance(o, Put):
        return {"request_put": _put(o)}
    assert isinstance(o, Delete)
    body = {"key": _b64(o.key)}
    if o.prefix:
        body["range_end"] = _b64(prefix_range_end(o.key.encode()))
    return {"request_delete_range": body}
