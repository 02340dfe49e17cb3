"""manifests/etcd-tenant.sh against a real etcd (https, client certificates, auth on): one namespace's workers
get a user that may use that namespace's jobs and nothing else, and the Secret their pods mount."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from elastic.store import JobKeys, Store, StoreAccessError
from elastic.store.keys import controller_leader_key
from elastic.store.server import EtcdServer
from harness.fixtures import ROOT_PASSWORD, Certificates

SCRIPT = Path(__file__).resolve().parents[2] / "manifests" / "etcd-tenant.sh"


def tenant(etcd: EtcdServer, certificates: Certificates, directory: Path, namespace: str) -> dict:
    """Run the script as an operator would (etcdctl from the environment, as root); the Secret it wrote."""
    for source, name in ((certificates.ca_cert, "ca.crt"), (certificates.client_cert, "worker.crt"),
                         (certificates.client_key, "worker.key")):  # fmt: skip
        shutil.copy(source, directory / name)
    env = {**os.environ, "PATH": f"{etcd.binary.parent}:{os.environ['PATH']}", "ETCDCTL_API": "3",
           "ETCDCTL_ENDPOINTS": etcd.client_url, "ETCDCTL_CACERT": str(certificates.ca_cert),
           "ETCDCTL_CERT": str(certificates.client_cert), "ETCDCTL_KEY": str(certificates.client_key),
           "ETCDCTL_USER": f"root:{ROOT_PASSWORD}"}  # fmt: skip
    subprocess.run(["sh", str(SCRIPT), namespace, str(directory)], env=env, check=True, timeout=60,
                   capture_output=True)  # fmt: skip
    return yaml.safe_load((directory / f"worker-{namespace}.yaml").read_text())


def test_a_namespaces_workers_may_use_its_jobs_only(secure_etcd: EtcdServer, certificates: Certificates,
                                                    tmp_path: Path) -> None:  # fmt: skip
    secret = tenant(secure_etcd, certificates, tmp_path, "team-a")
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == ("elastic-etcd-worker", "team-a")
    assert base64.b64decode(secret["data"]["ca.crt"]) == certificates.ca_cert.read_bytes()
    user, password = secret["stringData"]["username"], secret["stringData"]["password"]
    auth = certificates.client_auth(user=user, password=password)
    with Store(secure_etcd.client_url, auth=auth, retry_seconds=5) as store:
        store.put_json(JobKeys("team-a", "train").spec, {"ok": True})
        assert store.get_json(JobKeys("team-a", "train").spec) == {"ok": True}
        for forbidden in (JobKeys("team-b", "train").spec, controller_leader_key("kubernetes")):
            with pytest.raises(StoreAccessError):
                store.put_json(forbidden, {"ok": False})
    rotated = tenant(secure_etcd, certificates, tmp_path, "team-a")["stringData"]["password"]
    assert rotated != password
    with pytest.raises(StoreAccessError), Store(secure_etcd.client_url, auth=auth, retry_seconds=5) as store:
        store.get_json(JobKeys("team-a", "train").spec)  # the old password no longer works
