"""cuectl.cuebot.peer: the kernel names the uid behind a loopback connection.

Real sockets throughout (and, as root, real throwaway users holding them), each asked both
ways: through the exact netlink lookup, asserted to have answered alone, and through the
/proc tables with netlink made unavailable (``via``). A few tests read fixture tables for what
real sockets cannot set up here (two owners on one connection's two ends without root, a
remote peer's row), and crafted netlink replies for what the kernel never sends."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cuectl.cuebot import peer
from cuectl.cuebot.peer import _netlink_owner, _netlink_query, is_loopback, parse_grpc_peer, peer_uid, socket_owner

# -- parse_grpc_peer ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "peer, expected",
    [
        ("ipv4:127.0.0.1:54321", ("127.0.0.1", 54321)),
        ("ipv4:10.1.2.3:1", ("10.1.2.3", 1)),
        ("ipv6:[::1]:54321", ("::1", 54321)),
        ("ipv6:%5B::1%5D:43506", ("::1", 43506)),  # what grpcio 1.85 writes
        ("ipv6:[0:0:0:0:0:0:0:1]:80", ("::1", 80)),  # normalised
        ("ipv6:[2001:DB8::1]:65535", ("2001:db8::1", 65535)),
        ("ipv6:[::ffff:127.0.0.1]:54321", ("127.0.0.1", 54321)),  # v4-mapped: the IPv4 address
        ("ipv6:%5B::ffff:127.0.0.1%5D:54321", ("127.0.0.1", 54321)),
    ],
)
def test_parse_grpc_peer(peer, expected):
    assert parse_grpc_peer(peer) == expected


@pytest.mark.parametrize(
    "peer",
    [
        "unix:/run/cuectl.sock",
        "unix-abstract:cuectl",
        "vsock:3:1234",
        "",
        "ipv4",
        "ipv4:",
        "ipv4:127.0.0.1",
        "ipv4:127.0.0.1:",
        "ipv4::54321",
        "ipv4:127.0.0.1:0",
        "ipv4:127.0.0.1:65536",
        "ipv4:127.0.0.1:-1",
        "ipv4:127.0.0.1:+5",
        "ipv4:127.0.0.1: 5",
        "ipv4:127.0.0.1:5x",
        "ipv4:127.0.0.1:5_0",
        "ipv4:127.0.0.1:\u0665",
        "ipv4:127.0.0:5",
        "ipv4:127.000.0.1:5",
        "ipv4:localhost:5",
        "ipv4:::1:5",
        "ipv4:[::1]:5",
        "ipv6:::1:5",
        "ipv6:[::1]",
        "ipv6:[::1]:",
        "ipv6:[::1]5",
        "ipv6:[127.0.0.1]:5",
        "ipv6:[::g]:5",
        "IPV4:127.0.0.1:5",
        "tcp:127.0.0.1:5",
    ],
)
def test_parse_grpc_peer_refuses_what_is_not_an_address(peer):
    assert parse_grpc_peer(peer) is None


@pytest.mark.parametrize(
    "address, expected",
    [
        ("127.0.0.1", True),
        ("127.4.5.6", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("::ffff:10.0.0.1", False),
        ("localhost", False),
        ("", False),
        ("127.0.0.1:5", False),
    ],
)
def test_is_loopback(address, expected):
    assert is_loopback(address) is expected


# -- both ways: the exact lookup and the tables ------------------------------------------


class Via:
    """How ``socket_owner`` is made to answer in a test, and a check that it did.

    "netlink": as in production; an answer for a pinned server must come from the exact
    lookup alone (no table read), an answer for a port-only server from the tables.
    "tables": netlink made unavailable (EPROTONOSUPPORT, as on a kernel or sandbox without
    it): every answer must come from the tables. A refusal (None) is checked by its value."""

    def __init__(self, name: str, monkeypatch: pytest.MonkeyPatch):
        self.name = name
        self.answered = 0  # uids the exact lookup gave
        self.read = 0  # table lookups
        real_netlink, real_tables = peer._netlink_owner, peer._table_owners

        def netlink(*args):
            if name == "tables":
                raise OSError(errno.EPROTONOSUPPORT, "netlink made unavailable by the test")
            uid = real_netlink(*args)
            self.answered += uid is not None
            return uid

        def tables(*args):
            self.read += 1
            return real_tables(*args)

        monkeypatch.setattr(peer, "_netlink_owner", netlink)
        monkeypatch.setattr(peer, "_table_owners", tables)

    def owner(self, client: tuple[str, int], server: tuple[str | None, int]) -> int | None:
        return self._checked(lambda: socket_owner(client, server), server)

    def peer(self, peer_text: str, server: tuple[str | None, int]) -> int | None:
        return self._checked(lambda: peer_uid(peer_text, server), server)

    def _checked(self, ask: Callable[[], int | None], server: tuple[str | None, int]) -> int | None:
        before = self.answered, self.read
        uid = ask()
        if uid is not None:
            answered, read = self.answered - before[0], self.read - before[1]
            if self.name == "netlink" and server[0] is not None:
                assert (answered, read) == (1, 0), f"the exact lookup did not answer alone: {answered}, {read}"
            else:
                assert (answered, read) == (0, 1), f"the tables did not answer alone: {answered}, {read}"
        return uid


@pytest.fixture(params=["netlink", "tables"])
def via(request, monkeypatch) -> Via:
    return Via(request.param, monkeypatch)


# -- real sockets, this process's uid -----------------------------------------------------


@contextmanager
def listening(family: socket.AddressFamily, host: str, dual_stack: bool = False) -> Iterator[socket.socket]:
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
    with sock:
        sock.bind((host, 0))
        sock.listen(16)
        yield sock


@contextmanager
def connection(listener: socket.socket, family: socket.AddressFamily, host: str) -> Iterator[socket.socket]:
    """A connected client socket (the server's end accepted, so both ends are ESTABLISHED)."""
    client = socket.socket(family, socket.SOCK_STREAM)
    with client:
        client.connect((host, listener.getsockname()[1]))
        accepted, _ = listener.accept()
        with accepted:
            yield client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_ipv4_client_is_its_owner(via):
    with listening(socket.AF_INET, "127.0.0.1") as lsock, connection(lsock, socket.AF_INET, "127.0.0.1") as c:
        port = lsock.getsockname()[1]
        me = c.getsockname()
        assert via.owner(me, ("127.0.0.1", port)) == os.getuid()
        assert via.owner(me, (None, port)) == os.getuid()
        assert via.peer(f"ipv4:{me[0]}:{me[1]}", ("127.0.0.1", port)) == os.getuid()
        # Any other server, or a client port no socket has, is no one.
        assert via.owner(me, ("127.0.0.1", free_port())) is None
        assert via.owner(me, ("127.0.0.2", port)) is None
        assert via.owner(me, ("::1", port)) is None
        assert via.owner(("127.0.0.1", free_port()), ("127.0.0.1", port)) is None
        assert via.owner(("127.0.0.2", me[1]), ("127.0.0.1", port)) is None


def test_an_ipv6_client_is_its_owner(via):
    with listening(socket.AF_INET6, "::1") as lsock, connection(lsock, socket.AF_INET6, "::1") as c:
        port = lsock.getsockname()[1]
        host, cport = c.getsockname()[:2]
        assert via.owner((host, cport), ("::1", port)) == os.getuid()
        assert via.owner((host, cport), (None, port)) == os.getuid()
        assert via.peer(f"ipv6:%5B{host}%5D:{cport}", ("::1", port)) == os.getuid()
        assert via.peer(f"ipv6:[{host}]:{cport}", (None, port)) == os.getuid()
        assert via.owner((host, cport), ("::1", free_port())) is None
        assert via.owner((host, cport), ("127.0.0.1", port)) is None


def test_an_ipv4_client_of_a_dual_stack_listener_is_its_owner(via):
    """The server listens on [::]: the client's socket is AF_INET, in /proc/net/tcp."""
    with (
        listening(socket.AF_INET6, "::", dual_stack=True) as lsock,
        connection(lsock, socket.AF_INET, "127.0.0.1") as c,
    ):
        port = lsock.getsockname()[1]
        host, cport = c.getsockname()
        assert via.owner((host, cport), (None, port)) == os.getuid()
        assert via.owner((host, cport), ("::ffff:127.0.0.1", port)) == os.getuid()
        # grpcio reports such a peer as ipv4:; the v4-mapped spelling means the same.
        assert via.peer(f"ipv4:{host}:{cport}", (None, port)) == os.getuid()
        assert via.peer(f"ipv6:[::ffff:{host}]:{cport}", (None, port)) == os.getuid()


def test_an_ipv6_socket_connected_to_a_v4_mapped_address_is_found_in_tcp6(via):
    with listening(socket.AF_INET, "0.0.0.0") as lsock, connection(lsock, socket.AF_INET6, "::ffff:127.0.0.1") as c:
        port = lsock.getsockname()[1]
        host, cport = c.getsockname()[:2]
        assert host == "::ffff:127.0.0.1"
        # The client's row is v4-mapped in tcp6 (not in tcp), so the tcp6 path is what finds it.
        mapped = f"0000000000000000FFFF00000100007F:{cport:04X}"
        assert mapped in Path("/proc/net/tcp6").read_text()
        assert f"0100007F:{cport:04X} 0100007F:{port:04X}" not in Path("/proc/net/tcp").read_text()
        assert via.owner(("127.0.0.1", cport), ("127.0.0.1", port)) == os.getuid()
        assert via.owner((host, cport), (None, port)) == os.getuid()
        assert via.peer(f"ipv4:127.0.0.1:{cport}", (None, port)) == os.getuid()


def test_a_connection_the_client_closed_is_no_one(via):
    with listening(socket.AF_INET, "127.0.0.1") as lsock:
        port = lsock.getsockname()[1]
        client = socket.socket()
        client.connect(("127.0.0.1", port))
        accepted, _ = lsock.accept()
        with accepted:
            me = client.getsockname()
            assert via.owner(me, ("127.0.0.1", port)) == os.getuid()
            client.close()  # FIN_WAIT on the client's end, CLOSE_WAIT on the server's
            assert via.owner(me, ("127.0.0.1", port)) is None


def test_non_loopback_peers_and_unix_sockets_are_never_looked_up(via):
    assert via.peer("unix:/run/cuectl.sock", (None, 8080)) is None
    assert via.peer("ipv4:not-an-address:5", (None, 8080)) is None


# -- fixture tables: what real sockets cannot set up without root -------------------------
# The text is a little-endian kernel's (x86-64, arm64): 0100007F is 127.0.0.1.

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
HEADER6 = (
    "  sl  local_address                         remote_address                        st tx_queue "
    "rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
)


def row(n: int, local: str, remote: str, state: str, uid: int) -> str:
    return (
        f"  {n:3d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid:5d}        0 "
        f"{1000 + n} 1 0000000000000000 20 4 30 10 -1\n"
    )


def proc(tmp_path: Path, tcp: list[str], tcp6: list[str] | None = None) -> Path:
    (tmp_path / "net").mkdir(parents=True)
    (tmp_path / "net" / "tcp").write_text(HEADER + "".join(tcp))
    if tcp6 is not None:
        (tmp_path / "net" / "tcp6").write_text(HEADER6 + "".join(tcp6))
    return tmp_path


def test_the_clients_end_is_matched_not_the_servers(tmp_path):
    # 127.0.0.1:54321 (uid 1001) connected to the server at 127.0.0.1:8080 (uid 1000); the
    # server's accepted socket is the same pair swapped.
    root = proc(
        tmp_path,
        [
            row(0, "0100007F:1F90", "00000000:0000", "0A", 1000),  # the listener
            row(1, "0100007F:D431", "0100007F:1F90", "01", 1001),  # the client's end
            row(2, "0100007F:1F90", "0100007F:D431", "01", 1000),  # the server's end
        ],
        [],
    )
    assert socket_owner(("127.0.0.1", 54321), ("127.0.0.1", 8080), root) == 1001
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), root) == 1001
    assert peer_uid("ipv4:127.0.0.1:54321", ("127.0.0.1", 8080), root) == 1001
    assert socket_owner(("127.0.0.1", 8080), ("127.0.0.1", 54321), root) == 1000  # the swap is the other end
    assert socket_owner(("127.0.0.1", 8080), (None, 1), root) is None  # the listener is no connection


