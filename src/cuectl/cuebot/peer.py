"""Who is calling: the uid that owns the client's end of a loopback TCP connection.

OpenCue's clients send no credentials, only a user name they write themselves, so that name
proves nothing. For a connection over loopback the kernel knows better: it records the uid of
the process that created each socket, and answers it for one exact connection through
NETLINK_SOCK_DIAG (what ``ss`` uses), or lists it for every socket in /proc/net/tcp (IPv4) and
/proc/net/tcp6 (IPv6, and IPv4 through v4-mapped addresses), as identd answers it. The gRPC
server knows the peer's address and port (``context.peer()``) and its own address and port;
the socket whose *local* end is the peer and whose *remote* end is the server is the client's
socket, and its uid is the caller.

Two ways to ask, one answer:
- The exact lookup (``_netlink_owner``): one SOCK_DIAG_BY_FAMILY request naming the four
  values, answered by the kernel's own connection-table lookup. Used when the server's
  address is known (both ends pinned) and /proc is the default.
- The tables (``_table_owners``): read and parse /proc/net/tcp{,6}. Used when the server's
  address is not known (only its port is matched, so every fitting row must be seen), when
  netlink cannot answer (no AF_NETLINK, EPERM, EPROTONOSUPPORT, no inet_diag module, a
  timeout, a reply that does not parse), when it finds no established socket (a refusal is
  then confirmed by the tables, at their cost), and for a ``proc_root`` other than /proc.

Why this can be trusted:
- The kernel writes the uid (the socket's owner, set when the socket was created); no
  process can change it afterwards or forge a row. Both ways read the same field of the
  same socket (sock_i_uid), mapped into the reader's user namespace the same way, in the
  reader's network namespace; a netlink reply is taken only from the kernel (sender port 0),
  and only when it is about the socket asked for.
- /proc/net and a netlink socket are per network namespace and loopback never leaves one: a
  socket reaching our listener over loopback lives in this namespace, on this host. Peers
  that are not loopback addresses are never looked up (``peer_uid``).
- Only ESTABLISHED sockets count. A closed connection lingers as TIME_WAIT with uid 0: matching
  it would make any caller root. The exact lookup returns such a socket too (it ignores the
  request's state mask), and, when no connection fits, a socket *listening* on the client's
  address and port, so its reply's state and its four values are checked, not assumed.
- When more than one established socket fits (two sockets may share a local address and
  port through SO_REUSEADDR if they connect to different places, which matters when the
  server's own address is not pinned) and their owners differ, the answer is None: the
  caller then refuses rather than picks. With both ends pinned the kernel keeps the four
  values unique, so the exact lookup has one socket to find.

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
connections, so 600 sockets, 700-900 table rows with the machine's own; the connection hash
has 262,144 buckets here, sized by RAM):
- the exact lookup (server's address known): 25-40 us a call, IPv4 or IPv6 (a fresh netlink
  socket is 7 us of it, one request and its reply most of the rest), whatever the number of
  connections, since the kernel hashes straight to the one socket;
- the tables: 4.7-4.9 ms a call when the server's address is known (one table read), 8.0-9.2
  ms when only its port is and the client is IPv4 (both tables read). Parsing is 0.1-0.2 ms of
  that; the rest is the kernel printing the table, which walks its whole connection hash:
  about 3.5 ms even for an almost empty table;
- a refusal (no established socket found) is the exact lookup plus the tables, 8.5-9.7 ms.
So a server should pass its address when it listens on one (127.0.0.1 or ::1, not [::]).
Either way it runs on every gRPC call and is never cached: once a connection closes its
port can be taken by another process, and a cache keyed on the address would hand that
process the old owner's uid.
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import socket
import struct
from pathlib import Path
from typing import TypeAlias
from urllib.parse import unquote

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

_ESTABLISHED = "01"  # the kernel's TCP_ESTABLISHED, as /proc/net/tcp prints the state
_UID_COLUMN = 7  # sl, local, remote, st, tx:rx, tr:when, retrnsmt, uid
_PROC = Path("/proc")

# NETLINK_SOCK_DIAG (linux/sock_diag.h, linux/inet_diag.h, linux/netlink.h).
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLMSG_ERROR = 2
_TCP_ESTABLISHED = 1
_TCP_LISTEN = 10
_INET_DIAG_NOCOOKIE = 0xFFFFFFFF  # with both cookie words: match any socket, not one generation
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NLMSGERR = struct.Struct("=i")  # a negative errno (0: an acknowledgement)
# inet_diag_req_v2: family, protocol, ext, pad, states; then its inet_diag_sockid.
_REQ = struct.Struct("=BBBBI")
# inet_diag_sockid: sport, dport (network order); src, dst (16 bytes each, network order);
# if, cookie[2] (host order).
_SOCKID_PORTS = struct.Struct(">HH")
_SOCKID_TAIL = struct.Struct("=III")
_SOCKID_LEN = _SOCKID_PORTS.size + 32 + _SOCKID_TAIL.size  # 48
# inet_diag_msg: family, state, timer, retrans; the sockid; expires, rqueue, wqueue, uid, inode.
_MSG_HEAD = struct.Struct("=BBBB")
_MSG_TAIL = struct.Struct("=IIIII")
_MSG_LEN = _MSG_HEAD.size + _SOCKID_LEN + _MSG_TAIL.size  # 72
_NETLINK_TIMEOUT = 1.0  # seconds; the kernel answers before sendto returns, so this is only a guard
_RECV_SIZE = 8192  # one socket's reply without extensions is about 120 bytes
_sequence = itertools.count(1)  # next() on it is atomic under the GIL; a number only tells replies apart


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


def socket_owner(
    client: tuple[str, int], server: tuple[str | None, int], proc_root: Path = Path("/proc")
) -> int | None:
    """The uid owning the ESTABLISHED TCP socket whose local end is ``client`` and whose
    remote end is ``server``: the client's end of the connection, not the server's
    accepted socket (which has the two swapped). ``server``'s host may be None when the
    server listens on every address (0.0.0.0, [::], localhost): the client's remote
    address is then whatever it connected to, and only the port is matched.

    None when no such socket exists, or when sockets of different owners all fit.

    With both ends known the kernel is asked for that one connection (``_netlink_owner``);
    otherwise, or when it cannot answer, the tables under ``proc_root`` are read. A
    ``proc_root`` other than /proc (a fixture, another process's /proc/PID) is only read: the
    exact lookup would answer for this process's network namespace instead."""
    try:
        local = _normalised(client[0])
        remote = None if server[0] is None else _normalised(server[0])
    except ValueError:
        return None
    if not _valid_port(client[1]) or not _valid_port(server[1]):
        return None
    if remote is not None and remote.version != local.version:
        return None  # an IPv4 end is never connected to an IPv6 one
    if remote is not None and proc_root == _PROC:
        try:
            uid = _netlink_owner(local, client[1], remote, server[1])
        except OSError:
            uid = None  # netlink cannot answer here: the tables can
        if uid is not None:
            return uid
    uid = _table_owners(local, client[1], remote, server[1], proc_root)
    if uid is not None and remote is None and _server_ends(local, client[1], server[1], proc_root) != 1:
        # Only the port was matched: a second connection to this port from the same address
        # and port (one from the network spoofing 127.0.0.1, with route_localnet and a
        # route sending the replies away) would otherwise be taken for the local user's.
        # The server's own accepted sockets tell: exactly one may come from that address.
        return None
    return uid


def _server_ends(client: IPAddress, client_port: int, server_port: int, proc_root: Path) -> int:
    """How many ESTABLISHED sockets listen-side (local port ``server_port``, any address)
    are connected to ``client``:``client_port``, in both tables."""
    count = 0
    for table, remote_ip, _ in _tables(client, None):
        try:
            text = (proc_root / "net" / table).read_text()
        except OSError:
            continue
        wanted = f"{_proc_hex(remote_ip)}:{client_port:04X}"
        for line in text.splitlines()[1:]:
            if wanted not in line:
                continue
            fields = line.split()
            if (
                len(fields) > _UID_COLUMN
                and fields[2] == wanted
                and fields[3] == _ESTABLISHED
                and fields[1].rpartition(":")[2] == f"{server_port:04X}"
            ):
                count += 1
    return count


def peer_uid(peer: str, server: tuple[str | None, int], proc_root: Path = Path("/proc")) -> int | None:
    """The uid of the process on the other end of a gRPC call (``context.peer()``) made to
    the server at ``server`` (host None: listening on every address). Loopback peers only:
    None for any other peer, a Unix socket, or when the socket is not found."""
    parsed = parse_grpc_peer(peer)
    if parsed is None or not is_loopback(parsed[0]):
        return None
    return socket_owner(parsed, server, proc_root)


# -- the exact lookup: NETLINK_SOCK_DIAG ---------------------------------------------------


def _netlink_owner(local: IPAddress, local_port: int, remote: IPAddress, remote_port: int) -> int | None:
    """The uid owning the ESTABLISHED TCP socket whose local end is ``local``:``local_port``
    and whose remote end is ``remote``:``remote_port`` (both normalised, ``_normalised``), as
    the kernel's exact lookup finds it; None when it finds no such established socket.

    This is the same datum /proc/net/tcp prints in its uid column (sock_i_uid of the same
    socket, in the reader's user namespace and network namespace): the kernel finds the one
    socket through the connection hash instead of printing every socket for us to search.

    An IPv4 connection is asked for as AF_INET and then, if not found, as v4-mapped AF_INET6,
    like the two tables (Linux answers both from one lookup, which finds an AF_INET6 socket
    connected to a v4-mapped address too, but only the reply's values are relied upon).
    Raises OSError when netlink cannot answer: unavailable, refused, timed out, or a reply
    that is short, malformed or not about the socket asked for."""
    asks: list[tuple[int, IPAddress, IPAddress]]
    if isinstance(local, ipaddress.IPv4Address) and isinstance(remote, ipaddress.IPv4Address):
        asks = [(socket.AF_INET, local, remote), (socket.AF_INET6, _mapped(local), _mapped(remote))]
    elif isinstance(local, ipaddress.IPv6Address) and isinstance(remote, ipaddress.IPv6Address):
        asks = [(socket.AF_INET6, local, remote)]
    else:
        return None  # an IPv4 end is never connected to an IPv6 one
    for family, src, dst in asks:
        found = _netlink_query(family, src, local_port, dst, remote_port)
        if found is None:
            continue  # no socket has these four values in this family's spelling
        state, uid = found
        # The four values are unique among connections: this is the one socket that has them,
        # and if it is not established (TIME_WAIT, FIN_WAIT, ...) nothing else can be.
        return uid if state == _TCP_ESTABLISHED else None
    return None


def _netlink_query(family: int, src: IPAddress, sport: int, dst: IPAddress, dport: int) -> tuple[int, int] | None:
    """(state, uid) of the TCP socket the kernel finds for this exact sockid (local ``src``:
    ``sport``, remote ``dst``:``dport``, in ``family``'s spelling), checked to be that socket;
    None when the kernel has none (ENOENT). Raises OSError for anything else."""
    seq = next(_sequence) & 0xFFFFFFFF
    request = (
        _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_ESTABLISHED)  # states: ignored by an exact lookup
        + _sockid(src, sport, dst, dport)
    )
    header = _NLMSGHDR.pack(_NLMSGHDR.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, seq, 0)
    return _parse_reply(_netlink_exchange(header + request), seq, src, sport, dst, dport)


