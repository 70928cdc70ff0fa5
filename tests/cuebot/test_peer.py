"""cuectl.cuebot.peer: the kernel names the uid behind a loopback connection.

Real sockets throughout (and, as root, real throwaway users holding them); a few tests read
fixture tables for what real sockets cannot set up here (two owners on one connection's two
ends without root, a TIME_WAIT row, a remote peer's row)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cuectl.cuebot.peer import is_loopback, parse_grpc_peer, peer_uid, socket_owner


# -- parse_grpc_peer ----------------------------------------------------------------------

@pytest.mark.parametrize("peer, expected", [
    ("ipv4:127.0.0.1:54321", ("127.0.0.1", 54321)),
    ("ipv4:10.1.2.3:1", ("10.1.2.3", 1)),
    ("ipv6:[::1]:54321", ("::1", 54321)),
    ("ipv6:%5B::1%5D:43506", ("::1", 43506)),  # what grpcio 1.85 writes
    ("ipv6:[0:0:0:0:0:0:0:1]:80", ("::1", 80)),  # normalised
    ("ipv6:[2001:DB8::1]:65535", ("2001:db8::1", 65535)),
    ("ipv6:[::ffff:127.0.0.1]:54321", ("127.0.0.1", 54321)),  # v4-mapped: the IPv4 address
    ("ipv6:%5B::ffff:127.0.0.1%5D:54321", ("127.0.0.1", 54321)),
])
def test_parse_grpc_peer(peer, expected):
    assert parse_grpc_peer(peer) == expected


@pytest.mark.parametrize("peer", [
    "unix:/run/cuectl.sock", "unix-abstract:cuectl", "vsock:3:1234", "",
    "ipv4", "ipv4:", "ipv4:127.0.0.1", "ipv4:127.0.0.1:", "ipv4::54321",
    "ipv4:127.0.0.1:0", "ipv4:127.0.0.1:65536", "ipv4:127.0.0.1:-1", "ipv4:127.0.0.1:+5",
    "ipv4:127.0.0.1: 5", "ipv4:127.0.0.1:5x", "ipv4:127.0.0.1:5_0", "ipv4:127.0.0.1:\u0665",
    "ipv4:127.0.0:5", "ipv4:127.000.0.1:5", "ipv4:localhost:5", "ipv4:::1:5", "ipv4:[::1]:5",
    "ipv6:::1:5", "ipv6:[::1]", "ipv6:[::1]:", "ipv6:[::1]5", "ipv6:[127.0.0.1]:5", "ipv6:[::g]:5",
    "IPV4:127.0.0.1:5", "tcp:127.0.0.1:5",
])
def test_parse_grpc_peer_refuses_what_is_not_an_address(peer):
    assert parse_grpc_peer(peer) is None


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1", True), ("127.4.5.6", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False), ("0.0.0.0", False), ("::", False), ("::ffff:10.0.0.1", False),
    ("localhost", False), ("", False), ("127.0.0.1:5", False),
])
def test_is_loopback(address, expected):
    assert is_loopback(address) is expected


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


def test_an_ipv4_client_is_its_owner():
    with listening(socket.AF_INET, "127.0.0.1") as lsock, connection(lsock, socket.AF_INET, "127.0.0.1") as c:
        port = lsock.getsockname()[1]
        me = c.getsockname()
        assert socket_owner(me, ("127.0.0.1", port)) == os.getuid()
        assert socket_owner(me, (None, port)) == os.getuid()
        assert peer_uid(f"ipv4:{me[0]}:{me[1]}", ("127.0.0.1", port)) == os.getuid()
        # Any other server, or a client port no socket has, is no one.
        assert socket_owner(me, ("127.0.0.1", free_port())) is None
        assert socket_owner(me, ("127.0.0.2", port)) is None
        assert socket_owner(me, ("::1", port)) is None
        assert socket_owner(("127.0.0.1", free_port()), ("127.0.0.1", port)) is None
        assert socket_owner(("127.0.0.2", me[1]), ("127.0.0.1", port)) is None


def test_an_ipv6_client_is_its_owner():
    with listening(socket.AF_INET6, "::1") as lsock, connection(lsock, socket.AF_INET6, "::1") as c:
        port = lsock.getsockname()[1]
        host, cport = c.getsockname()[:2]
        assert socket_owner((host, cport), ("::1", port)) == os.getuid()
        assert socket_owner((host, cport), (None, port)) == os.getuid()
        assert peer_uid(f"ipv6:%5B{host}%5D:{cport}", ("::1", port)) == os.getuid()
        assert peer_uid(f"ipv6:[{host}]:{cport}", (None, port)) == os.getuid()
        assert socket_owner((host, cport), ("::1", free_port())) is None
        assert socket_owner((host, cport), ("127.0.0.1", port)) is None


def test_an_ipv4_client_of_a_dual_stack_listener_is_its_owner():
    """The server listens on [::]: the client's socket is AF_INET, in /proc/net/tcp."""
    with listening(socket.AF_INET6, "::", dual_stack=True) as lsock, \
            connection(lsock, socket.AF_INET, "127.0.0.1") as c:
        port = lsock.getsockname()[1]
        host, cport = c.getsockname()
        assert socket_owner((host, cport), (None, port)) == os.getuid()
        assert socket_owner((host, cport), ("::ffff:127.0.0.1", port)) == os.getuid()
        # grpcio reports such a peer as ipv4:; the v4-mapped spelling means the same.
        assert peer_uid(f"ipv4:{host}:{cport}", (None, port)) == os.getuid()
        assert peer_uid(f"ipv6:[::ffff:{host}]:{cport}", (None, port)) == os.getuid()