def test_only_established_rows_count(tmp_path):
    # A TIME_WAIT row carries uid 0: matching it would make the caller root.
    root = proc(
        tmp_path,
        [row(0, "0100007F:D431", "0100007F:1F90", "06", 0), row(1, "0100007F:D432", "0100007F:1F90", "08", 1001)],
    )
    assert socket_owner(("127.0.0.1", 54321), ("127.0.0.1", 8080), root) is None
    assert socket_owner(("127.0.0.1", 54322), ("127.0.0.1", 8080), root) is None


def test_two_owners_fitting_a_port_only_server_is_no_one(tmp_path):
    # One local address and port, two connections (SO_REUSEADDR) to the server's port on
    # two addresses: without the server's address the caller cannot be told apart.
    rows = [row(0, "0100007F:D431", "0100007F:1F90", "01", 1001), row(1, "0100007F:D431", "0200007F:1F90", "01", 1002)]
    root = proc(tmp_path, rows)
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), root) is None
    assert socket_owner(("127.0.0.1", 54321), ("127.0.0.1", 8080), root) == 1001
    assert socket_owner(("127.0.0.1", 54321), ("127.0.0.2", 8080), root) == 1002
    # The same socket listed twice (a table read in several chunks can repeat a row) is one owner.
    accepted = row(2, "0100007F:1F90", "0100007F:D431", "01", 0)  # the server's end of it
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), proc(tmp_path / "b", [rows[0], rows[0], accepted])) == 1001


