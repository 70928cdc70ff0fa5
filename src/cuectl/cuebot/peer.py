"""Who is calling: the uid that owns the client's end of a loopback TCP connection.

OpenCue's clients send no credentials, only a user name they write themselves, so that name
proves nothing. For a connection over loopback the kernel knows better: the client's socket
is listed in /proc/net/tcp (IPv4) or /proc/net/tcp6 (IPv6, and IPv4 through v4-mapped
addresses) with the uid of the process that created it, as identd answers it. The gRPC
server knows the peer's address and port (``context.peer()``) and its own port; the socket
whose *local* end is the peer and whose *remote* end is the server is the client's socket,
and its uid is the caller.

Why this can be trusted:
- The kernel writes the uid column (the socket's owner, set when the socket was created);
  no process can change it afterwards or forge a row.
- /proc/net is per network namespace and loopback never leaves one: a socket reaching our
  listener over loopback lives in this namespace, on this host, so it is in the table we
  read. Peers that are not loopback addresses are never looked up (``peer_uid``).
- Only ESTABLISHED rows count. A closed connection lingers as TIME_WAIT with uid 0 in the
  table: matching it would make any caller root.
- When more than one established socket fits (two sockets may share a local address and
  port through SO_REUSEADDR if they connect to different places, which matters when the
  server's own address is not pinned) and their owners differ, the answer is None: the
  caller then refuses rather than picks.

Its limits:
- Same host only: a remote peer's uid means nothing here, and is not looked up.
- The uid is the socket's creator. A process may hand a connected socket to another
  process (fork, SCM_RIGHTS) or drop privileges after connecting; the socket then still
  speaks for its creator. That is the owner's own choice, exactly as with SO_PEERCRED.
- The uid is as the reader's user namespace sees it: a server run inside a user namespace
  reads callers whose uid has no mapping there as the overflow uid (65534, nobody), one
  name for many users, which its caller must not take for a person.
- A lookup that finds nothing (the client hung up, or the table changed under a read that
  took several chunks) gives None, which is a refusal, never another user's uid.

The cost, measured with ``timeit`` (2-core VM, Linux 6.18, 300 established loopback
connections, so 600 rows in a table): 5-6 ms a call when the server's address is known (one
table read), 8-9 ms when only its port is and the client is IPv4 (both tables read). Parsing
is 0.3 ms of that; the rest is the kernel printing the table, which walks its whole
connection hash (262,144 buckets here, sized by RAM): 3.3 ms even for an empty table. So a
server should pass its address when it listens on one (127.0.0.1 or ::1, not [::]). It runs
on every gRPC call and is never cached: once a connection closes its port can be taken by
another process, and a cache keyed on the address would hand that process the old owner's
uid.
"""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path
from typing import TypeAlias
from urllib.parse import unquote

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

_ESTABLISHED = "01"  # the kernel's TCP_ESTABLISHED, as /proc/net/tcp prints the state
_UID_COLUMN = 7  # sl, local, remote, st, tx:rx, tr:when, retrnsmt, uid


def parse_grpc_peer(peer: str) -> tuple[str, int] | None:
    """``context.peer()`` as (normalised address, port); None for a Unix socket or anything
    malformed. An IPv4-mapped IPv6 address comes back as the IPv4 address.

    grpcio writes ``ipv4:127.0.0.1:54321`` and, for IPv6, ``ipv6:[::1]:54321`` in older
    releases and ``ipv6:%5B::1%5D:54321`` (a URI, brackets percent-encoded) in recent ones
    (1.85 does): both are read."""
    family, sep, rest = peer.partition(":")
    if not sep:
        return None
    rest = unquote(rest)
    if family == "ipv4":
        host, sep, port_text = rest.rpartition(":")
    elif family == "ipv6":
        if not rest.startswith("["):
            return None
        host, sep, port_text = rest[1:].rpartition("]:")
    else:
        return None  # unix:, unix-abstract:, vsock: ... have no address to look up
    port = _port(port_text)
    if not sep or port is None:
        return None
    try:
        address = ipaddress.IPv4Address(host) if family == "ipv4" else ipaddress.IPv6Address(host)
    except ValueError:
        return None
    return str(_unmapped(address)), port


def is_loopback(address: str) -> bool:
    """Is ``address`` (IPv4, IPv6 or IPv4-mapped IPv6) a loopback address?"""
    try:
        return _normalised(address).is_loopback
    except ValueError:
        return False


