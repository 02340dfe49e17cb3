"""The live view's watch (elastic/cli/live_watch.py) against a real etcd: it ends once the job's last change
is shown, whatever else etcd wrote after it."""

from __future__ import annotations

import threading
import uuid

from elastic.cli.live_watch import JobFollower, PlainSink
from elastic.store import JobKeys, Store
from elastic.store.server import EtcdServer


def test_the_view_ends_at_the_jobs_last_change_though_another_key_was_written_after_it(
    etcd_server: EtcdServer, capsys
) -> None:
    """`elastic run` ends its view after the controller resigned: etcd's revision is then the leader key's,
    which a watch on the job's keys never sees; waiting for it stalled every run's end."""
    keys = JobKeys("default", f"v-{uuid.uuid4().hex[:6]}")
    with Store(etcd_server.client_url, retry_seconds=5) as store:
        follower = JobFollower(store, keys, PlainSink())
        shown = threading.Thread(target=follower.follow, kwargs={"done": lambda _: False}, daemon=True)
        shown.start()
        store.put_json(keys.status, {"phase": "Failed", "reason": "FailJobRule", "message": "exit code 1"})
        store.put(f"/elastic-test/other-{uuid.uuid4().hex[:6]}", b"resigned")  # a later write elsewhere
        follower.finish(follower.last_change())
        shown.join(timeout=30)
        assert not shown.is_alive(), "the view waited for a revision of a key it does not watch"
    assert "Failed" in capsys.readouterr().out, "the job's last change was shown before the view ended"