def test_a_port_only_match_needs_one_server_end(tmp_path):
    # A listener on every address matches the client by port only. A second connection to
    # the server's port from the same address and port (one from the network spoofing
    # 127.0.0.1, the replies routed away) is a second server end: no one, not the local user.
    client = row(0, "0100007F:D431", "0100007F:1F90", "01", 1001)
    ours = row(1, "0100007F:1F90", "0100007F:D431", "01", 0)
    spoofed = row(2, "0500000A:1F90", "0100007F:D431", "01", 0)
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), proc(tmp_path / "a", [client, ours])) == 1001
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), proc(tmp_path / "b", [client, ours, spoofed])) is None
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), proc(tmp_path / "c", [client])) is None
    # With the server's address known the connection is pinned by its four values.
    assert (
        socket_owner(("127.0.0.1", 54321), ("127.0.0.1", 8080), proc(tmp_path / "d", [client, ours, spoofed])) == 1001
    )


def test_ipv6_rows_and_a_missing_tcp6(tmp_path):
    one = "00000000000000000000000001000000"  # ::1
    root = proc(
        tmp_path, [], [row(0, f"{one}:D431", f"{one}:1F90", "01", 1003), row(1, f"{one}:1F90", f"{one}:D431", "01", 0)]
    )
    assert socket_owner(("::1", 54321), ("::1", 8080), root) == 1003
    assert peer_uid("ipv6:%5B::1%5D:54321", (None, 8080), root) == 1003
    # No tcp6 (a kernel without IPv6): IPv4 lookups still work, IPv6 ones find no one.
    bare = proc(
        tmp_path / "bare",
        [row(0, "0100007F:D431", "0100007F:1F90", "01", 1004), row(1, "0100007F:1F90", "0100007F:D431", "01", 0)],
    )
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), bare) == 1004
    assert socket_owner(("::1", 54321), (None, 8080), bare) is None