def test_an_ipv6_socket_connected_to_a_v4_mapped_address_is_found_in_tcp6():
    with listening(socket.AF_INET, "0.0.0.0") as lsock, \
            connection(lsock, socket.AF_INET6, "::ffff:127.0.0.1") as c:
        port = lsock.getsockname()[1]
        host, cport = c.getsockname()[:2]
        assert host == "::ffff:127.0.0.1"
        # The client's row is v4-mapped in tcp6 (not in tcp), so the tcp6 path is what finds it.
        mapped = f"0000000000000000FFFF00000100007F:{cport:04X}"
        assert mapped in Path("/proc/net/tcp6").read_text()
        assert f"0100007F:{cport:04X} 0100007F:{port:04X}" not in Path("/proc/net/tcp").read_text()
        assert socket_owner(("127.0.0.1", cport), ("127.0.0.1", port)) == os.getuid()
        assert socket_owner((host, cport), (None, port)) == os.getuid()
        assert peer_uid(f"ipv4:127.0.0.1:{cport}", (None, port)) == os.getuid()


def test_a_connection_the_client_closed_is_no_one():
    with listening(socket.AF_INET, "127.0.0.1") as lsock:
        port = lsock.getsockname()[1]
        client = socket.socket()
        client.connect(("127.0.0.1", port))
        accepted, _ = lsock.accept()
        with accepted:
            me = client.getsockname()
            assert socket_owner(me, ("127.0.0.1", port)) == os.getuid()
            client.close()  # FIN_WAIT on the client's end, CLOSE_WAIT on the server's
            assert socket_owner(me, ("127.0.0.1", port)) is None


def test_non_loopback_peers_and_unix_sockets_are_never_looked_up():
    assert peer_uid("unix:/run/cuectl.sock", (None, 8080)) is None
    assert peer_uid("ipv4:not-an-address:5", (None, 8080)) is None


# -- fixture tables: what real sockets cannot set up without root -------------------------
# The text is a little-endian kernel's (x86-64, arm64): 0100007F is 127.0.0.1.

HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n")
HEADER6 = ("  sl  local_address                         remote_address                        st tx_queue "
           "rx_queue tr tm->when retrnsmt   uid  timeout inode\n")


def row(n: int, local: str, remote: str, state: str, uid: int) -> str:
    return (f"  {n:3d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid:5d}        0 "
            f"{1000 + n} 1 0000000000000000 20 4 30 10 -1\n")


