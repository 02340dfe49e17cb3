"""List + watch of one kind of Kubernetes object into a local cache, as client-go's informers do.

Polling lists every ElasticJob and every job's pods each pass (about 100 lists a second at 100 jobs); an
informer lists once, then follows a watch from the list's resourceVersion, so the API server sends only
what changed and every read of the controller is a read of the cache. The rules it follows:
- the watch resumes from the last resourceVersion seen (events and bookmarks both advance it), with a
  server-side `timeoutSeconds` jittered so that replicas do not reconnect in step, and a client-side read
  timeout: a watch silent for `read_seconds` (no event, no bookmark; kube-apiserver's watch cache sends a
  bookmark about once a minute) is a dead connection, not a quiet cluster (kubernetes-client/python#1148);
- 410 Gone (the version was compacted away) means the cache may have missed events: list again;
- any other failure (the API server away, a 5xx, a 429, a reset) waits a jittered, growing backoff capped at
  5 s (one list per informer every 5 s is nothing to an API server; a longer cap is that much longer before
  the controller sees a recovered server), then lists again;
- objects are kept as received, less `metadata.managedFields` (server-side apply's bookkeeping, often most
  of an object's metadata, read by nothing here), and never copied: each event is a freshly decoded object;
- `heard` is when the API server last spoke (a list, an event, a bookmark): the controller's `/healthz`
  fails when that is too long ago, so the kubelet restarts a controller whose cache froze;
- each change calls `on_change(object)` (the controller enqueues the object's job); the controller also
  queues every cached object now and then (its resync), so a lost event never leaves a job unreconciled.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from kubernetes import watch
from kubernetes.client import ApiException

log = logging.getLogger(__name__)

GONE = 410
WATCH_READ_SECONDS = 90.0  # more than the ~60 s between kube-apiserver's bookmarks
Key = tuple[str, str]  # (namespace, name)


def object_key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


class Informer:
    """The cache of one list function's objects, kept current by a watch on its own thread."""

    def __init__(
        self,
        list_function: Callable[..., Any],
        on_change: Callable[[dict[str, Any]], None],
        *args: Any,
        watch_seconds: float = 300,
        read_seconds: float = WATCH_READ_SECONDS,
        backoff_seconds: tuple[float, float] = (0.2, 5.0),
        index: Callable[[dict[str, Any]], Hashable] | None = None,
        **kwargs: Any,
    ) -> None:
        """`index`: a value per object to look objects up by (`indexed`), e.g. a pod's job: a job's pods
        are then found without scanning every pod of the cluster."""
        self.index = index
        self._by_index: dict[Hashable, dict[Key, dict[str, Any]]] = {}
        self.list_function = list_function
        self.args, self.kwargs = args, kwargs
        self.on_change = on_change
        self.watch_seconds = watch_seconds
        self.read_seconds = read_seconds
        self.backoff_seconds = backoff_seconds
        self._cache: dict[Key, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{list_function.__name__}", daemon=True)
        self.relists = 0  # how often the cache was rebuilt from a list (410 Gone, errors)
        self.heard = time.monotonic()  # when the API server last answered (list, event, bookmark)

    # --- reads (the controller's; never an API request) ---

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._cache.values())

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._cache.get((namespace, name))

    def indexed(self, value: Hashable) -> list[dict[str, Any]]:
        """The cached objects whose `index` is `value`."""
        with self._lock:
            return list(self._by_index.get(value, {}).values())

    def _store(self, key: Key, obj: dict[str, Any] | None) -> None:
        """Put (or, with None, drop) one object, keeping the index in step; under the lock."""
        old = self._cache.pop(key, None)
        if old is not None and self.index is not None:
            bucket = self._by_index.get(self.index(old), {})
            bucket.pop(key, None)
        if obj is None:
            return
        self._cache[key] = obj
        if self.index is not None:
            self._by_index.setdefault(self.index(obj), {})[key] = obj

    def wait_synced(self, timeout: float) -> bool:
        """True once the first list is in the cache (act only then: an empty cache is not "no objects")."""
        return self._synced.wait(timeout)

    # --- lifecycle ---

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    # --- the list + watch loop ---

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._list()
                failures = 0
                self._follow(version)
            except ApiException as err:
                if err.status == GONE:
                    log.info("%s: resourceVersion too old (410 Gone): listing again", self.list_function.__name__)
                    continue
                failures += 1
                self._back_off(failures, f"{err.status} {err.reason}")
            except Exception as err:  # the API server away, a broken stream: list again after a pause
                failures += 1
                self._back_off(failures, str(err) or type(err).__name__)

    def _list(self) -> str:
        listed = self.list_function(*self.args, _preload_content=False, **self.kwargs)
        data = _json(listed)
        self.heard = time.monotonic()
        fresh = {object_key(obj): _trimmed(obj) for obj in data.get("items") or []}
        with self._lock:
            gone = [obj for key, obj in self._cache.items() if key not in fresh]
            changed = [obj for key, obj in fresh.items() if self._cache.get(key) != obj]
            self._cache, self._by_index = {}, {}
            for key, obj in fresh.items():
                self._store(key, obj)
        self.relists += 1
        self._synced.set()
        for obj in [*gone, *changed]:
            self.on_change(obj)
        return str((data.get("metadata") or {}).get("resourceVersion") or "")

    def _follow(self, version: str) -> None:
        """Apply watch events from `version` on until the server ends the watch; then resume from the last."""
        while not self._stop.is_set():
            self._watch = watch.Watch()
            timeout = int(self.watch_seconds * random.uniform(1.0, 2.0))
            stream = self._watch.stream(
                self.list_function, *self.args, resource_version=version, allow_watch_bookmarks=True,
                timeout_seconds=timeout, _request_timeout=(self.read_seconds, self.read_seconds), **self.kwargs,
            )  # fmt: skip
            for event in stream:
                self.heard = time.monotonic()
                obj = event.get("raw_object") or {}
                kind = event.get("type")
                if kind == "ERROR":
                    code = obj.get("code")
                    raise ApiException(status=code, reason=obj.get("reason") or obj.get("message"))
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                key = object_key(obj)
                with self._lock:
                    self._store(key, None if kind == "DELETED" else _trimmed(obj))
                self.on_change(obj)
                if self._stop.is_set():
                    return

    def _back_off(self, failures: int, why: str) -> None:
        low, high = self.backoff_seconds
        delay = min(high, low * 2 ** min(failures, 16)) * random.uniform(0.5, 1.0)
        log.warning("%s: %s; listing again in %.1f s", self.list_function.__name__, why, delay)
        self._stop.wait(delay)


def _trimmed(obj: dict[str, Any]) -> dict[str, Any]:
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


def _json(response: Any) -> dict[str, Any]:
    return json.loads(response.data)
