import pytest

from elastic.store.endpoints import EndpointAddress, parse_endpoints
from elastic.store.keys import JobKeys


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://127.0.0.1:2379", [EndpointAddress("127.0.0.1", 2379)]),
        ("127.0.0.1:2380", [EndpointAddress("127.0.0.1", 2380)]),
        ("etcd", [EndpointAddress("etcd", 2379)]),
        ("https://a:1,http://b:2", [EndpointAddress("a", 1, True), EndpointAddress("b", 2)]),
        (["a:1", " b:2 "], [EndpointAddress("a", 1), EndpointAddress("b", 2)]),
    ],
    ids=["url", "host and port", "bare host takes 2379", "list with tls", "python list"],
)
def test_parse_endpoints(text, expected) -> None:
    assert parse_endpoints(text) == expected


@pytest.mark.parametrize("text", ["", "ftp://x:1", "http://:1", "a:notaport"])
def test_parse_endpoints_rejects(text) -> None:
    with pytest.raises(ValueError, match=r"etcd endpoint|no etcd endpoint"):
        parse_endpoints(text)


def test_key_layout_matches_the_design() -> None:
    keys = JobKeys.parse("team/bert")
    assert keys.member("m1") == "/elastic/jobs/team/bert/members/m1"
    assert keys.round == "/elastic/jobs/team/bert/round"
    assert keys.budget == "/elastic/jobs/team/bert/budget"
    assert keys.status == "/elastic/jobs/team/bert/status"
    assert keys.store(4) == "/elastic/jobs/team/bert/store/4/"
    assert JobKeys.parse("bert") == JobKeys("default", "bert")
    with pytest.raises(ValueError):
        JobKeys.parse("a/b/c")
