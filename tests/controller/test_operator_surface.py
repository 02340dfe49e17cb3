"""The operator's commands against job states written into a real etcd with the project's own functions
(submit, the round protocol's transactions, the controller's status): no controller, no workers run."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from cli_harness import REPO

from elastic.cli.local_etcd import STATE_ENV, endpoint_file
from elastic.cli.main import build_parser, main
from elastic.controller.machinery.etcd_election import Election
from elastic.controller.reconcile import Observed
from elastic.controller.status import job_status
from elastic.controller.submit import submit_job
from elastic.policy.incident import Failure, RoundEnd
from elastic.rendezvous.run import JobRun
from elastic.rendezvous.state import Closed
from elastic.spec import parse_job
from elastic.store import JobKeys, LeaseKeeper, Store
from harness.agents import wait_until

PYTHON_ERROR = "RuntimeError: loss is nan at step 40"  # exit 1: retryable (a missing script, exit 2, is not)


def spec(name: str, max_restarts: int = 1) -> dict:
    return {"apiVersion": "elastic.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": name},
            "spec": {"minReplicas": 1, "maxReplicas": 2, "replicas": 1,
                     "worker": {"command": ["python", "examples/train_dpp.py"]},
                     "failurePolicy": {"maxRestarts": max_restarts}}}  # fmt: skip


@pytest.fixture
def store(etcd_server):
    with Store(etcd_server.client_url) as client:
        yield client
        client.delete_prefix("/elastic/")


def fail_twice(store: Store, name: str, log_dir: Path) -> tuple[str, Path]:
    """A job whose one worker exits 2 in two rounds: with maxRestarts 1 the second charge closes it
    (BackoffLimitExceeded), as the agents' transactions do; the status is the controller's for that state."""
    job = submit_job(store, parse_job(spec(name)))
    keys = JobKeys("default", name)
    worker, run = f"{name}-ab12", JobRun(store, keys)
    member = f"{worker}-4242-beef"  # the agent's id: its worker's name, its pid, a token
    log = log_dir / f"{worker}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(f"agent line {i}\n" for i in range(30)) + PYTHON_ERROR + "\nE1204 failed (exitcode: 1)\n")
    store.put_json(keys.log(worker), {"path": str(log), "started_at": time.time()})
    run.ensure_run(job.metadata.uid, 1, 600)
    for _ in range(2):
        state = run.read()
        assert run.seal(state, state.round, {member: 0})
        state = run.read()
        run.end_round(state, state.round, run.incident(state, RoundEnd.WORKER_FAILURE, Failure(1, member=member)))
    status = job_status(Observed(job, run.read(), ()), None, None)
    store.put_json(keys.status, status)
    return worker, log


def test_a_failed_job_shows_its_root_cause_and_a_budget_that_never_reads_over_its_max(store, etcd_server, tmp_path,
                                                                                       capsys) -> None:
    worker, log = fail_twice(store, "typo", tmp_path / "logs")
    assert main(["status", "--etcd", etcd_server.client_url]) == 0
    out = capsys.readouterr().out
    assert "Failed" in out and "1/1" in out and "2/1" not in out, out
    assert f"worker {worker} log: {log}" in out and PYTHON_ERROR in out, out

    assert main(["describe", "typo", "--etcd", etcd_server.client_url]) == 0
    out = capsys.readouterr().out
    assert "Budget:        2 charged, maxRestarts 1" in out, out
    assert "Controller:    none running" in out and "Replicas:    1 (min 1, max 2)" in out, out
    charges = [line for line in out.splitlines() if "WorkerFailure" in line and "exit code 1" in line]
    assert len(charges) >= 2, out  # the budget's two rows (and the events)
    assert "BackoffLimitExceeded" in out.split("Events:")[1] and PYTHON_ERROR in out.split("Last Failure:")[1]


def test_logs_by_worker_or_member_id_with_tail(store, etcd_server, tmp_path, capsys) -> None:
    worker, _ = fail_twice(store, "typo", tmp_path / "logs")
    etcd = ["--etcd", etcd_server.client_url]
    assert main(["logs", "typo", "--worker", f"{worker}-4242-beef", "--tail", "2", *etcd]) == 0
    assert capsys.readouterr().out.splitlines() == [PYTHON_ERROR, "E1204 failed (exitcode: 1)"]
    assert main(["logs", "typo", "--etcd", etcd_server.client_url]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "agent line 0", "one worker: its log as written"
    assert main(["logs", "typo", "--worker", "nobody", "--etcd", etcd_server.client_url]) == 1
    assert f"workers: {worker}" in capsys.readouterr().err


def test_logs_follow_prints_new_lines_and_ends_with_the_job(store, etcd_server, tmp_path) -> None:
    keys, log = JobKeys("default", "follow"), tmp_path / "follow-0001.log"
    job = submit_job(store, parse_job(spec("follow")))
    run = JobRun(store, keys)
    run.ensure_run(job.metadata.uid, 1, 600)
    log.write_text("first\n")
    store.put_json(keys.log("follow-0001"), {"path": str(log), "started_at": time.time()})
    store.put_json(keys.status, job_status(Observed(job, run.read(), ()), None, None))
    out = tmp_path / "out"
    with out.open("w") as sink:
        follower = subprocess.Popen([sys.executable, "-m", "elastic.cli.main", "logs", "follow", "-f", "--etcd",
                                     etcd_server.client_url], cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: "first" in out.read_text(), 30), out.read_text()
        with log.open("a") as file:
            file.write("second\n")
        assert wait_until(lambda: "second" in out.read_text(), 30), out.read_text()
        assert follower.poll() is None, "it follows while the job runs"
        run.close(run.read(), Closed("Deleted", "deleted by the user", time.time()))
        store.put_json(keys.status, job_status(Observed(job, run.read(), ()), None, None))
        assert follower.wait(30) == 0, out.read_text()
    finally:
        if follower.poll() is None:
            follower.kill()
    assert out.read_text().splitlines() == ["[follow-0001] first", "[follow-0001] second"]


def test_status_objects_are_kubernetes_shaped_and_wide_adds_columns(store, etcd_server, tmp_path, capsys) -> None:
    fail_twice(store, "typo", tmp_path / "logs")
    assert main(["status", "typo", "-o", "yaml", "--etcd", etcd_server.client_url]) == 0
    one = yaml.safe_load(capsys.readouterr().out)
    assert (one["apiVersion"], one["kind"], one["metadata"]["name"]) == ("elastic.dev/v1alpha1", "ElasticJob", "typo")
    assert one["spec"]["maxReplicas"] == 2 and one["status"]["phase"] == "Failed"
    assert main(["status", "-o", "json", "--etcd", etcd_server.client_url]) == 0
    listed = yaml.safe_load(capsys.readouterr().out)
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == ["typo"]
    assert main(["status", "-o", "wide", "--etcd", etcd_server.client_url]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[-5:] == ["REASON", "LOSS", "RUN", "LAST", "FAILURE"] and "AGE" in header


def test_delete_without_a_controller_removes_a_job_nothing_of_which_runs(store, etcd_server, tmp_path,
                                                                         capsys) -> None:
    fail_twice(store, "typo", tmp_path / "logs")
    assert main(["delete", "typo", "--etcd", etcd_server.client_url]) == 0
    assert "keys are removed" in capsys.readouterr().out
    assert store.get_prefix("/elastic/jobs/default/typo/")[0] == []
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(spec("typo")))
    assert main(["submit", str(path), "--etcd", etcd_server.client_url]) == 0, "submitted again under its name"


def test_delete_without_a_controller_says_which_to_start_while_agents_live(store, etcd_server, capsys) -> None:
    job = submit_job(store, parse_job(spec("alive")))
    keys = JobKeys("default", "alive")
    JobRun(store, keys).ensure_run(job.metadata.uid, 1, 600)
    agent = LeaseKeeper.grant(store, 30)
    try:
        store.put_json(keys.member("alive-ab12-77-aa"), {"round": 0}, agent.lease_id)
        assert main(["delete", "alive", "--etcd", etcd_server.client_url]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "1 live agent(s)" in err and "elastic controller --etcd" in err, err
        assert JobRun(store, keys).read().closed.reason == "Deleted", "closed all the same: agents stop at rendezvous"
    finally:
        agent.revoke()


def test_submit_and_scale_hint_when_no_controller_runs(store, etcd_server, tmp_path, capsys) -> None:
    path = tmp_path / "hint.yaml"
    path.write_text(yaml.safe_dump(spec("hint")))
    assert main(["submit", str(path), "--etcd", etcd_server.client_url]) == 0
    err = capsys.readouterr().err
    assert "no controller is running" in err and "/elastic/controllers/leader" in err, err
    run_leads = Election(store, role="run")
    assert run_leads.lead() is not None
    try:
        assert main(["scale", "hint", "2", "--etcd", etcd_server.client_url]) == 0
        assert "'elastic run'" in capsys.readouterr().err, "an elastic run leads: it runs only its own job"
        store.put(JobKeys("default", "hint").member("agent-1"), b"{}")  # the job is that run's: it has an agent
        assert main(["scale", "hint", "2", "--etcd", etcd_server.client_url]) == 0
        assert capsys.readouterr().err == "", "the run that leads runs this job: the change applies"
        store.delete(JobKeys("default", "hint").member("agent-1"))
    finally:
        run_leads.resign()
    controller = Election(store)
    assert controller.lead() is not None
    try:
        assert main(["scale", "hint", "1", "--etcd", etcd_server.client_url]) == 0
        assert capsys.readouterr().err == ""
    finally:
        controller.resign()


def test_submit_right_after_a_controller_starts_waits_for_its_election_instead_of_warning(
    store, etcd_server, tmp_path, capsys
) -> None:
    """`elastic controller &` then `elastic submit`: the controller wins its election a moment later."""
    path = tmp_path / "soon.yaml"
    path.write_text(yaml.safe_dump(spec("soon")))
    controller = Election(store)
    elected = threading.Timer(0.5, controller.lead)
    elected.start()
    try:
        assert main(["submit", str(path), "--etcd", etcd_server.client_url]) == 0
        assert "warning" not in capsys.readouterr().err
    finally:
        elected.join()
        controller.resign()


@pytest.mark.parametrize(("given", "number"), [("TERM", 15), ("SIGKILL", 9), ("hup", 1), ("2", 2)])
def test_chaos_signals_by_name_or_number(given, number) -> None:
    args = build_parser().parse_args(["chaos", "kill", "j", "--signal", given, "--etcd", "http://127.0.0.1:1"])
    assert args.signal == number


def test_a_signal_that_does_not_exist_is_a_usage_line(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["chaos", "kill", "j", "--signal", "TERMINATE", "--etcd", "http://127.0.0.1:1"])
    assert exit_.value.code == 2 and "'TERMINATE' is not a signal" in capsys.readouterr().err


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("elastic ")


def test_without_etcd_flag_or_variable_commands_use_a_running_local_elastic_etcd(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    monkeypatch.delenv("ELASTIC_ETCD", raising=False)
    env = {**os.environ}
    etcd = subprocess.Popen([sys.executable, "-m", "elastic.cli.main", "etcd"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_until(lambda: endpoint_file().exists(), 60), "elastic etcd writes its address"
        shown = subprocess.run([sys.executable, "-m", "elastic.cli.main", "status"], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and shown.stdout.startswith("JOB"), shown.stderr
    finally:
        etcd.terminate()
        etcd.wait(30)
    assert not endpoint_file().exists(), "removed when that etcd stops"


@pytest.mark.parametrize("pid", ["dead", "another program"])
def test_an_address_whose_etcd_is_gone_is_no_default_and_the_error_says_how_to_start_one(
    pid, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    monkeypatch.delenv("ELASTIC_ETCD", raising=False)
    if pid == "dead":
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        pid = dead.stdout.strip()
    else:  # a reused pid: alive, but not that etcd
        pid = str(os.getpid())
    endpoint_file().parent.mkdir(parents=True)
    endpoint_file().write_text(f"http://127.0.0.1:1\n{pid}\n{tmp_path / 'etcd'}\n")
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no etcd given (--etcd URL or $ELASTIC_ETCD)"), err
    assert "'elastic etcd start'" in err and len(err.splitlines()) == 1, err


def test_bash_completion_completes_verbs_options_and_job_names(store, etcd_server, capsys) -> None:
    submit_job(store, parse_job(spec("typo")))
    assert main(["status", "-o", "name", "--etcd", etcd_server.client_url]) == 0
    assert capsys.readouterr().out == "default/typo\n"
    script = subprocess.run([sys.executable, "-m", "elastic.cli.main", "completion", "bash"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    env = {**os.environ, "ELASTIC_ETCD": etcd_server.client_url,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # where `elastic` is installed

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        show = 'printf "%s\\n" "${COMPREPLY[@]}"'
        probe = f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _elastic; {show}"
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True, env=env,
                              cwd=REPO).stdout.split()

    assert complete("elastic", "de") == ["delete", "describe"]
    assert set(complete("elastic", "logs", "job", "--")) >= {"--follow", "--worker", "--tail", "--etcd"}
    assert complete("elastic", "chaos", "kill", "--sig") == ["--signal"]
    assert complete("elastic", "chaos", "") == ["kill"]
    assert complete("elastic", "describe", "def") == ["default/typo"]
    assert complete("elastic", "chaos", "kill", "") == ["default/typo"]
    assert "default/typo" not in complete("elastic", "scale", "default/typo", ""), "the job is given already"


def test_elastic_agent_is_torchrun_with_its_own_arguments() -> None:
    shown = subprocess.run([sys.executable, "-m", "elastic.cli.main", "agent", "--help"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--rdzv-backend" in shown.stdout and "--nnodes" in shown.stdout, shown.stderr


@pytest.mark.parametrize(("role", "said"), [("controller", "the controller is stopping its workers"),
                                            ("run", "an 'elastic controller' finishes it after that run ends")])
def test_delete_under_a_leader_that_does_not_finish_in_time_says_who_will(role, said, store, etcd_server,
                                                                          capsys) -> None:
    job = submit_job(store, parse_job(spec("slow")))
    JobRun(store, JobKeys("default", "slow")).ensure_run(job.metadata.uid, 1, 600)
    leader = Election(store, role=role)
    assert leader.lead() is not None
    try:
        assert main(["delete", "slow", "--timeout", "0.5", "--etcd", etcd_server.client_url]) == 0
        assert said in capsys.readouterr().out
        assert store.get("/elastic/jobs/default/slow/spec") is not None, "kept for the controller to finish"
    finally:
        leader.resign()


def test_describe_shows_the_spares_ready_beside_those_wanted(store, etcd_server, capsys) -> None:
    job = submit_job(store, parse_job({**spec("spare"), "spec": {**spec("spare")["spec"], "spares": 1}}))
    store.put_json(JobKeys("default", "spare").status, {"phase": "Running", "spares": {"wanted": 1, "ready": 0}})
    assert main(["describe", job.metadata.name, "--etcd", etcd_server.client_url]) == 0
    assert "  Spares:      0/1 (ready/wanted)" in capsys.readouterr().out