def socket_owner(client: tuple[str, int], server: tuple[str | None, int],
                 proc_root: Path = Path("/proc")) -> int | None:
    """The uid owning the ESTABLISHED TCP socket whose local end is ``client`` and whose
    remote end is ``server``: the client's end of the connection, not the server's
    accepted socket (which has the two swapped). ``server``'s host may be None when the
    server listens on every address (0.0.0.0, [::], localhost): the client's remote
    address is then whatever it connected to, and only the port is matched.

    None when no such socket exists, or when sockets of different owners all fit."""
    try:
        local = _normalised(client[0])
        remote = None if server[0] is None else _normalised(server[0])
    except ValueError:
        return None
    if not _valid_port(client[1]) or not _valid_port(server[1]):
        return None
    if remote is not None and remote.version != local.version:
        return None  # an IPv4 end is never connected to an IPv6 one
    uids: set[int] = set()
    for table, local_ip, remote_ip in _tables(local, remote):
        try:
            text = (proc_root / "net" / table).read_text()
        except OSError:
            continue  # a kernel without IPv6 has no tcp6
        uids |= _owners(text, f"{_proc_hex(local_ip)}:{client[1]:04X}",
                        None if remote_ip is None else _proc_hex(remote_ip), f"{server[1]:04X}")
        if uids and remote is not None:
            # Both ends pinned: the kernel keeps a connection's four values unique across IPv4
            # and v4-mapped IPv6 sockets (one connection table), so the other table holds no
            # second fit, and reading it would cost as much again (see the module's figures).
            break
    return uids.pop() if len(uids) == 1 else None


def peer_uid(peer: str, server: tuple[str | None, int], proc_root: Path = Path("/proc")) -> int | None:
    """The uid of the process on the other end of a gRPC call (``context.peer()``) made to
    the server at ``server`` (host None: listening on every address). Loopback peers only:
    None for any other peer, a Unix socket, or when the socket is not found."""
    parsed = parse_grpc_peer(peer)
    if parsed is None or not is_loopback(parsed[0]):
        return None
    return socket_owner(parsed, server, proc_root)


# -- helpers ------------------------------------------------------------------------------

def _port(text: str) -> int | None:
    # int() would also take " 5", "+5", "5_0" and non-ASCII digits: a peer string has none.
    if not (text.isascii() and text.isdigit()):
        return None
    port = int(text)
    return port if _valid_port(port) else None


def _valid_port(port: int) -> bool:
    return 0 < port < 65536  # a connected TCP end never has port 0


def _unmapped(address: IPAddress) -> IPAddress:
    """IPv4-mapped IPv6 (::ffff:a.b.c.d) as the IPv4 address it stands for, so that the one
    connection has one spelling whichever socket family either end used."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _normalised(address: str) -> IPAddress:
    return _unmapped(ipaddress.ip_address(address))


def _tables(local: IPAddress, remote: IPAddress | None) -> list[tuple[str, IPAddress, IPAddress | None]]:
    """Where the client's socket may be listed, with the addresses as that table spells them.

    An IPv4 client may hold an AF_INET socket (tcp, the usual case, so first) or an AF_INET6
    one connected to a v4-mapped address (tcp6, both ends v4-mapped). Without the server's
    address both are read, so that a second fitting socket in the other table cannot hide
    behind the first (the ambiguity rule in the module's docstring)."""
    if isinstance(local, ipaddress.IPv6Address):
        return [("tcp6", local, remote)]
    return [("tcp", local, remote),
            ("tcp6", _mapped(local), None if remote is None else _mapped(remote))]


def _mapped(address: IPAddress) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed)


def _proc_hex(address: IPAddress) -> str:
    """``address`` as /proc/net/tcp{,6} prints it: each 32-bit word of the address as it lies
    in memory, printed as a native integer (%08X), so the bytes of each word come out
    reversed on a little-endian host (127.0.0.1 is 0100007F) and in order on a big-endian
    one. The port is printed plainly (%04X)."""
    packed = address.packed
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{word:08X}" for word in words)


def _owners(table: str, local: str, remote_address: str | None, remote_port: str) -> set[int]:
    """The uids of the ESTABLISHED rows of ``table`` whose local end is ``local`` ("ADDR:PORT"
    in /proc hex) and whose remote end has ``remote_port`` and, unless None, ``remote_address``."""
    uids: set[int] = set()
    for line in table.splitlines()[1:]:  # the first line is the header
        if local not in line:
            continue  # a substring test first: most rows are other sockets, and splitting them all costs more
        fields = line.split()
        if len(fields) <= _UID_COLUMN or fields[1] != local or fields[3] != _ESTABLISHED:
            continue
        address, _, port = fields[2].partition(":")
        if port == remote_port and (remote_address is None or address == remote_address):
            uids.add(int(fields[_UID_COLUMN]))
    return uids