def proc(tmp_path: Path, tcp: list[str], tcp6: list[str] | None = None) -> Path:
    (tmp_path / "net").mkdir(parents=True)
    (tmp_path / "net" / "tcp").write_text(HEADER + "".join(tcp))
    if tcp6 is not None:
        (tmp_path / "net" / "tcp6").write_text(HEADER6 + "".join(tcp6))
    return tmp_path


def test_the_clients_end_is_matched_not_the_servers(tmp_path):
    # 127.0.0.1:54321 (uid 1001) connected to the server at 127.0.0.1:8080 (uid 1000); the
    # server's accepted socket is the same pair swapped.
    root = proc(tmp_path, [
        row(0, "0100007F:1F90", "00000000:0000", "0A", 1000),  # the listener
        row(1, "0100007F:D431", "0100007F:1F90", "01", 1001),  # the client's end
        row(2, "0100007F:1F90", "0100007F:D431", "01", 1000),  # the server's end
    ], [])
    assert socket_owner(("127.0.0.1", 54321), ("127.0.0.1", 8080), root) == 1001
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), root) == 1001
    assert peer_uid("ipv4:127.0.0.1:54321", ("127.0.0.1", 8080), root) == 1001
    assert socket_owner(("127.0.0.1", 8080), ("127.0.0.1", 54321), root) == 1000  # the swap is the other end
    assert socket_owner(("127.0.0.1", 8080), (None, 1), root) is None  # the listener is no connection


def test_only_established_rows_count(tmp_path):
    # A TIME_WAIT row carries uid 0: matching it would make the caller root.
    root = proc(tmp_path, [row(0, "0100007F:D431", "0100007F:1F90", "06", 0),
                           row(1, "0100007F:D432", "0100007F:1F90", "08", 1001)])
    assert socket_owner(("127.0.0.1", 54321), ("127.0.0.1", 8080), root) is None
    assert socket_owner(("127.0.0.1", 54322), ("127.0.0.1", 8080), root) is None


def test_two_owners_fitting_a_port_only_server_is_no_one(tmp_path):
    # One local address and port, two connections (SO_REUSEADDR) to the server's port on
    # two addresses: without the server's address the caller cannot be told apart.
    rows = [row(0, "0100007F:D431", "0100007F:1F90", "01", 1001),
            row(1, "0100007F:D431", "0200007F:1F90", "01", 1002)]
    root = proc(tmp_path, rows)
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), root) is None
    assert socket_owner(("127.0.0.1", 54321), ("127.0.0.1", 8080), root) == 1001
    assert socket_owner(("127.0.0.1", 54321), ("127.0.0.2", 8080), root) == 1002
    # The same socket listed twice (a table read in several chunks can repeat a row) is one owner.
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), proc(tmp_path / "b", [rows[0], rows[0]])) == 1001


def test_ipv6_rows_and_a_missing_tcp6(tmp_path):
    one = "00000000000000000000000001000000"  # ::1
    root = proc(tmp_path, [], [row(0, f"{one}:D431", f"{one}:1F90", "01", 1003)])
    assert socket_owner(("::1", 54321), ("::1", 8080), root) == 1003
    assert peer_uid("ipv6:%5B::1%5D:54321", (None, 8080), root) == 1003
    # No tcp6 (a kernel without IPv6): IPv4 lookups still work, IPv6 ones find no one.
    bare = proc(tmp_path / "bare", [row(0, "0100007F:D431", "0100007F:1F90", "01", 1004)])
    assert socket_owner(("127.0.0.1", 54321), (None, 8080), bare) == 1004
    assert socket_owner(("::1", 54321), (None, 8080), bare) is None


def test_a_remote_peer_is_not_looked_up_even_when_listed(tmp_path):
    # 10.0.0.5:54321 -> 10.0.0.5:8080 is a local process too, but not on loopback: refused.
    root = proc(tmp_path, [row(0, "0500000A:D431", "0500000A:1F90", "01", 1005)])
    assert socket_owner(("10.0.0.5", 54321), (None, 8080), root) == 1005
    assert peer_uid("ipv4:10.0.0.5:54321", (None, 8080), root) is None


