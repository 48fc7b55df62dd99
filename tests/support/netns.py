"""Test hosts for the across-hosts tests: network namespaces joined by a bridge.

    with test_hosts(3, reaper) as hosts:
        ps = hosts[0].popen([sys.executable, "-m", "trainer.task", ...])
        hosts[1].endpoint(2222)            # "10.213.0.2:2222"
        hosts.link_down(hosts[0])          # cut host 0 off the network ...
        hosts.link_up(hosts[0])            # ... and plug it back in

Each host is its own network namespace (`mljob-<token>-<i>`) with loopback and one
interface, `eth0`, holding 10.213.0.<i+1>/24. The other end of each veth pair is a port
of a bridge that lives in a namespace of its own (`mljob-<token>-br`), so nothing is
added to the machine's own network. The namespaces have no default route: a process in
a host can reach only the other hosts and its own 127.0.0.1, never anything outside.
Every host has its own port space, so all hosts may use the same port, as on real
machines.

Cutting a link sets the host's bridge port down, like pulling its cable at the switch:
the host keeps its address and its sockets, its packets are dropped, and its peers see
silence (timeouts and TCP retransmissions), not an immediate error.

Teardown (also when the test fails or is interrupted) stops every process started in
the hosts by PID, then deletes the namespaces, which deletes their veths and the bridge.
Needs root and `ip netns`; `skip_reason()` says why not when they are missing.
"""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import uuid
from typing import Iterator, Sequence

from mljob.procs import stop_process

SUBNET = "10.213.0"          # a /24 that exists only inside the namespaces
PREFIX = "mljob-"
INTERFACE = "eth0"           # the host's end of its veth pair
BRIDGE = "br0"
STOP_GRACE_S = 5.0


class Host:
    """One test machine: a namespace with one address on the test subnet."""

    def __init__(self, network: "Network", index: int):
        self.network = network
        self.index = index
        self.namespace = f"{network.name}-{index}"
        self.address = f"{SUBNET}.{index + 1}"
        self.port = f"port{index}"   # its veth's other end, a bridge port

    def endpoint(self, port: int) -> str:
        return f"{self.address}:{port}"

    def command(self, args: Sequence[str]) -> list[str]:
        """args as run inside this host (`ip netns exec` execs them: same PID)."""
        return ["ip", "netns", "exec", self.namespace, *map(str, args)]

    def popen(self, args: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start a process in this host; it is stopped by PID when the hosts go away."""
        return self.network.popen(self, args, **kwargs)

    def run(self, args: Sequence[str], timeout: float = 30, **kwargs):
        """Run a short command in this host to completion (subprocess.run)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(args), timeout=timeout, **kwargs)

    def link_down(self) -> None:
        self.network.link_down(self)

    def link_up(self) -> None:
        self.network.link_up(self)

    def __repr__(self) -> str:
        return f"Host({self.index}, {self.address}, {self.namespace})"


class Network:
    """The hosts and their bridge; a sequence of Host (hosts[0], len(hosts), iteration)."""

    def __init__(self, count: int, reaper=None, name: str | None = None):
        if not 1 <= count <= 250:
            raise ValueError(f"test hosts: count must be 1 to 250, not {count}")
        self.name = name or f"{PREFIX}{uuid.uuid4().hex[:8]}"
        self.bridge_namespace = f"{self.name}-br"
        self.hosts = [Host(self, i) for i in range(count)]
        self.reaper = reaper
        self.procs: list[tuple[subprocess.Popen, bool]] = []  # (process, own group)
        self.created: list[str] = []   # namespaces that exist, for teardown

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __len__(self) -> int:
        return len(self.hosts)

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_namespace] + [h.namespace for h in self.hosts]

    def create(self) -> None:
        _ip("netns", "add", self.bridge_namespace)
        self.created.append(self.bridge_namespace)
        _ip("-n", self.bridge_namespace, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", self.bridge_namespace, "link", "set", BRIDGE, "up")
        for host in self.hosts:
            _ip("netns", "add", host.namespace)
            self.created.append(host.namespace)
            # Created straight inside both namespaces: no name ever appears in the
            # machine's own namespace, so parallel test runs cannot collide.
            _ip("link", "add", INTERFACE, "netns", host.namespace, "type", "veth",
                "peer", "name", host.port, "netns", self.bridge_namespace)
            _ip("-n", self.bridge_namespace, "link", "set", host.port, "master", BRIDGE,
                "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", INTERFACE)
            _ip("-n", host.namespace, "link", "set", INTERFACE, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")

    def popen(self, host: Host, args: Sequence[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)  # stop the whole group by its PID
        command = host.command(args)
        if self.reaper is not None:   # the reaper stops it too if the test ends early
            proc = self.reaper.popen(command, **kwargs)
        else:
            proc = subprocess.Popen(command, **kwargs)
        self.procs.append((proc, bool(kwargs["start_new_session"])))
        return proc

    def link_down(self, host: Host) -> None:
        _ip("-n", self.bridge_namespace, "link", "set", host.port, "down")

    def link_up(self, host: Host) -> None:
        _ip("-n", self.bridge_namespace, "link", "set", host.port, "up")

    def destroy(self) -> None:
        """Stop the processes, then delete the namespaces; tries everything, raises
        at the end if a namespace could not be deleted."""
        for proc, own_group in reversed(self.procs):
            _stop(proc, own_group)
        failed = []
        for namespace in reversed(self.created):
            # A namespace holding a process outlives its name; the processes are gone.
            result = subprocess.run(["ip", "netns", "del", namespace],
                                    capture_output=True, text=True)
            if result.returncode != 0 and namespace in list_namespaces():
                failed.append(f"{namespace}: {result.stderr.strip()}")
        self.created.clear()
        if failed:
            raise RuntimeError("test hosts: could not delete " + "; ".join(failed))


@contextlib.contextmanager
def test_hosts(count: int, reaper=None, name: str | None = None) -> Iterator[Network]:
    """`count` hosts on one bridge, torn down on exit; skips the test when network
    namespaces cannot be made here (not root, no `ip netns`). `name` is the namespaces'
    prefix (default `mljob-<random>`)."""
    reason = skip_reason()
    if reason:
        import pytest
        pytest.skip(reason)
    network = Network(count, reaper, name)
    try:
        network.create()
        yield network
    finally:
        network.destroy()


test_hosts.__test__ = False  # a helper, not a test, when imported into a test module


def list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@functools.lru_cache(maxsize=1)
def skip_reason() -> str | None:
    """None when test hosts can be made here, else why not (probed by making one)."""
    if os.geteuid() != 0:
        return "test hosts need root to create network namespaces"
    if shutil.which("ip") is None:
        return "test hosts need the `ip` command (iproute2)"
    probe = f"{PREFIX}probe-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()[:200]}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _stop(proc: subprocess.Popen, own_group: bool) -> None:
    stop_process(proc, STOP_GRACE_S, own_group=own_group)
