"""A three-member etcd cluster on loopback ports whose members reach each other through TCP
fault proxies, so that one member (its leader, say) can be killed or cut off the others while
clients still reach it.

Each member listens for its peers on a port of its own and advertises its proxy's port
instead: every connection to a member's peer port comes through that member's proxy, owned by
the member that opened it.
"""

from __future__ import annotations

import functools
import json
import time
import urllib.request
from pathlib import Path
from typing import Final

from tests.support.fault_proxy import ProxyThread
from tests.support.servers import ServerProcess, find_program, free_ports, port_open
from tests.support.sockets import socket_holder
from tests.support.tcp_proxy import TcpFaultProxy

MEMBERS: Final = 3
HEALTHY_WITHIN_S: Final = 60.0


class EtcdCluster:
    """See the module docstring."""

    def __init__(self, workdir: Path) -> None:
        count = MEMBERS
        ports = free_ports(3 * count)
        self.client_ports = ports[:count]
        peer_ports, metrics_ports = ports[count : 2 * count], ports[2 * count :]
        self.proxies = [
            ProxyThread(TcpFaultProxy(peer_port, self._member_owning)) for peer_port in peer_ports
        ]
        advertised = [f"http://{proxy.proxy.address}" for proxy in self.proxies]
        initial = ",".join(f"m{i}={url}" for i, url in enumerate(advertised))
        self.members: list[ServerProcess] = []
        for i in range(count):
            client_url = f"http://127.0.0.1:{self.client_ports[i]}"
            argv = [
                find_program("etcd"),
                "--name", f"m{i}",
                "--data-dir", str(workdir / f"m{i}" / "data"),
                "--listen-client-urls", client_url,
                "--advertise-client-urls", client_url,
                "--listen-peer-urls", f"http://127.0.0.1:{peer_ports[i]}",
                "--initial-advertise-peer-urls", advertised[i],
                "--initial-cluster", initial,
                "--initial-cluster-state", "new",
                "--listen-metrics-urls", f"http://127.0.0.1:{metrics_ports[i]}",
            ]  # fmt: skip
            ready = functools.partial(port_open, self.client_ports[i])
            self.members.append(ServerProcess("etcd", argv, workdir / f"m{i}", ready=ready))
        try:
            for member in self.members:
                member.start()
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.client_ports]

    def leader(self) -> int | None:
        """The index of the member the others follow, if they agree on one."""
        ids: dict[int, int] = {}
        leaders = set()
        for i, port in enumerate(self.client_ports):
            status = _status(port)
            if status is not None:
                ids[int(status["header"]["member_id"])] = i  # type: ignore[index]
                leaders.add(int(status.get("leader", 0)))  # type: ignore[call-overload]
        if len(leaders) != 1:
            return None
        return ids.get(leaders.pop())

    def kill(self, index: int) -> None:
        self.members[index].kill()

    def restart(self, index: int) -> None:
        self.members[index].start()

    def cut_off(self, index: int) -> None:
        """Cut member ``index`` off its peers, both ways (clients still reach it)."""
        pids = {self._pid(i) for i in range(len(self.members))} - {None}
        own = self._pid(index)
        for i, proxy in enumerate(self.proxies):
            cut = pids if i == index else {own} - {None}
            proxy.call(proxy.proxy.cut_off, cut)

    def heal(self) -> int:
        """Join the cluster again; how many connections the cut held."""
        cut = 0
        for proxy in self.proxies:
            before = proxy.call(lambda p=proxy: p.proxy.cut_connections)
            proxy.call(proxy.proxy.heal)
            cut += proxy.call(lambda p=proxy: p.proxy.cut_connections) - before
        return cut

    def stop(self) -> None:
        for member in self.members:
            member.stop()
        for proxy in self.proxies:
            proxy.close()

    def _pid(self, index: int) -> int | None:
        process = self.members[index].process
        return None if process is None or process.poll() is not None else process.pid

    def _member_owning(self, port: int) -> int | None:
        pids = [pid for i in range(len(self.members)) if (pid := self._pid(i)) is not None]
        found = socket_holder(port, pids)
        return None if found is None else found[0]

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + HEALTHY_WITHIN_S
        while self.leader() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd cluster without a leader after {HEALTHY_WITHIN_S} s")
            time.sleep(0.2)


def _status(port: int) -> dict[str, object] | None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v3/maintenance/status", data=b"{}", method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=1) as response:
            status: dict[str, object] = json.loads(response.read())
            return status
    except (OSError, ValueError):
        return None