def test_malformed_rows_are_skipped(tmp_path):
    root = proc(tmp_path, ["garbage 0100007F:D431\n", "   1: 0100007F:D431 0100007F:1F90 01\n",
                           row(2, "0100007F:D431", "0100007F:1F90", "01", 1006)])
    assert socket_owner(("127.0.0.1", 54321), ("127.0.0.1", 8080), root) == 1006


@pytest.mark.parametrize("client, server", [
    (("127.0.0.1", 0), ("127.0.0.1", 8080)), (("127.0.0.1", 54321), ("127.0.0.1", 70000)),
    (("127.0.0.1", -1), (None, 8080)), (("localhost", 54321), (None, 8080)), (("127.0.0.1", 54321), ("", 8080)),
])
def test_socket_owner_refuses_bad_input(tmp_path, client, server):
    root = proc(tmp_path, [row(0, "0100007F:D431", "0100007F:1F90", "01", 1007)])
    assert socket_owner(client, server, root) is None


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
    proc = subprocess.Popen(osusers.as_user(user, argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
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


def test_a_connection_held_by_another_user_is_that_user(os_users):
    alice, bob = os_users("alice", "bob")
    assert os.getuid() == 0 and alice.uid != bob.uid
    with listening(socket.AF_INET, "127.0.0.1") as lsock:
        server = lsock.getsockname()
        with connected_as(alice, server) as a_end, connected_as(bob, server) as b_end:
            accepted = [lsock.accept()[0] for _ in range(2)]
            try:
                assert socket_owner(a_end, server) == alice.uid
                assert socket_owner(b_end, server) == bob.uid
                assert peer_uid(f"ipv4:{a_end[0]}:{a_end[1]}", (None, server[1])) == alice.uid
                assert peer_uid(f"ipv4:{b_end[0]}:{b_end[1]}", server) == bob.uid
                # The server's accepted sockets are root's: the same connection, the other end.
                for conn in accepted:
                    assert socket_owner(conn.getsockname(), conn.getpeername()) == 0
            finally:
                for conn in accepted:
                    conn.close()


def test_another_users_ipv6_connection_is_that_user(os_users):
    (alice,) = os_users("alice")
    with listening(socket.AF_INET6, "::", dual_stack=True) as lsock:
        port = lsock.getsockname()[1]
        with connected_as(alice, ("::1", port)) as v6, connected_as(alice, ("::ffff:127.0.0.1", port)) as mapped:
            assert socket_owner(v6, ("::1", port)) == alice.uid
            assert peer_uid(f"ipv6:%5B{v6[0]}%5D:{v6[1]}", (None, port)) == alice.uid
            assert mapped[0] == "::ffff:127.0.0.1"
            assert peer_uid(f"ipv4:127.0.0.1:{mapped[1]}", (None, port)) == alice.uid


def test_two_users_on_one_local_port_are_no_one_unless_the_server_address_tells(os_users):
    """alice and bob share a local address and port (both set SO_REUSEADDR), connected to the
    server's port on two addresses, bob's socket an IPv6 one listed in tcp6: a server on
    0.0.0.0 that matches its port only cannot tell them apart, and must not pick one."""
    alice, bob = os_users("alice", "bob")
    with listening(socket.AF_INET, "0.0.0.0") as lsock:
        port = lsock.getsockname()[1]
        with connected_as(alice, ("127.0.0.1", port), bind=("127.0.0.1", 0)) as a_end, \
                connected_as(bob, ("::ffff:127.0.0.2", port), bind=("::ffff:127.0.0.1", a_end[1])):
            assert socket_owner(a_end, (None, port)) is None
            assert peer_uid(f"ipv4:127.0.0.1:{a_end[1]}", (None, port)) is None
            assert socket_owner(a_end, ("127.0.0.1", port)) == alice.uid
            assert socket_owner(a_end, ("127.0.0.2", port)) == bob.uid
