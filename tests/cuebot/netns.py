"""Network namespaces joined by a veth pair, for tests that need a caller on another address
than loopback (or a socket the server's kernel tables cannot show) without any network of
the machine's: every address used is in 10.231.0.0/16 on links the test makes, and each
test's namespaces and links carry names of their own, removed by ``Netns.close``.

Root only; needs iproute2's ``ip`` (installed with apt-get when missing, as scripts/test.sh
installs the suite's other tools).
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import os
import random
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Sequence

_COUNTER = itertools.count()


def ip_command() -> str:
    """The path of ``ip``, installing iproute2 first where it is missing (root, apt-get)."""
    found = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.path.exists(p)), None
    )
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError("the network-namespace tests need iproute2's `ip` (Debian: apt-get install iproute2)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open("/tmp/cuectl-tests-apt.lock", "w") as lock:  # one install at a time across pytest workers
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not shutil.which("ip"):
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "iproute2"], check=True, env=env, capture_output=True)
    found = shutil.which("ip") or "/usr/sbin/ip"
    if not os.path.exists(found):
        raise RuntimeError("apt-get installed iproute2, but no `ip` is on PATH")
    return found


def run(*argv: str) -> str:
    res = subprocess.run([ip_command(), *argv], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {res.stderr.strip()}")
    return res.stdout


def _used_subnets() -> set[ipaddress.IPv4Network]:
    """The /30s of 10.231.0.0/16 that an address of this namespace already sits in."""
    used: set[ipaddress.IPv4Network] = set()
    for line in run("-o", "-4", "addr", "show").splitlines():
        fields = line.split()
        if "inet" in fields:
            iface = ipaddress.ip_interface(fields[fields.index("inet") + 1])
            if iface.ip in ipaddress.ip_network("10.231.0.0/16"):
                used.add(ipaddress.IPv4Network(f"{iface.ip}/30", strict=False))
    return used


@dataclass(frozen=True)
class Link:
    left_ip: str  # .1 of the /30
    right_ip: str  # .2
    subnet: ipaddress.IPv4Network
    left_dev: str
    right_dev: str


@dataclass
class Netns:
    """What one test made: namespaces and host-side links, removed by ``close``."""

    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000:05d}{next(_COUNTER):02d}")
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def namespace(self, role: str, *, loopback: bool = True) -> str:
        """A new namespace; ``loopback``: with its lo up (127.0.0.1 its own)."""
        name = f"cuectl-{role}-{self.tag}"
        run("netns", "add", name)
        self.namespaces.append(name)
        if loopback:
            run("-n", name, "link", "set", "lo", "up")
        return name

    def sysctl(self, namespace: str, key: str, value: str) -> None:
        """A sysctl of ``namespace`` (net.* keys are per namespace: the host's are untouched)."""
        path = "/proc/sys/" + key.replace(".", "/")  # as sysctl(8) writes it, without needing procps
        res = subprocess.run(
            self.exec(namespace, ["sh", "-c", 'echo "$1" > "$2"', "sh", value, path]),
            capture_output=True,
            text=True,
            timeout=30,
        )
        if res.returncode != 0:
            raise RuntimeError(f"sysctl {key}={value} in {namespace}: {res.stderr.strip()}")

    def veth(self, left: str | None, right: str) -> Link:
        """A veth pair from namespace ``left`` (None: this one, the host's) to ``right``, up,
        with a free /30 of 10.231.0.0/16: .1 on the left end, .2 on the right one."""
        subnet = self._free_subnet()
        hosts = list(subnet.hosts())
        n = len(self.links)
        a, b = f"cv{self.tag}{n}a", f"cv{self.tag}{n}b"  # at most 15 characters
        run("link", "add", a, "type", "veth", "peer", "name", b, "netns", right)
        self.links.append(a)
        if left is not None:
            run("link", "set", a, "netns", left)
        for ns, dev, addr in ((left, a, hosts[0]), (right, b, hosts[1])):
            where = ["-n", ns] if ns else []
            run(*where, "addr", "add", f"{addr}/30", "dev", dev)
            run(*where, "link", "set", dev, "up")
        return Link(str(hosts[0]), str(hosts[1]), subnet, a, b)

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = _used_subnets()
        rng = random.Random(os.getpid() * 1000 + len(self.links) + len(self.namespaces))
        while True:
            subnet = ipaddress.IPv4Network(f"10.231.{rng.randrange(1, 255)}.{4 * rng.randrange(0, 64)}/30")
            if subnet not in used:
                return subnet

    def exec(self, namespace: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``namespace``."""
        return [ip_command(), "netns", "exec", namespace, *argv]

    def close(self) -> None:
        for name in reversed(self.namespaces):  # takes the veth ends inside with it, and so the pairs
            subprocess.run([ip_command(), "netns", "del", name], capture_output=True)
        for link in self.links:  # a host-side end whose namespace is gone is gone too; just in case
            subprocess.run([ip_command(), "link", "del", link], capture_output=True)
        self.namespaces.clear()
        self.links.clear()