def _netlink_exchange(message: bytes) -> bytes:
    """Send ``message`` to the kernel's sock_diag and return its answer: one datagram, which
    an exact lookup's answer is. A socket per call: the gRPC server asks from many threads,
    and no late reply can reach a later call (7 us of the cost, see the module's figures)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(_NETLINK_TIMEOUT)  # socket.timeout is an OSError
        nl.sendto(message, (0, 0))  # port 0: the kernel
        data, _, flags, sender = nl.recvmsg(_RECV_SIZE)
    if sender[0] != 0:
        # Only the kernel (port 0) answers here: sending to another process's sock_diag socket
        # needs CAP_NET_ADMIN, and even so what it sent is not read as the answer.
        raise _malformed("not from the kernel")
    if flags & socket.MSG_TRUNC:
        raise _malformed("truncated")
    return data


def _sockid(src: IPAddress, sport: int, dst: IPAddress, dport: int) -> bytes:
    # An IPv4 address is the first word of the 16 bytes, the rest zero (as the kernel fills it).
    return (
        _SOCKID_PORTS.pack(sport, dport)
        + src.packed.ljust(16, b"\0")
        + dst.packed.ljust(16, b"\0")
        + _SOCKID_TAIL.pack(0, _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE)
    )  # any interface, any cookie


def _parse_reply(
    data: bytes, seq: int, src: IPAddress, sport: int, dst: IPAddress, dport: int
) -> tuple[int, int] | None:
    """The one message of an exact lookup's reply, an inet_diag_msg or an error, as (state,
    uid); None for ENOENT, and for the lookup's own fallback when no connection fits (a socket
    listening on the asked local end). Every length is checked before it is read: what does
    not parse, or describes another socket than the one asked for, is an OSError."""
    if len(data) < _NLMSGHDR.size:
        raise _malformed("short header")
    length, kind, _, reply_seq, _ = _NLMSGHDR.unpack_from(data)
    if length < _NLMSGHDR.size or length > len(data):
        raise _malformed("bad length")
    if reply_seq != seq:
        raise _malformed("another request's reply")
    body = data[_NLMSGHDR.size : length]
    if kind == _NLMSG_ERROR:
        if len(body) < _NLMSGERR.size:
            raise _malformed("short error")
        (error,) = _NLMSGERR.unpack_from(body)
        if error == -errno.ENOENT:
            return None  # no such socket (or no tcp_diag module: the tables then say which)
        raise OSError(-error if error < 0 else errno.EPROTO, "sock_diag refused the lookup")
    if kind != _SOCK_DIAG_BY_FAMILY or len(body) < _MSG_LEN:
        raise _malformed("not an inet_diag_msg")
    got_family, state = _MSG_HEAD.unpack_from(body)[:2]
    offset = _MSG_HEAD.size
    got_sport, got_dport = _SOCKID_PORTS.unpack_from(body, offset)
    offset += _SOCKID_PORTS.size
    got_src, got_dst = body[offset : offset + 16], body[offset + 16 : offset + 32]
    uid = _MSG_TAIL.unpack_from(body, _MSG_HEAD.size + _SOCKID_LEN)[3]
    # The socket found may be of the other family than asked (an AF_INET6 socket connected to a
    # v4-mapped address answers an AF_INET request): compare the addresses as one spelling.
    ends: tuple[IPAddress, IPAddress]
    if got_family == socket.AF_INET:
        ends = (ipaddress.IPv4Address(got_src[:4]), ipaddress.IPv4Address(got_dst[:4]))
    elif got_family == socket.AF_INET6:
        ends = (_unmapped(ipaddress.IPv6Address(got_src)), _unmapped(ipaddress.IPv6Address(got_dst)))
    else:
        raise _malformed("unknown family")
    if (got_sport, got_dport) != (sport, dport) or ends != (_unmapped(src), _unmapped(dst)):
        if state == _TCP_LISTEN:
            return None  # the lookup's fallback, a socket listening on the local end: no connection
        raise _malformed("another socket")
    return state, uid


def _malformed(why: str) -> OSError:
    return OSError(errno.EBADMSG, f"malformed sock_diag reply: {why}")


# -- the tables: /proc/net/tcp{,6} ----------------------------------------------------------


def _table_owners(
    local: IPAddress, local_port: int, remote: IPAddress | None, remote_port: int, proc_root: Path
) -> int | None:
    """``socket_owner`` from the tables under ``proc_root``: every fitting ESTABLISHED row."""
    uids: set[int] = set()
    for table, local_ip, remote_ip in _tables(local, remote):
        try:
            text = (proc_root / "net" / table).read_text()
        except OSError:
            continue  # a kernel without IPv6 has no tcp6
        uids |= _owners(
            text,
            f"{_proc_hex(local_ip)}:{local_port:04X}",
            None if remote_ip is None else _proc_hex(remote_ip),
            f"{remote_port:04X}",
        )
        if uids and remote is not None:
            # Both ends pinned: the kernel keeps a connection's four values unique across IPv4
            # and v4-mapped IPv6 sockets (one connection table), so the other table holds no
            # second fit, and reading it would cost as much again (see the module's figures).
            break
    return uids.pop() if len(uids) == 1 else None


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
    return [("tcp", local, remote), ("tcp6", _mapped(local), None if remote is None else _mapped(remote))]


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
