"""`elastic run --metrics-port`: a real /metrics endpoint scraped while a job with one injected crash runs."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from cli_harness import job_yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.agents import wait_until

pytestmark = pytest.mark.slow

STARTUP = 90
LABELS = {"job_namespace": "default", "job_name": "metrics-crash"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    """Every sample of /metrics by (name, sorted labels); None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_a_crash_is_one_charge_two_rounds_and_a_timed_recovery(cli, tmp_path) -> None:
    job = job_yaml("metrics-crash", ["--steps", "60", "--crash-at-step", "17", "--crash-exit-code", "137",
                                     "--crash-once-marker", "crashed"])  # fmt: skip
    port = free_port()
    run = cli.start("run", str(cli.write(job)), "--log-dir", str(tmp_path / "logs"), "--metrics-port", str(port))
    seen: dict = {}

    def running() -> bool:
        seen["now"] = scrape(port) or {}
        return value(seen["now"], "elastic_world_size", **LABELS) == 2 or run.poll() is not None

    assert wait_until(running, STARTUP) and run.poll() is None, cli.output(run)
    before = seen["now"]
    assert value(before, "elastic_rounds_total", **LABELS) == 1
    assert value(before, "elastic_restarts_charged_total", **LABELS, reason="WorkerFailure") == 0, "there at 0"
    assert value(before, "elastic_restart_budget_remaining", **LABELS) == 3
    assert value(before, "elastic_members", **LABELS) == 2
    assert value(before, "elastic_jobs", phase="Running") == 1

    def recovered() -> bool:
        seen["now"] = scrape(port) or {}
        return bool(value(seen["now"], "elastic_recovery_duration_seconds_count", phase="first_step")) or (
            run.poll() is not None
        )

    assert wait_until(recovered, 120), (cli.output(run), seen["now"])
    after = seen["now"]
    charged = value(after, "elastic_restarts_charged_total", **LABELS, reason="WorkerFailure")
    assert charged == 1, after
    assert value(after, "elastic_rounds_total", **LABELS) >= 2
    assert value(after, "elastic_restart_budget_remaining", **LABELS) == 2
    assert value(after, "elastic_recovery_duration_seconds_count", phase="rendezvous") == 1
    rendezvous = value(after, "elastic_recovery_duration_seconds_sum", phase="rendezvous")
    first_step = value(after, "elastic_recovery_duration_seconds_sum", phase="first_step")
    assert 0 <= rendezvous <= first_step < 120, after
    assert not [k for k in after if {"worker", "member"} & {name for name, _ in k[1]}], "no per-worker labels"
    assert run.wait(timeout=120) == 0, cli.output(run)