def test_a_remote_peer_is_not_looked_up_even_when_listed(tmp_path):
    # 10.0.0.5:54321 -> 10.0.0.5:8080 is a local process too, but not on loopback: refused.
    root = proc(
        tmp_path,
        [row(0, "0500000A:D431", "0500000A:1F90", "01", 1005), row(1, "0500000A:1F90", "0500000A:D431", "01", 0)],
    )
    assert socket_owner(("10.0.0.5", 54321), (None, 8080), root) == 1005
    assert peer_uid("ipv4:10.0.0.5:54321", (None, 8080), root) is None


def test_malformed_rows_are_skipped(tmp_path):
    root = proc(
        tmp_path,
        [
            "garbage 0100007F:D431\n",
            "   1: 0100007F:D431 0100007F:1F90 01\n",
            row(2, "0100007F:D431", "0100007F:1F90", "01", 1006),
        ],
    )
    assert socket_owner(("127.0.0.1", 54321), ("127.0.0.1", 8080), root) == 1006


@pytest.mark.parametrize(
    "client, server",
    [
        (("127.0.0.1", 0), ("127.0.0.1", 8080)),
        (("127.0.0.1", 54321), ("127.0.0.1", 70000)),
        (("127.0.0.1", -1), (None, 8080)),
        (("localhost", 54321), (None, 8080)),
        (("127.0.0.1", 54321), ("", 8080)),
    ],
)
def test_socket_owner_refuses_bad_input(tmp_path, client, server):
    root = proc(tmp_path, [row(0, "0100007F:D431", "0100007F:1F90", "01", 1007)])
    assert socket_owner(client, server, root) is None


# -- the exact lookup against the kernel ---------------------------------------------------


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


V4 = ip("127.0.0.1")
TCP_TIME_WAIT, TCP_LISTEN = 6, 10


