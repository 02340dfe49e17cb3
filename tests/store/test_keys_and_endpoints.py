import pytest

from elastic.errors import PermanentError
from elastic.store.endpoints import EndpointAddress, EndpointError, parse_endpoints
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


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "no etcd endpoint given"),
        (" , ", "no etcd endpoint given"),
        ("http://", "'http://': no host"),
        ("http://:1", "'http://:1': no host"),
        ("ftp://x:1", "scheme 'ftp' is not http or https"),
        ("127.0.0.1:99999", "'127.0.0.1:99999': the port is not in 1-65535"),
        ("h:0", "port 0 is not a port etcd can listen on"),
        ("a:notaport", "the port is not a number"),
        ("http://[::1:2379", "an IPv6 address needs its closing ']'"),
        ("http://h:1/v3", "an endpoint has no path"),
        ("x" * 100_000 + ":1", "etcd endpoint 'xxxx"),
        ("two words:1", "the host is not a DNS name or an IP address"),
    ],
    ids=["empty", "only commas", "scheme only", "no host", "ftp", "port too big", "port 0", "port not a number",
         "unclosed IPv6 bracket", "a path", "a huge value", "a space in the host"],
)  # fmt: skip
def test_a_malformed_endpoint_is_one_clear_line(text: str, problem: str) -> None:
    with pytest.raises(EndpointError) as caught:
        parse_endpoints(text)
    message = str(caught.value)
    assert problem in message and "\n" not in message and len(message) < 250, message
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, PermanentError)


def test_an_ipv6_endpoint_keeps_its_brackets_in_its_url() -> None:
    (address,) = parse_endpoints("http://[::1]:2379")
    assert (address.host, address.url) == ("::1", "http://[::1]:2379")
    assert parse_endpoints(address.url) == [address]


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
