"""TLS with client certificates and etcd auth with a per-job role, against a real etcd (certs made here)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from elastic.cli.common import connect, etcd_auth
from elastic.cli.main import build_parser
from elastic.cluster.local import ENDPOINTS_ENV, EXIT_KEY_ENV
from elastic.controller.launch import agent_command, agent_env
from elastic.rendezvous.config import RendezvousConfig
from elastic.rendezvous.run import JobRun
from elastic.spec import parse_job
from elastic.store import EtcdAuth, JobKeys, Store, StoreAccessError
from elastic.store.server import EtcdServer
from harness.fixtures import Certificates, grant_job_role

JOB_A = JobKeys("default", "job-a")
JOB_B = JobKeys("default", "job-b")
PASSWORD_A = "pw-of-job-a"  # a test etcd's password


@pytest.fixture(scope="module")
def job_a_user(secure_etcd: EtcdServer) -> str:
    grant_job_role(secure_etcd, JOB_A, "job-a-agent", PASSWORD_A)
    return "job-a-agent"


def refused_at_once(server: EtcdServer, auth: EtcdAuth) -> str:
    """The error a client with these settings gets, asserting it came without the 5 s retry bound."""
    started = time.monotonic()
    with pytest.raises(StoreAccessError) as caught, Store(server.client_url, auth=auth, retry_seconds=5) as store:
        store.get("/elastic/x")
    assert time.monotonic() - started < 2, "a TLS or auth problem must not be retried as if etcd were down"
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_right_certificates_connect(secure_etcd: EtcdServer, certificates: Certificates, job_a_user: str) -> None:
    with Store(secure_etcd.client_url, auth=certificates.client_auth(user=job_a_user, password=PASSWORD_A)) as store:
        store.put_json(JOB_A.spec, {"ok": True})
        assert store.get_json(JOB_A.spec) == {"ok": True}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param({"cert": None, "key": None}, "needs one signed by a CA it trusts", id="no client certificate"),
        pytest.param({"ca_cert": "other"}, "not signed by the CA given (--etcd-cacert)", id="wrong CA"),
    ],
)
def test_a_tls_mismatch_is_one_clear_line_at_once(
    secure_etcd: EtcdServer, certificates: Certificates, change: dict[str, str | None], expected: str
) -> None:
    fields = {"ca_cert": str(certificates.ca_cert), "cert": str(certificates.client_cert),
              "key": str(certificates.client_key), **change}  # fmt: skip
    if fields["ca_cert"] == "other":
        fields["ca_cert"] = str(certificates.other_ca_cert)
    assert expected in refused_at_once(secure_etcd, EtcdAuth(**fields))


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        pytest.param(EtcdAuth(ca_cert="/nonexistent/ca.pem"),
                     "etcd CA certificate /nonexistent/ca.pem (--etcd-cacert ($ELASTIC_ETCD_CACERT", id="missing CA"),
        pytest.param(EtcdAuth(cert="/nonexistent/c.pem", key="/nonexistent/k.pem"),
                     "client certificate /nonexistent/c.pem", id="missing client certificate"),
        pytest.param(EtcdAuth(cert="/nonexistent/c.pem"), "needs its key", id="certificate without key"),
        pytest.param(EtcdAuth(user="u"), "needs a password", id="user without password"),
    ],
)  # fmt: skip
def test_unusable_settings_are_refused_before_connecting(auth: EtcdAuth, expected: str) -> None:
    with pytest.raises(StoreAccessError, match="^.*" + expected.replace("(", r"\(").replace("$", r"\$")):
        Store("https://127.0.0.1:1", auth=auth)


def test_a_password_over_plain_http_is_refused_before_it_is_sent(etcd_server: EtcdServer) -> None:
    with pytest.raises(StoreAccessError, match=r"refusing to send the etcd password over plain http \(http://"):
        Store(etcd_server.client_url, auth=EtcdAuth(user="u", password="secret"))


def test_a_per_job_role_runs_its_job_and_is_refused_another(
    secure_etcd: EtcdServer, certificates: Certificates, job_a_user: str
) -> None:
    with Store(secure_etcd.client_url, auth=certificates.client_auth(user=job_a_user, password=PASSWORD_A)) as store:
        run_a = JobRun(store, JOB_A)
        run_a.ensure_run("run-a", 3, 60)
        assert run_a.read().run_id == "run-a"
        with pytest.raises(StoreAccessError) as caught:
            JobRun(store, JOB_B).ensure_run("run-b", 3, 60)
    message = str(caught.value)
    assert "permission denied" in message and JOB_B.prefix.rstrip("/") in message
    assert "job-a-agent" in message and PASSWORD_A not in message


def test_flags_beat_the_environment_and_every_command_has_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTIC_ETCD_CACERT", "/env/ca.pem")
    monkeypatch.setenv("ELASTIC_ETCD_PASSWORD", "from-env")
    parser = build_parser()
    for verb in (["submit", "x.yaml"], ["status"], ["scale", "j", "2"], ["delete", "j"], ["controller"],
                 ["run", "x.yaml"], ["chaos", "kill", "j"]):  # fmt: skip
        args = parser.parse_args([*verb, "--etcd", "https://h:2379", "--etcd-cacert", "/flag/ca.pem",
                                  "--etcd-user", "u"])  # fmt: skip
        assert etcd_auth(args) == EtcdAuth(ca_cert="/flag/ca.pem", user="u", password="from-env"), verb


def test_connect_uses_the_command_settings(etcd_server: EtcdServer) -> None:
    args = build_parser().parse_args(["status", "--etcd", etcd_server.client_url, "--etcd-password", "p",
                                      "--etcd-user", "u"])  # fmt: skip
    with pytest.raises(StoreAccessError, match="plain http"):
        connect(args)


def test_rdzv_conf_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTIC_ETCD_CACERT", "/env/ca.pem")
    monkeypatch.setenv("ELASTIC_ETCD_USER", "env-user")
    monkeypatch.setenv("ELASTIC_ETCD_PASSWORD", "env-secret")
    params = RendezvousParameters("etcd-v3", "https://h:2379", "run-1", 1, 2, user="conf-user")
    config = RendezvousConfig.from_parameters(params)
    assert config.auth == EtcdAuth(ca_cert="/env/ca.pem", user="conf-user", password="env-secret")
    assert "env-secret" not in repr(config)


def test_agents_get_the_settings_in_their_environment_never_on_their_command_line(tmp_path: Path) -> None:
    job = parse_job({
        "apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "job-a"},
        "spec": {"minReplicas": 1, "maxReplicas": 2, "worker": {"command": ["python", "train.py"]}},
    })  # fmt: skip
    auth = EtcdAuth("/c/ca.pem", "/c/cert.pem", "/c/key.pem", "job-a-agent", "s3cret-pw")
    command = " ".join(agent_command(job, "https://h:2379", "run-1"))
    env = agent_env(job, "https://h:2379", auth)
    assert "s3cret-pw" not in command and "job-a-agent" not in command and "/c/" not in command
    assert {k: v for k, v in env.items() if k.startswith("ELASTIC_ETCD_") and k != "ELASTIC_ETCD_ENDPOINTS"} == {
        "ELASTIC_ETCD_CACERT": "/c/ca.pem", "ELASTIC_ETCD_CERT": "/c/cert.pem", "ELASTIC_ETCD_KEY": "/c/key.pem",
        "ELASTIC_ETCD_USER": "job-a-agent", "ELASTIC_ETCD_PASSWORD": "s3cret-pw",
    }  # fmt: skip
    assert EtcdAuth.from_env(env) == auth
    assert "s3cret-pw" not in repr(auth)


def test_credentials_in_an_endpoint_url_are_refused() -> None:
    with pytest.raises(ValueError, match="not in the URL") as caught:
        Store("https://u:s3cret@h:2379")
    assert "s3cret" not in str(caught.value)


def test_an_agent_records_its_exit_code_with_the_settings_from_its_environment(
    secure_etcd: EtcdServer, certificates: Certificates, job_a_user: str
) -> None:
    auth = certificates.client_auth(user=job_a_user, password=PASSWORD_A)
    key = JOB_A.worker_exit("job-a-0001")
    program = "from elastic.cluster.local import exit_recorded\nwith exit_recorded():\n    raise SystemExit(3)\n"
    env = {**os.environ, **auth.env(), EXIT_KEY_ENV: key, ENDPOINTS_ENV: secure_etcd.client_url}
    finished = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 3 and "could not record" not in finished.stderr, finished.stderr
    with Store(secure_etcd.client_url, auth=auth) as store:
        assert store.get_json(key)["exit_code"] == 3