def test_the_exact_lookup_names_the_owner_of_each_family():
    with listening(socket.AF_INET, "127.0.0.1") as lsock, connection(lsock, socket.AF_INET, "127.0.0.1") as c:
        port, cport = lsock.getsockname()[1], c.getsockname()[1]
        assert _netlink_owner(V4, cport, V4, port) == os.getuid()
        # Asked in either spelling, the kernel finds the same socket, and says it is AF_INET.
        assert _netlink_query(socket.AF_INET, V4, cport, V4, port) == (1, os.getuid())
        assert _netlink_query(socket.AF_INET6, ip("::ffff:127.0.0.1"), cport, ip("::ffff:127.0.0.1"), port) == (
            1,
            os.getuid(),
        )
        assert _netlink_owner(V4, cport, V4, free_port()) is None
        assert _netlink_owner(V4, cport, ip("::1"), port) is None  # never a mixed pair
    with listening(socket.AF_INET6, "::1") as lsock, connection(lsock, socket.AF_INET6, "::1") as c:
        port, cport = lsock.getsockname()[1], c.getsockname()[1]
        assert _netlink_owner(ip("::1"), cport, ip("::1"), port) == os.getuid()
        assert _netlink_owner(ip("::1"), port, ip("::1"), cport) == os.getuid()  # the server's end
    with listening(socket.AF_INET, "127.0.0.1") as lsock, connection(lsock, socket.AF_INET6, "::ffff:127.0.0.1") as c:
        port, cport = lsock.getsockname()[1], c.getsockname()[1]
        assert _netlink_owner(V4, cport, V4, port) == os.getuid()  # an AF_INET6 socket, v4-mapped


def test_a_real_time_wait_socket_is_uid_0_and_no_one(via):
    """The trap the ESTABLISHED rule is for, set up for real: the client hangs up first, so its
    end lingers in TIME_WAIT, which the kernel reports as uid 0 (root) in both ways of asking,
    and the exact lookup returns it whatever state mask was asked for."""
    with listening(socket.AF_INET, "127.0.0.1") as lsock:
        port = lsock.getsockname()[1]
        client = socket.socket()
        client.connect(("127.0.0.1", port))
        me = client.getsockname()
        accepted, _ = lsock.accept()
        client.close()
        with accepted:
            assert accepted.recv(1) == b""  # the client's FIN
        deadline = time.monotonic() + 5
        while _netlink_query(socket.AF_INET, V4, me[1], V4, port) != (TCP_TIME_WAIT, 0):
            assert time.monotonic() < deadline, "the client's end never reached TIME_WAIT"
            time.sleep(0.01)
        assert f"0100007F:{me[1]:04X} 0100007F:{port:04X} 06" in Path("/proc/net/tcp").read_text()
        assert _netlink_owner(V4, me[1], V4, port) is None
        assert via.owner(me, ("127.0.0.1", port)) is None
        assert via.owner(me, (None, port)) is None


def test_the_lookups_fallback_to_a_listener_is_no_connection(via):
    """Asked for a connection that does not exist, the kernel's exact lookup answers with a
    socket listening on the asked local end: that is not the connection, and says nothing."""
    with listening(socket.AF_INET, "127.0.0.1") as lsock:
        port = lsock.getsockname()[1]
        assert _netlink_query(socket.AF_INET, V4, port, V4, free_port()) is None
        assert _netlink_owner(V4, port, V4, free_port()) is None
        assert via.owner(("127.0.0.1", port), ("127.0.0.1", free_port())) is None


def test_a_proc_root_other_than_proc_is_only_read(tmp_path):
    # The tables given are the answer, even for a connection the kernel knows otherwise.
    with listening(socket.AF_INET, "127.0.0.1") as lsock, connection(lsock, socket.AF_INET, "127.0.0.1") as c:
        port, cport = lsock.getsockname()[1], c.getsockname()[1]
        root = proc(tmp_path, [row(0, f"0100007F:{cport:04X}", f"0100007F:{port:04X}", "01", 4242)])
        assert socket_owner(("127.0.0.1", cport), ("127.0.0.1", port), root) == 4242
        assert socket_owner(("127.0.0.1", cport), ("127.0.0.1", port)) == os.getuid()


def test_many_threads_ask_at_once():
    """The gRPC server asks from a pool of threads: each gets its own connection's answer."""
    with listening(socket.AF_INET, "127.0.0.1") as lsock:
        port = lsock.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        accepted = [lsock.accept()[0] for _ in clients]
        wrong: list[object] = []

        def ask(client: socket.socket) -> None:
            me = client.getsockname()
            for _ in range(100):
                uid = socket_owner(me, ("127.0.0.1", port))
                if uid != os.getuid():
                    wrong.append((me, uid))

        threads = [threading.Thread(target=ask, args=(c,)) for c in clients]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            for s in clients + accepted:
                s.close()
        assert wrong == []


