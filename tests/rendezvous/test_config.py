"""`--rdzv-conf` parsing, and the README's table of its keys (which must say what the parser accepts)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from elastic.rendezvous.config import CONF_KEYS, RendezvousConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def params(**conf: str) -> RendezvousParameters:
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


@pytest.mark.parametrize("key", sorted(CONF_KEYS))
def test_readme_documents_every_key_as_the_parser_does(key: str) -> None:
    assert f"| `{key}` | {CONF_KEYS[key]} |" in README.read_text()
