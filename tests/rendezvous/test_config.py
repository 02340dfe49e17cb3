"""`--rdzv-conf` parsing, and the README's table of its keys (which must say what the parser accepts)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from elastic.rendezvous import config as config_module
from elastic.rendezvous.config import CONF_KEYS, IGNORED_TORCH_KEYS, TORCH_KEYS, RendezvousConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def params(**conf: Any) -> RendezvousParameters:
    return RendezvousParameters("etcd-v3", "127.0.0.1:2379", "run-1", 1, 4, **conf)


def test_defaults() -> None:
    config = RendezvousConfig.from_parameters(params())
    settings = (config.lease_seconds, config.last_call_seconds, config.settle_seconds, config.max_restarts)
    assert settings == (10, 2.0, 1.0, 3)
    assert (config.job.namespace, config.job.name) == ("default", "run-1")


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        pytest.param({"lease_secs": "3"}, "unknown key(s) lease_secs; known: lease_seconds", id="unknown key"),
        pytest.param({"last_call_seconds": "soon"}, "last_call_seconds='soon': expected a float >= 0",
                     id="not a number"),
        pytest.param({"lease_seconds": "0"}, "lease_seconds='0': expected a int >= 1", id="below the minimum"),
    ],
)
def test_bad_values_name_the_key(conf: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RendezvousConfig.from_parameters(params(**conf))


@pytest.mark.parametrize(
    ("run_id", "job_name"),
    [
        pytest.param("run-1", "run-1", id="a run id that is a DNS-1123 label is the job name"),
        pytest.param("test_run_id", "test-run-id-3667828d", id="underscores become '-' plus a hash of the id"),
        pytest.param("Run_A", "run-a-922a93c1", id="two ids that differ only in case or punctuation ..."),
        pytest.param("run-a", "run-a", id="... never share a job"),
        pytest.param("___", "run-bda25155", id="an id with nothing label-like left"),
        pytest.param("a" * 100, "a" * 54 + "-28165978", id="a long id is cut to 63 characters"),
    ],
)
def test_a_run_id_of_any_shape_gets_its_own_job_name(run_id: str, job_name: str) -> None:
    config = RendezvousConfig.from_parameters(RendezvousParameters("etcd-v3", "127.0.0.1:2379", run_id, 1, 4))
    assert (config.job.namespace, config.job.name) == ("default", job_name)


def test_a_job_that_is_not_a_label_names_the_rule() -> None:
    with pytest.raises(ValueError, match="not a DNS-1123 label"):
        RendezvousConfig.from_parameters(params(job="ns/My_Job"))


@pytest.mark.parametrize("key", sorted(CONF_KEYS))
def test_readme_documents_every_key_as_the_parser_does(key: str) -> None:
    assert f"| `{key}` | {CONF_KEYS[key]} |" in README.read_text()


@pytest.fixture
def fresh_warnings() -> Iterator[None]:
    """Each test sees the process as if no ignored key had been warned about yet."""
    saved = set(config_module._warned)
    config_module._warned.clear()
    yield
    config_module._warned.clear()
    config_module._warned.update(saved)


# What torch itself passes to every backend (launcher, run.py, agent tests, c10d and dynamic rendezvous).
TORCH_CONF = [
    pytest.param({"is_host": True}, id="is_host from torch's agent tests (a bool, not a string)"),
    pytest.param({"is_host": "false"}, id="is_host from --rdzv-conf"),
    pytest.param({"timeout": 900}, id="timeout the launcher always adds"),
    pytest.param({"join_timeout": "600"}, id="c10d's join_timeout"),
    pytest.param({"last_call_timeout": "30"}, id="c10d's last_call_timeout"),
    pytest.param({"close_timeout": "30"}, id="c10d's close_timeout"),
    pytest.param({"heartbeat_timeout": "5"}, id="c10d's heartbeat_timeout"),
    pytest.param({"heartbeat": "5"}, id="heartbeat as torch's docs spell it"),
    pytest.param({"keep_alive_interval": "5", "keep_alive_max_attempt": "3"}, id="c10d's keep-alive keys"),
    pytest.param({"read_timeout": "60"}, id="c10d's read_timeout"),
    pytest.param({"store_type": "tcp", "use_libuv": "1"}, id="c10d's store keys"),
    pytest.param({"rank": 0}, id="rank that run.py adds for static"),
]


@pytest.mark.parametrize("conf", TORCH_CONF)
def test_every_key_torch_passes_is_accepted(conf: dict[str, Any], fresh_warnings: None) -> None:
    RendezvousConfig.from_parameters(params(**conf))


def test_torch_keys_cover_what_torch_reads() -> None:
    read_by_torch = {"is_host", "timeout", "join_timeout", "last_call_timeout", "close_timeout",
                     "heartbeat_timeout", "keep_alive_interval", "keep_alive_max_attempt", "read_timeout",
                     "store_type", "rank"}
    assert read_by_torch <= set(TORCH_KEYS) | set(CONF_KEYS)


def test_ignored_keys_warn_once_per_key_per_process(
    caplog: pytest.LogCaptureFixture, fresh_warnings: None
) -> None:
    caplog.set_level(logging.WARNING, logger="elastic.rendezvous.config")
    for _ in range(3):  # torch may build a handler per restart: the warning is not repeated
        RendezvousConfig.from_parameters(params(is_host=True, timeout=900, last_call_timeout=5))
    RendezvousConfig.from_parameters(params(is_host=False, read_timeout=60))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert "ignores is_host (no agent hosts a store" in warnings[0] and "last_call_timeout" not in warnings[0]
    assert "ignores read_timeout (" in warnings[1] and "is_host" not in warnings[1]


def test_mapped_and_own_keys_do_not_warn(caplog: pytest.LogCaptureFixture, fresh_warnings: None) -> None:
    caplog.set_level(logging.WARNING, logger="elastic.rendezvous.config")
    RendezvousConfig.from_parameters(params(timeout=900, last_call_timeout=5, join_timeout=10, lease_seconds=3))
    assert not caplog.records


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        pytest.param({}, (2.0, 900.0), id="defaults"),
        pytest.param({"last_call_timeout": "30"}, (30.0, 900.0), id="torch's last_call_timeout is our last call"),
        pytest.param({"last_call_timeout": "30", "last_call_seconds": "1"}, (1.0, 900.0),
                     id="our last_call_seconds wins over torch's last_call_timeout"),
        pytest.param({"timeout": 120}, (2.0, 120.0), id="torch's timeout is the join timeout"),
        pytest.param({"timeout": 120, "join_timeout": "60"}, (2.0, 60.0), id="join_timeout wins over timeout"),
    ],
)
def test_torch_keys_map_onto_ours(conf: dict[str, Any], expected: tuple[float, float]) -> None:
    config = RendezvousConfig.from_parameters(params(**conf))
    assert (config.last_call_seconds, config.join_timeout) == expected


def test_a_bad_torch_value_names_the_key() -> None:
    with pytest.raises(ValueError, match=re.escape("last_call_timeout='later': expected a float >= 0")):
        RendezvousConfig.from_parameters(params(last_call_timeout="later"))


@pytest.mark.parametrize("key", sorted(TORCH_KEYS))
def test_readme_documents_every_torch_key_as_the_parser_treats_it(key: str) -> None:
    assert f"| `{key}` | {TORCH_KEYS[key]} |" in README.read_text()


def test_every_ignored_key_says_why() -> None:
    assert all(why for why in IGNORED_TORCH_KEYS.values())