# -- the exact lookup's failures: the tables answer instead --------------------------------


@pytest.mark.parametrize(
    "error",
    [
        PermissionError(errno.EPERM, "sandboxed"),
        OSError(errno.EPROTONOSUPPORT, "no sock_diag"),
        OSError(errno.EAFNOSUPPORT, "no AF_NETLINK"),
        TimeoutError("timed out"),
    ],
)
def test_netlink_unavailable_falls_back_to_the_tables(monkeypatch, error):
    def fail(message: bytes) -> bytes:
        raise error

    monkeypatch.setattr(peer, "_netlink_exchange", fail)
    with listening(socket.AF_INET, "127.0.0.1") as lsock, connection(lsock, socket.AF_INET, "127.0.0.1") as c:
        port, me = lsock.getsockname()[1], c.getsockname()
        with pytest.raises(OSError):
            _netlink_owner(V4, me[1], V4, port)
        assert socket_owner(me, ("127.0.0.1", port)) == os.getuid()


def test_a_kernel_refusing_the_socket_falls_back_to_the_tables(monkeypatch):
    # A real refusal: socket(AF_NETLINK, SOCK_RAW, a protocol the kernel lacks) fails.
    monkeypatch.setattr(peer, "_NETLINK_SOCK_DIAG", 31)
    with listening(socket.AF_INET, "127.0.0.1") as lsock, connection(lsock, socket.AF_INET, "127.0.0.1") as c:
        port, me = lsock.getsockname()[1], c.getsockname()
        with pytest.raises(OSError):
            _netlink_owner(V4, me[1], V4, port)
        assert socket_owner(me, ("127.0.0.1", port)) == os.getuid()


def test_a_reply_cut_short_by_the_buffer_falls_back_to_the_tables(monkeypatch):
    # The real kernel's reply, received into too small a buffer: truncated, never parsed.
    monkeypatch.setattr(peer, "_RECV_SIZE", 60)
    with listening(socket.AF_INET, "127.0.0.1") as lsock, connection(lsock, socket.AF_INET, "127.0.0.1") as c:
        port, me = lsock.getsockname()[1], c.getsockname()
        with pytest.raises(OSError, match="truncated"):
            _netlink_owner(V4, me[1], V4, port)
        assert socket_owner(me, ("127.0.0.1", port)) == os.getuid()


OTHER_UID = os.getuid() + 4242  # a uid a crafted reply claims: never the real owner


def diag_reply(
    request: bytes,
    *,
    kind: int = 20,
    seq_shift: int = 0,
    family: int | None = None,
    state: int = 1,
    sport_shift: int = 0,
    dport: int | None = None,
    dst: bytes | None = None,
    uid: int = OTHER_UID,
    cut: int | None = None,
    length_shift: int = 0,
) -> bytes:
    """A reply to ``request`` (an inet_diag_req_v2 message), as the kernel would write it for
    the socket asked for, with one thing changed. Laid out here from linux/inet_diag.h,
    independently of the module; the fields around uid hold other numbers."""
    seq = struct.unpack_from("=IHHII", request)[3]
    req_family = request[16]
    sport, req_dport = struct.unpack_from(">HH", request, 24)
    src, req_dst = request[28:44], request[44:60]
    body = (
        struct.pack("=BBBB", req_family if family is None else family, state, 0, 0)
        + struct.pack(">HH", sport + sport_shift, req_dport if dport is None else dport)
        + src
        + (req_dst if dst is None else dst)
        + struct.pack("=III", 0, 0x11111111, 0x22222222)
        + struct.pack("=IIIII", 7, 8, 9, uid, 12345)
        + struct.pack("=HH", 5, 8)
        + b"\0\0\0\0"
    )  # an attribute, as the kernel adds (INET_DIAG_SHUTDOWN)
    body = body[:cut] if cut is not None else body
    return struct.pack("=IHHII", 16 + len(body) + length_shift, kind, 0, seq + seq_shift, 4321) + body


