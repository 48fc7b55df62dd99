"""TF_CONFIG's duplicate addresses are found however they are written: one address in
two spellings made the second replica die with TensorFlow's "Could not start gRPC
server" traceback."""
from __future__ import annotations

import json

import pytest

from mljob.cluster import ClusterConfigError, normal_address, parse_tf_config


def _config(workers: list[str]) -> str:
    return json.dumps({"cluster": {"chief": ["host0:2222"], "worker": workers},
                       "task": {"type": "worker", "index": 0}})


@pytest.mark.parametrize("first, second", [
    ("localhost:2325", "localhost:02325"),
    ("localhost:2325", "127.0.0.1:2325"),
    ("127.0.0.1:2325", "127.0.0.2:2325"),
    ("[::1]:2325", "LOCALHOST:2325"),
    ("Worker-1.Example.COM:2325", "worker-1.example.com.:2325"),
    ("[2001:db8::1]:80", "[2001:DB8:0:0::1]:0080"),
])
def test_one_address_in_two_spellings_is_one_line(first, second):
    with pytest.raises(ClusterConfigError) as info:
        parse_tf_config(_config([first, second]))
    text = str(info.value)
    assert "\n" not in text
    assert f"gives address {first} (as {second}) to both worker 0 and worker 1" in text


@pytest.mark.parametrize("first, second", [
    ("localhost:2325", "localhost:2326"), ("host1:2325", "host2:2325"),
    ("10.0.0.1:2325", "10.0.0.2:2325")])
def test_different_addresses_are_taken(first, second):
    info = parse_tf_config(_config([first, second]))
    assert info.num_workers == 2


def test_normal_address():
    assert normal_address("localhost:02325") == normal_address("127.0.0.1:2325") \
        == ("loopback", 2325)
    assert normal_address("[::1]:1") == ("loopback", 1)
    assert normal_address("Host.:7") == ("host", 7)
