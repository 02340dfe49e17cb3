"""Bad input gets one clear error naming the field and the fix, and nothing starts or lands in etcd."""

from __future__ import annotations

import copy
import time

import pytest
import yaml

from elastic.cli.main import main
from elastic.store import Store
from elastic.store.server import free_port

VALID = {
    "apiVersion": "elastic.dev/v1alpha1",
    "kind": "ElasticJob",
    "metadata": {"name": "bad"},
    "spec": {"minReplicas": 1, "maxReplicas": 2, "worker": {"command": ["python", "examples/train_ddp.py"]}},
}


def broken(path: str, value) -> dict:
    """VALID with one value replaced (path like 'spec.worker.command'); value None deletes the key."""
    doc = copy.deepcopy(VALID)
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node.setdefault(part, {})
    if value is None:
        del node[last]
    else:
        node[last] = value
    return doc


CASES = [
    ("min above max", broken("spec.minReplicas", 3), "spec.minReplicas"),
    ("negative budget", broken("spec.failurePolicy", {"maxRestarts": -1}), "spec.failurePolicy.maxRestarts"),
    ("unknown rule action", broken("spec.failurePolicy", {"rules": [{"action": "Retry", "onReasons": ["x"]}]}),
     "spec.failurePolicy.rules[0].action"),
    ("a rule without a condition", broken("spec.failurePolicy", {"rules": [{"action": "Ignore"}]}),
     "spec.failurePolicy.rules[0]"),
    ("empty command", broken("spec.worker.command", []), "spec.worker.command"),
    ("misspelt key", broken("spec.worker", {"comand": ["python"]}), "did you mean 'command'"),
    ("name not a DNS label", broken("metadata.name", "My_Job"), "metadata.name"),
    ("wrong kind", broken("kind", "PyTorchJob"), "kind"),
    ("wrong apiVersion", broken("apiVersion", "v1"), "apiVersion"),
    ("replicas as a string", broken("spec.replicas", "3"), "spec.replicas"),
    ("unknown restart policy", broken("spec.restartPolicy", "Always"), "spec.restartPolicy"),
    ("negative last call", broken("spec.rendezvous", {"lastCallSeconds": -1}), "spec.rendezvous.lastCallSeconds"),
    ("zero nproc", broken("spec.nprocPerNode", 0), "spec.nprocPerNode"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_spec_is_rejected_before_anything_happens(doc, field, tmp_path, etcd_server, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--etcd", etcd_server.client_url, "--log-dir", str(tmp_path / "logs")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and field in err, err
    assert "Traceback" not in err
    with Store(etcd_server.client_url) as store:
        assert store.get_prefix("/elastic/jobs/default/bad/")[0] == [], "nothing may be written to etcd"
    assert not (tmp_path / "logs").exists(), "no worker may have been started"


def test_a_yaml_syntax_error_names_the_file(tmp_path, capsys) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("spec: [unclosed\n")
    assert main(["validate", str(path)]) == 1
    assert str(path) in capsys.readouterr().err


def test_a_dead_etcd_is_one_readable_line(capsys) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["status", "--etcd", dead]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and dead in err and "Check that etcd is running" in err


@pytest.mark.parametrize("endpoint", ["", "http://", "ftp://x:1", "127.0.0.1:99999", "http://[::1:2379"])
@pytest.mark.parametrize("verb", [["status"], ["controller"], ["run", "examples/elasticjob.yaml"]], ids=" ".join)
def test_a_malformed_etcd_endpoint_is_one_line_at_once(verb: list[str], endpoint: str, capsys) -> None:
    started = time.monotonic()
    assert main([*verb, "--etcd", endpoint]) == 1
    err = capsys.readouterr().err
    assert time.monotonic() - started < 2, "a malformed endpoint is known before any connection is tried"
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "etcd endpoint" in err, err


@pytest.mark.parametrize("name", ["a/b/c", "/", "ns/", "/x", "../x", "ns/../x", "My_Job", "x y", "a" * 64])
@pytest.mark.parametrize("verb", ["status", "scale", "delete", "chaos"])
def test_a_job_name_that_is_not_a_label_is_one_clean_error(verb: str, name: str, etcd_server, capsys) -> None:
    argv = {"status": ["status", name], "scale": ["scale", name, "1"], "delete": ["delete", name],
            "chaos": ["chaos", "kill", name]}[verb]
    assert main([*argv, "--etcd", etcd_server.client_url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: job ") and err.count("\n") == 1, err
    assert "expected 'namespace/name' or 'name'" in err or "DNS-1123" in err, err


@pytest.fixture
def submitted(etcd_server, tmp_path):
    """One submitted job (no controller runs: these commands only read and write etcd)."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(broken("metadata.name", "scaled")))
    assert main(["submit", str(path), "--etcd", etcd_server.client_url]) == 0
    with Store(etcd_server.client_url) as store:
        yield store
        store.delete_prefix("/elastic/jobs/default/scaled/")


@pytest.mark.parametrize("replicas", ["-1", "2147483648", "99999999999999999999"])
def test_scale_refuses_a_value_outside_int32_before_writing(replicas, submitted, etcd_server, capsys) -> None:
    before = submitted.get("/elastic/jobs/default/scaled/spec")
    assert main(["scale", "scaled", replicas, "--etcd", etcd_server.client_url]) == 1
    err = capsys.readouterr().err
    assert "spec.replicas" in err and "Traceback" not in err, err
    assert submitted.get("/elastic/jobs/default/scaled/spec") == before


@pytest.mark.parametrize(
    ("key", "value", "verb"),
    [
        ("status", '{"phase":5}', ["status"]),
        ("status", "not json{", ["status", "scaled", "-o", "json"]),
        ("workers/w1", '{"pid":"12"}', ["chaos", "kill", "scaled"]),
        ("spec", '{"apiVersion":"elastic.dev/v1alpha1"}', ["scale", "scaled", "2"]),
    ],
)
def test_a_corrupt_key_is_shown_never_a_traceback(key, value, verb, submitted, etcd_server, capsys) -> None:
    full_key = f"/elastic/jobs/default/scaled/{key}"
    submitted.put(full_key, value)
    code = main([*verb, "--etcd", etcd_server.client_url])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if verb[0] == "status":  # the job is listed, its status says what is wrong and where
        assert code == 0 and "CorruptState" in out and full_key in out, out
    else:
        assert code == 1 and err.count("\n") == 1 and full_key in err, err


@pytest.mark.parametrize("verb", ["validate", "submit"])
def test_replicas_outside_the_bounds_is_a_warning_naming_the_clamped_value(verb, tmp_path, etcd_server, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(broken("spec.replicas", 0)))
    argv = [verb, str(path)] + (["--etcd", etcd_server.client_url] if verb == "submit" else [])
    try:
        assert main(argv) == 0, "a warning is not an error"
        out, err = capsys.readouterr()
        assert err.splitlines()[0] == f"warning: {path}: spec.replicas: 0 is below minReplicas; the job runs 1 " \
                                      "worker(s) (clamped into [1, 2])", err
        assert err.count("\n") == (2 if verb == "submit" else 1), "submit adds that no controller runs"
        assert "bad" in out
    finally:
        with Store(etcd_server.client_url) as store:
            store.delete_prefix("/elastic/jobs/default/bad/")


def test_run_refuses_more_processes_than_the_machine_takes_before_starting_anything(tmp_path, capsys) -> None:
    path = tmp_path / "job.yaml"
    doc = broken("spec.maxReplicas", 1_000_000_000)
    doc["spec"]["minReplicas"] = 1_000_000_000  # it can never run here (one that fits smaller runs at what fits)
    path.write_text(yaml.safe_dump(doc))
    started = time.monotonic()
    code = main(["run", str(path), "--max-local-processes", "8", "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert code == 1 and time.monotonic() - started < 2, "refused before a managed etcd is even started"
    assert err.count("\n") == 1 and "1000000000 training processes, more than the 8" in err, err
    assert "spec.minReplicas" in err and "--max-local-processes" in err, err
    assert not (tmp_path / "logs").exists()


def test_a_bad_process_cap_is_a_usage_error(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("ELASTIC_MAX_LOCAL_PROCESSES", "lots")
    with pytest.raises(SystemExit) as exited:
        main(["run", "examples/elasticjob.yaml"])
    assert exited.value.code == 2
    assert "--max-local-processes: 'lots' is not a whole number" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["etcd", "--port", "99999"], "--port: '99999' is not a whole number from 1 to 65535"),
        (["chaos", "kill", "j", "--signal", "99999"], "--signal: '99999' is not a whole number from 1 to"),
        (["chaos", "kill", "j", "--signal", "-9"], "--signal: '-9' is not a whole number from 1 to"),
        (["run", "x.yaml", "--max-local-processes", "0"], "--max-local-processes: '0' is not a whole number"),
    ],
)
def test_a_number_the_os_would_refuse_is_a_usage_line(argv: list[str], expected: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and expected in err and "Traceback" not in err, err


@pytest.mark.parametrize(("rules", "listed"), [
    ([], "exit codes 2, 126, 127 fail the job at once"),
    ([{"action": "RestartJob", "onExitCodes": {"operator": "In", "values": [2]}}], "exit codes 126, 127 fail"),
], ids=["defaults", "a rule naming exit 2 takes it out"])
def test_validate_says_which_exit_codes_fail_the_job_at_once(rules, listed, tmp_path, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(broken("spec.failurePolicy", {"maxRestarts": 3, "rules": rules})))
    assert main(["validate", str(path)]) == 0
    assert listed in capsys.readouterr().out