def error_reply(request: bytes, error: int, size: int = 4) -> bytes:
    seq = struct.unpack_from("=IHHII", request)[3]
    # nlmsgerr: the errno, then the request's header
    body = struct.pack("=i", error)[:size] + (request[:16] if size == 4 else b"")
    return struct.pack("=IHHII", 16 + len(body), 2, 0, seq, 4321) + body


MALFORMED: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda r: b"",
    "a short header": lambda r: diag_reply(r)[:15],
    "a length below the header's": lambda r: struct.pack("=I", 8) + diag_reply(r)[4:],
    "a length past the data": lambda r: diag_reply(r, length_shift=4),
    "another request's sequence": lambda r: diag_reply(r, seq_shift=1),
    "a short error": lambda r: error_reply(r, -errno.ENOENT, size=2),
    "an error other than ENOENT": lambda r: error_reply(r, -errno.EPERM),
    "a positive error": lambda r: error_reply(r, 5),
    "an acknowledgement": lambda r: error_reply(r, 0),
    "a short message": lambda r: diag_reply(r, cut=71),
    "another message type": lambda r: diag_reply(r, kind=3),
    "an unknown family": lambda r: diag_reply(r, family=99),
    "another client port": lambda r: diag_reply(r, sport_shift=1),
    "another server port": lambda r: diag_reply(r, dport=1),
    "another server address": lambda r: diag_reply(r, dst=bytes([127, 0, 0, 9]) + bytes(12)),
}


@contextmanager
def kernel_answering(
    monkeypatch, reply: Callable[[bytes], bytes]
) -> Iterator[tuple[tuple[str, int], int, list[bytes]]]:
    """A real connection, and the exact lookup's exchange answered by ``reply``: yields the
    client's end, the server's port and the requests made."""
    asked: list[bytes] = []

    def exchange(message: bytes) -> bytes:
        asked.append(message)
        return reply(message)

    with listening(socket.AF_INET, "127.0.0.1") as lsock, connection(lsock, socket.AF_INET, "127.0.0.1") as c:
        monkeypatch.setattr(peer, "_netlink_exchange", exchange)
        yield c.getsockname(), lsock.getsockname()[1], asked


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_reply_is_an_error_and_the_tables_answer(monkeypatch, name):
    with kernel_answering(monkeypatch, MALFORMED[name]) as (me, port, asked):
        with pytest.raises(OSError):
            _netlink_owner(V4, me[1], V4, port)
        assert socket_owner(me, ("127.0.0.1", port)) == os.getuid()  # the real owner, from the tables
        assert len(asked) == 2


def test_a_well_formed_reply_is_taken_as_written(monkeypatch):
    # The exact lookup's answer is used as it stands (the uid read from its own field).
    with kernel_answering(monkeypatch, diag_reply) as (me, port, asked):
        assert socket_owner(me, ("127.0.0.1", port)) == OTHER_UID
        assert len(asked) == 1
        assert asked[0][16] == socket.AF_INET and struct.unpack_from(">HH", asked[0], 24) == (me[1], port)
        assert asked[0][28:44] == bytes([127, 0, 0, 1]) + bytes(12) == asked[0][44:60]
        assert struct.unpack_from("=II", asked[0], 64) == (0xFFFFFFFF, 0xFFFFFFFF)  # any cookie


def test_an_ipv6_socket_answering_an_ipv4_request_is_the_same_connection(monkeypatch):
    mapped = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])

    def reply(request: bytes) -> bytes:
        src = request[28:44]
        assert src[:4] == bytes([127, 0, 0, 1])
        r = bytearray(diag_reply(request, family=socket.AF_INET6, dst=mapped))
        r[24:40] = mapped  # the v6 socket's own address, v4-mapped
        return bytes(r)

    with kernel_answering(monkeypatch, reply) as (me, port, asked):
        assert socket_owner(me, ("127.0.0.1", port)) == OTHER_UID


@pytest.mark.parametrize(
    "name, reply",
    [
        ("TIME_WAIT, uid 0", lambda r: diag_reply(r, state=TCP_TIME_WAIT, uid=0)),
        ("FIN_WAIT2", lambda r: diag_reply(r, state=5)),
        ("a listener on the client's end", lambda r: diag_reply(r, state=TCP_LISTEN, dport=0, dst=bytes(16))),
        ("no such socket", lambda r: error_reply(r, -errno.ENOENT)),
    ],
)
def test_no_established_socket_is_no_answer_and_the_tables_decide(monkeypatch, name, reply):
    with kernel_answering(monkeypatch, reply) as (me, port, asked):
        assert _netlink_owner(V4, me[1], V4, port) is None
        assert socket_owner(me, ("127.0.0.1", port)) == os.getuid()  # the tables: it is established


