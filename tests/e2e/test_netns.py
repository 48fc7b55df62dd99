"""The test hosts themselves: namespaces that reach each other over a real TCP echo,
links that can be cut and restored, isolation from the machine's own network, and a
teardown that leaves no namespace or process behind."""
from __future__ import annotations

import select
import socket
import sys
import time

import pytest

from tests.support.netns import SUBNET, list_namespaces, skip_reason, test_hosts

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

PORT = 7000  # every host has its own port space

# One thread per connection, so a held-open connection does not block new ones.
ECHO_SERVER = r"""
import socket, sys, threading
def serve(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind((sys.argv[1], int(sys.argv[2])))
listener.listen()
print("listening", flush=True)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

# Connects once and echoes each stdin line through the server; exit 3 with the reason
# when it cannot connect.
ECHO_CLIENT = r"""
import socket, sys
try:
    conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
except OSError as exc:
    print(f"failed: {exc}", flush=True)
    sys.exit(3)
conn.settimeout(None)
for line in sys.stdin:
    conn.sendall(line.encode())
    print("echo:", conn.recv(65536).decode().strip(), flush=True)
"""


def start_echo_server(host):
    import subprocess
    server = host.popen([sys.executable, "-c", ECHO_SERVER, host.address, PORT],
                        stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "listening"
    return server


def echo_once(client_host, address, timeout=3.0, message="hello"):
    result = client_host.run([sys.executable, "-c", ECHO_CLIENT, address, PORT, timeout],
                             input=message + "\n", timeout=60)
    return result.returncode, result.stdout.strip()


def read_line(proc, timeout):
    """The next stdout line of proc, or None when none comes within timeout seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else None


def test_hosts_reach_each_other_over_tcp(reaper):
    with test_hosts(3, reaper) as hosts:
        assert [h.address for h in hosts] == [f"{SUBNET}.1", f"{SUBNET}.2", f"{SUBNET}.3"]
        assert hosts[2].endpoint(2222) == f"{SUBNET}.3:2222"
        start_echo_server(hosts[0])
        for client in hosts:
            assert echo_once(client, hosts[0].address, message=f"from {client.index}") == \
                (0, f"echo: from {client.index}")
        # The same port is free on every other host: each has its own port space.
        start_echo_server(hosts[1])
        assert echo_once(hosts[2], hosts[1].address) == (0, "echo: hello")
        names = hosts.namespaces
        assert set(names) <= set(list_namespaces())
    assert not set(names) & set(list_namespaces())


def test_cut_link_stops_traffic_and_restoring_it_brings_it_back(reaper):
    import subprocess
    with test_hosts(2, reaper) as hosts:
        server_host, client_host = hosts
        start_echo_server(server_host)
        held = client_host.popen([sys.executable, "-c", ECHO_CLIENT, server_host.address,
                                  PORT, 5], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, bufsize=1)
        held.stdin.write("one\n")
        assert read_line(held, 30) == "echo: one"

        hosts.link_down(client_host)
        code, out = echo_once(client_host, server_host.address, timeout=1.0)
        assert code == 3 and "timed out" in out       # silence, like a pulled cable
        code, out = echo_once(server_host, client_host.address, timeout=1.0)
        assert code == 3                              # both directions are cut
        held.stdin.write("two\n")
        assert read_line(held, 1.5) is None           # the open connection hears nothing

        hosts.link_up(client_host)
        # TCP retransmits what was sent during the cut: the held connection recovers.
        assert read_line(held, 30) == "echo: two"
        assert echo_once(client_host, server_host.address) == (0, "echo: hello")

        client_host.link_down()                       # the Host methods do the same
        assert echo_once(client_host, server_host.address, timeout=1.0)[0] == 3
        client_host.link_up()
        assert echo_once(client_host, server_host.address)[0] == 0


def test_hosts_cannot_reach_the_machine_or_beyond(reaper):
    outside = socket.socket()
    outside.bind(("127.0.0.1", 0))
    outside.listen()
    try:
        with test_hosts(1, reaper) as hosts:
            host = hosts[0]
            routes = host.run(["ip", "route", "show"]).stdout.split("\n")
            assert [r.split()[0] for r in routes if r.strip()] == [f"{SUBNET}.0/24"]
            # No default route: anything off the test subnet is unreachable at once.
            code, out = echo_once(host, "192.0.2.1", timeout=2.0)
            assert code == 3 and "unreachable" in out
            # 127.0.0.1 inside a host is the host's own loopback, not the machine's.
            probe = host.run([sys.executable, "-c",
                              "import socket,sys; socket.create_connection(('127.0.0.1', "
                              f"{outside.getsockname()[1]}), timeout=2)"])
            assert probe.returncode != 0 and "refused" in probe.stderr
    finally:
        outside.close()


def test_teardown_after_a_failure_leaves_no_namespace_or_process(reaper):
    with pytest.raises(RuntimeError, match="the test failed"):
        with test_hosts(2, reaper) as hosts:
            names = hosts.namespaces
            sleeper = hosts[1].popen(["sleep", "600"])
            assert set(names) <= set(list_namespaces())
            raise RuntimeError("the test failed")
    assert sleeper.poll() is not None
    assert not set(names) & set(list_namespaces())
    leftovers = [n for n in list_namespaces() if n.startswith(hosts.name)]
    assert leftovers == []


def test_link_state_is_per_host(reaper):
    with test_hosts(3, reaper) as hosts:
        start_echo_server(hosts[0])
        hosts.link_down(hosts[2])
        assert echo_once(hosts[1], hosts[0].address)[0] == 0   # the others still talk
        assert echo_once(hosts[2], hosts[0].address, timeout=1.0)[0] == 3
        deadline = time.time() + 10
        hosts.link_up(hosts[2])
        while echo_once(hosts[2], hosts[0].address)[0] != 0:
            assert time.time() < deadline, "host 2 did not come back"