def test_an_ipv4_connection_not_found_is_asked_for_again_v4_mapped(monkeypatch):
    answers = iter([lambda r: error_reply(r, -errno.ENOENT), diag_reply])
    with kernel_answering(monkeypatch, lambda r: next(answers)(r)) as (me, port, asked):
        assert _netlink_owner(V4, me[1], V4, port) == OTHER_UID
        assert [a[16] for a in asked] == [socket.AF_INET, socket.AF_INET6]
        assert asked[1][28:44] == bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])


# -- as root: real throwaway users hold the client's socket -------------------------------

# Run as another user: connect (optionally from a given local address and port, with
# SO_REUSEADDR), print the local end, then hold the connection until stdin closes.
CLIENT = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
s.settimeout(10)
if len(sys.argv) > 3:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[3], int(sys.argv[4])))
s.connect((host, port))
print(*s.getsockname()[:2], flush=True)
sys.stdin.read()
"""


@contextmanager
def connected_as(user, server: tuple[str, int], bind: tuple[str, int] | None = None) -> Iterator[tuple[str, int]]:
    """A process running as ``user`` holds a connection to ``server``; yields its local end."""
    import osusers

    argv = [sys.executable, "-I", "-c", CLIENT, server[0], str(server[1])]
    if bind is not None:
        argv += [bind[0], str(bind[1])]
    proc = subprocess.Popen(
        osusers.as_user(user, argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line, f"the client running as {user.name} failed: {proc.stderr.read()}"
        host, port = line.split()
        yield host, int(port)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=10)


def test_a_connection_held_by_another_user_is_that_user(os_users, via):
    alice, bob = os_users("alice", "bob")
    assert os.getuid() == 0 and alice.uid != bob.uid
    with listening(socket.AF_INET, "127.0.0.1") as lsock:
        server = lsock.getsockname()
        with connected_as(alice, server) as a_end, connected_as(bob, server) as b_end:
            accepted = [lsock.accept()[0] for _ in range(2)]
            try:
                assert via.owner(a_end, server) == alice.uid
                assert via.owner(b_end, server) == bob.uid
                assert via.peer(f"ipv4:{a_end[0]}:{a_end[1]}", (None, server[1])) == alice.uid
                assert via.peer(f"ipv4:{b_end[0]}:{b_end[1]}", server) == bob.uid
                # The server's accepted sockets are root's: the same connection, the other end.
                for conn in accepted:
                    assert via.owner(conn.getsockname(), conn.getpeername()) == 0
            finally:
                for conn in accepted:
                    conn.close()


def test_another_users_ipv6_connection_is_that_user(os_users, via):
    (alice,) = os_users("alice")
    with listening(socket.AF_INET6, "::", dual_stack=True) as lsock:
        port = lsock.getsockname()[1]
        with connected_as(alice, ("::1", port)) as v6, connected_as(alice, ("::ffff:127.0.0.1", port)) as mapped:
            assert via.owner(v6, ("::1", port)) == alice.uid
            assert via.peer(f"ipv6:%5B{v6[0]}%5D:{v6[1]}", (None, port)) == alice.uid
            assert mapped[0] == "::ffff:127.0.0.1"
            assert via.peer(f"ipv4:127.0.0.1:{mapped[1]}", (None, port)) == alice.uid


def test_two_users_on_one_local_port_are_no_one_unless_the_server_address_tells(os_users, via):
    """alice and bob share a local address and port (both set SO_REUSEADDR), connected to the
    server's port on two addresses, bob's socket an IPv6 one listed in tcp6: a server on
    0.0.0.0 that matches its port only cannot tell them apart, and must not pick one."""
    alice, bob = os_users("alice", "bob")
    with listening(socket.AF_INET, "0.0.0.0") as lsock:
        port = lsock.getsockname()[1]
        with (
            connected_as(alice, ("127.0.0.1", port), bind=("127.0.0.1", 0)) as a_end,
            connected_as(bob, ("::ffff:127.0.0.2", port), bind=("::ffff:127.0.0.1", a_end[1])),
        ):
            assert via.owner(a_end, (None, port)) is None
            assert via.peer(f"ipv4:127.0.0.1:{a_end[1]}", (None, port)) is None
            assert via.owner(a_end, ("127.0.0.1", port)) == alice.uid
            assert via.owner(a_end, ("127.0.0.2", port)) == bob.uid
