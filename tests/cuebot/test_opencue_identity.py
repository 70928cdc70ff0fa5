"""Issue 34 §5 for real: who may change what through `cuectl serve --opencue` (cuebot/call.py,
cuebot/peer.py). Root only, with real throwaway users (tests/osusers.py) sharing a group
store, a root server, and OpenCue's own clients (cueman, cueadmin, pycue) or opencue-proto's
stubs run as those users: on loopback the caller is the uid the kernel says owns the
client's socket, whatever name the request carries, and a refusal never depends on what
the request would have changed; from another address (a network namespace of the test's
own, tests/cuebot/netns.py) a caller only reads, unless the admin trusts its network, and
even then never as root; a loopback address the kernel shows no socket for, and a uid the
server's user namespace cannot name, get nothing at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest
from cuebotlib import CuebotServer, client, cuectl_cmd, start_server, subprocess_env
from netns import Netns
from netns import run as ip

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="real users, a root server and network namespaces need root (CI runs as root)"
)

READ_ONLY = "this server is read-only to callers from other hosts"

#: A client of OpenCue's JobInterface through opencue-proto's own stub: argv[1] the target,
#: argv[2] a JSON list of operations; prints one JSON result per operation, with the gRPC
#: status code and message of a refusal.
STUB_CLIENT = r"""
import json, sys
import grpc
from opencue_proto import job_pb2, job_pb2_grpc

stub = job_pb2_grpc.JobInterfaceStub(grpc.insecure_channel(sys.argv[1]))
out = []
for op, *args in json.loads(sys.argv[2]):
    try:
        if op == "list":
            r = stub.GetJobs(job_pb2.JobGetJobsRequest(r=job_pb2.JobSearchCriteria(include_finished=True)),
                             timeout=20)
            out.append({"ok": True, "jobs": {j.name: j.user for j in r.jobs.jobs}})
        elif op == "kill":
            stub.Kill(job_pb2.JobKillRequest(job=job_pb2.Job(id=args[0]), username=args[1], reason="test"),
                      timeout=20)
            out.append({"ok": True})
        elif op == "pause":
            stub.Pause(job_pb2.JobPauseRequest(job=job_pb2.Job(id=args[0])), timeout=20)
            out.append({"ok": True})
        elif op == "launch":
            r = stub.LaunchSpec(job_pb2.JobLaunchSpecRequest(spec=args[0]), timeout=20)
            out.append({"ok": True, "names": list(r.names)})
        else:
            raise SystemExit("unknown operation " + op)
    except grpc.RpcError as exc:
        out.append({"ok": False, "code": exc.code().name, "details": exc.details()})
print(json.dumps(out))
"""

#: pycue, as a studio's script would use it: find the job by name (argv[1]), then call each
#: method named after it (kill: pycue sends the name it reads from $USER); prints what each
#: raised.
PYCUE_CLIENT = r"""
import json, sys
import opencue

job = opencue.api.findJob(sys.argv[1])
out = {}
for action in sys.argv[2:]:
    try:
        getattr(job, action)()
        out[action] = "ok"
    except Exception as exc:
        out[action] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


#: STUB_CLIENT through a relay of its own whose outgoing connection is bound to 127.0.0.1: to
#: the server, a call from a loopback address, made from another network namespace.
FROM_LOOPBACK_ADDRESS = (
    r"""
import socket, sys, threading

host, port = sys.argv[1].rsplit(":", 1)
listener = socket.create_server(("127.0.0.1", 0))


def pump(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def relay():
    while True:
        inner, _ = listener.accept()
        outer = socket.socket()
        outer.bind(("127.0.0.1", 0))
        outer.connect((host, int(port)))
        for a, b in ((inner, outer), (outer, inner)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


threading.Thread(target=relay, daemon=True).start()
sys.argv[1] = "127.0.0.1:%d" % listener.getsockname()[1]
"""
    + STUB_CLIENT
)


def spec_xml(user: str, name: str) -> str:
    return (
        f"<spec><show>ident</show><user>{user}</user><job name='{name}'><layers>"
        "<layer name='w' type='Render'><cmd>true</cmd><range>1-2</range></layer></layers></job></spec>"
    )


@dataclass
class GroupStore:
    """A store in a setgid directory of the throwaway users' group, created by root (so
    root is its only admin), to which alice and bob submit with `cuectl submit`."""

    dir: Path
    db: Path

    def submit(self, user: Any, name: str) -> int:
        res = user.run(
            [*cuectl_cmd(), "--db", str(self.db), "submit", "--name", name, "--range", "1-3", "--", "true"],
            cwd=self.dir,
        )
        assert res.returncode == 0, res.stderr
        return int(res.stdout)

    def job(self, job_id: int) -> dict[str, Any]:
        res = subprocess_run([*cuectl_cmd(), "--db", str(self.db), "job", "show", str(job_id), "--json"])
        assert res.returncode == 0, res.stderr
        data: dict[str, Any] = json.loads(res.stdout)
        return data

    def jobs_named(self, name: str) -> list[dict[str, Any]]:
        res = subprocess_run([*cuectl_cmd(), "--db", str(self.db), "job", "list", "--name", name, "--json"])
        assert res.returncode == 0, res.stderr
        jobs: list[dict[str, Any]] = json.loads(res.stdout)["jobs"]
        return jobs

    def client_env(self, server: CuebotServer) -> dict[str, str]:
        """An OpenCue client's environment, its config file where the users can read it."""
        config = self.dir / "opencue.yaml"
        if not config.exists():
            config.write_text("cuebot.timeout: 10000\n")
            config.chmod(0o644)
        return subprocess_env(CUEBOT_HOSTS=server.target, OPENCUE_CONFIG_FILE=str(config), GRPC_VERBOSITY="ERROR")


def subprocess_run(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, **kwargs)


def untouched(job: dict[str, Any]) -> bool:
    return job["frame_counts"] == {"WAITING": 3} and not job["paused"] and job["state"] == "PENDING"


@pytest.fixture
def group_store(os_users: Any) -> Iterator[GroupStore]:
    from cuectl.sched.store import open_store

    path = Path(tempfile.mkdtemp(prefix="cuectl-ocid-", dir="/tmp"))
    os.chown(path, 0, os_users.group_gid)
    os.chmod(path, 0o2770)
    store = GroupStore(path, path / "farm.db")
    old = os.umask(0o007)
    try:
        open_store(str(store.db), create=True).close()
    finally:
        os.umask(old)
    assert store.db.stat().st_uid == 0
    yield store
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def servers() -> Iterator[list[CuebotServer]]:
    started: list[CuebotServer] = []
    yield started
    for server in started:
        sys.stderr.write(server.stop())


@pytest.fixture
def netns() -> Iterator[Netns]:
    made = Netns()
    yield made
    made.close()


def serve(
    servers: list[CuebotServer],
    store: GroupStore,
    address: str = "127.0.0.1",
    args: Sequence[str] = (),
    argv_prefix: Sequence[str] = (),
) -> CuebotServer:
    argv = None
    if argv_prefix:
        argv = [*argv_prefix, *cuectl_cmd(), "--db", str(store.db), "serve", "--opencue", f"{address}:0", *args]
    server = start_server(store.db, address=address, args=args, argv=argv)
    servers.append(server)
    return server


def stub(user: Any, env: dict[str, str], target: str, *ops: Sequence[Any]) -> list[dict[str, Any]]:
    res = user.run([sys.executable, "-c", STUB_CLIENT, target, json.dumps(list(ops))], env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    out: list[dict[str, Any]] = json.loads(res.stdout)
    return out


# -- 1. alice cannot change bob's job; bob can ------------------------------------------------
def test_cueman_and_pycue_as_alice_cannot_touch_bobs_job_bob_can(
    group_store: GroupStore, os_users: Any, servers: list[CuebotServer]
) -> None:
    """A refusal does not depend on what the request would change: `cueman -kill` kills the
    procs of the job's running frames (Cuebot's KillFrames), and bob's job has none, nor
    frames 7-9; alice is refused all the same, never answered with an empty success
    (cuebot/call.py owner_only)."""
    alice, bob = os_users("alice", "bob")
    group_store.submit(alice, "hers")
    his = group_store.submit(bob, "his")
    server = serve(servers, group_store)
    env = group_store.client_env(server)
    cueman = [sys.executable, *client("cueman")]

    for args in (["-kill", "his"], ["-kill", "his", "-range", "7-9"], ["-term", "his"]):
        res = alice.run([*cueman, *args, "-force"], env=env, timeout=60)
        assert res.returncode == 1, (args, res.stderr)
        assert "PERMISSION_DENIED" in res.stderr and f"belongs to {bob.name}, not {alice.name}" in res.stderr, (
            args,
            res.stderr,
        )
    res = alice.run([sys.executable, "-c", PYCUE_CLIENT, "his", "kill", "pause"], env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    refused = json.loads(res.stdout)
    for action in ("kill", "pause"):
        # pycue's Job.kill/pause let grpc's own error through (no status mapping of pycue's)
        assert "StatusCode.PERMISSION_DENIED" in refused[action], refused
        assert f"belongs to {bob.name}, not {alice.name}" in refused[action], refused
    assert untouched(group_store.job(his)), group_store.job(his)

    # bob: the same commands work on his own job.
    res = bob.run([*cueman, "-kill", "his", "-force"], env=env, timeout=60)
    assert res.returncode == 0 and "Successfully killed frames for job: his" in res.stderr, res.stderr
    res = bob.run([sys.executable, "-c", PYCUE_CLIENT, "his", "pause", "kill"], env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"pause": "ok", "kill": "ok"}
    job = group_store.job(his)
    assert job["paused"] is True and job["state"] == "FINISHED" and "WAITING" not in job["frame_counts"], job


# -- 2. a name in the request is never believed on loopback ------------------------------------
def test_a_forged_user_name_gets_nothing(group_store: GroupStore, os_users: Any, servers: list[CuebotServer]) -> None:
    """alice writes bob's name (or root's) where OpenCue's requests carry one: a Kill of bob's
    job is still alice's, and so refused; a LaunchSpec naming bob or root submits as alice,
    whose receipt proves it (a root worker runs those frames as alice, never as bob)."""
    alice, bob = os_users("alice", "bob")
    his = group_store.submit(bob, "his")
    server = serve(servers, group_store)
    env = group_store.client_env(server)
    as_bob, as_root, spec_bob, spec_root = stub(
        alice,
        env,
        server.target,
        ["kill", str(his), bob.name],
        ["kill", str(his), "root"],
        ["launch", spec_xml(bob.name, "forged")],
        ["launch", spec_xml("root", "rooted")],
    )
    for refused in (as_bob, as_root):
        assert refused["code"] == "PERMISSION_DENIED", refused
        assert f"belongs to {bob.name}, not {alice.name}" in refused["details"], refused
    assert untouched(group_store.job(his)), group_store.job(his)
    for launched in (spec_bob, spec_root):
        assert launched["ok"], launched
        (name,) = launched["names"]
        (job,) = group_store.jobs_named(name)
        job = group_store.job(job["id"])
        assert job["user"] == alice.name, job
        receipt = group_store.dir / "receipts" / job["receipt"]
        assert receipt.stat().st_uid == alice.uid, (receipt, receipt.stat().st_uid)


# -- 3. other addresses: read-only, unless the admin trusts their network (never for root) ------
def test_a_caller_from_another_address_only_reads_unless_its_network_is_trusted(
    group_store: GroupStore, os_users: Any, netns: Netns, servers: list[CuebotServer]
) -> None:
    """A client in a network namespace of the test's own, reaching the server over a veth pair
    (10.231.X.2 -> 10.231.X.1): it lists jobs, but its Pause, Kill and LaunchSpec are
    refused as read-only, even run by root. With --opencue-trust-network naming its /30, its
    Kill is taken for the user it names, under the store's ownership rules, and never for
    root; a request naming no user acts as the job's owner (OpenCue's own model)."""
    alice, bob = os_users("alice", "bob")
    his = group_store.submit(bob, "his")
    ns = netns.namespace("cli")
    link = netns.veth(None, ns)
    host_ip, subnet = link.left_ip, link.subnet
    read_only = serve(servers, group_store, address=host_ip)
    trusting = serve(servers, group_store, address=host_ip, args=["--opencue-trust-network", str(subnet)])

    def remote(server: CuebotServer, *ops: Sequence[Any]) -> list[dict[str, Any]]:
        res = subprocess_run(netns.exec(ns, [sys.executable, "-c", STUB_CLIENT, server.target, json.dumps(ops)]))
        assert res.returncode == 0, res.stderr
        out: list[dict[str, Any]] = json.loads(res.stdout)
        return out

    res = subprocess_run(
        netns.exec(ns, [sys.executable, *client("cueadmin"), "-lj"]), env=group_store.client_env(read_only)
    )
    assert res.returncode == 0 and "his" in res.stdout, (res.stdout, res.stderr)
    listed, pause, kill, launch = remote(
        read_only, ["list"], ["pause", str(his)], ["kill", str(his), bob.name], ["launch", spec_xml(bob.name, "remote")]
    )
    assert listed == {"ok": True, "jobs": {"his": bob.name}}, listed
    for refused in (pause, kill, launch):
        assert refused["code"] == "PERMISSION_DENIED" and refused["details"].startswith(READ_ONLY), refused
    assert untouched(group_store.job(his)) and group_store.jobs_named("remote") == []

    as_root, as_alice, launch_root = remote(
        trusting, ["kill", str(his), "root"], ["kill", str(his), alice.name], ["launch", spec_xml("root", "rooted")]
    )
    for refused in (as_root, launch_root):
        assert refused["code"] == "PERMISSION_DENIED" and "never taken for root ('root')" in refused["details"], refused
    assert (
        as_alice["code"] == "PERMISSION_DENIED" and f"belongs to {bob.name}, not {alice.name}" in as_alice["details"]
    ), as_alice
    assert untouched(group_store.job(his)) and group_store.jobs_named("rooted") == []
    assert remote(trusting, ["pause", str(his)], ["kill", str(his), bob.name]) == [{"ok": True}, {"ok": True}]
    job = group_store.job(his)
    assert job["paused"] is True and job["state"] == "FINISHED", job


# -- 4. a loopback address whose socket the kernel does not show: refused outright -------------
def test_a_loopback_peer_whose_socket_is_not_on_this_host_is_refused(
    group_store: GroupStore, os_users: Any, netns: Netns, servers: list[CuebotServer]
) -> None:
    """A peer address of 127.0.0.1 is no proof of being local: with route_localnet a network
    can deliver one. Here the server runs in a namespace of its own (the "server host"), and
    a client in another namespace sends from 127.0.0.1 over the veth pair between them: the
    server's kernel tables have no such client socket, so the call is refused as
    UNAUTHENTICATED, a read too (not even the read-only answer of a remote caller), and bob's
    job is untouched. The same client from its own address reads, as any remote caller."""
    _alice, bob = os_users("alice", "bob")
    his = group_store.submit(bob, "his")
    server_ns = netns.namespace("srv", loopback=False)  # no 127.0.0.0/8 of its own: replies go out the veth
    client_ns = netns.namespace("cli")
    link = netns.veth(server_ns, client_ns)
    netns.sysctl(server_ns, f"net.ipv4.conf.{link.left_dev}.route_localnet", "1")  # accept 127.0.0.1 from it
    netns.sysctl(client_ns, f"net.ipv4.conf.{link.right_dev}.route_localnet", "1")  # send from 127.0.0.1
    netns.sysctl(client_ns, f"net.ipv4.conf.{link.right_dev}.arp_announce", "2")
    ip("-n", server_ns, "route", "add", "127.0.0.0/8", "via", link.right_ip, "dev", link.left_dev)
    server = serve(servers, group_store, address=link.left_ip, argv_prefix=netns.exec(server_ns, []))

    def call(program: str, *ops: Sequence[Any]) -> list[dict[str, Any]]:
        res = subprocess_run(netns.exec(client_ns, [sys.executable, "-c", program, server.target, json.dumps(ops)]))
        assert res.returncode == 0, res.stderr
        out: list[dict[str, Any]] = json.loads(res.stdout)
        return out

    listed, kill = call(FROM_LOOPBACK_ADDRESS, ["list"], ["kill", str(his), bob.name])
    for refused in (listed, kill):
        assert refused["code"] == "UNAUTHENTICATED" and refused["details"].startswith("cannot prove who is calling"), (
            refused
        )
    assert untouched(group_store.job(his))
    listed, kill = call(STUB_CLIENT, ["list"], ["kill", str(his), bob.name])
    assert listed == {"ok": True, "jobs": {"his": bob.name}}, listed
    assert kill["code"] == "PERMISSION_DENIED" and kill["details"].startswith(READ_ONLY), kill


# -- 5. a uid the server's user namespace cannot name: refused, not taken for "nobody" ----------
def test_callers_a_user_namespaced_server_cannot_name_are_refused(
    group_store: GroupStore, os_users: Any, servers: list[CuebotServer]
) -> None:
    """A server run in a user namespace (a rootless or user-namespaced container on the host's
    network) sees every caller whose uid has no mapping there as the overflow uid, 65534:
    alice, bob and everyone else as one "nobody". Taken as a person, they could change each
    other's jobs, and where the store file's owner is unmapped as well (it reads as 65534
    too) each of them was its admin: here bob killed alice's job. Such a caller is refused;
    root, mapped, is still served."""
    alice, bob = os_users("alice", "bob")
    hers = group_store.submit(alice, "hers")
    os.chown(group_store.db, alice.uid, -1)  # alice's store: she (and root) its admins, not bob
    # Only root is mapped; the server keeps the store's group to open alice's file.
    server = serve(
        servers,
        group_store,
        argv_prefix=["setpriv", f"--groups={os_users.group_gid}", "--", "unshare", "--user", "--map-root-user", "--"],
    )
    env = group_store.client_env(server)
    for user in (bob, alice):
        (kill,) = stub(user, env, server.target, ["kill", str(hers), user.name])
        assert kill.get("code") == "UNAUTHENTICATED" and "65534" in kill["details"], (user, kill)
    assert untouched(group_store.job(hers)), group_store.job(hers)
    res = subprocess_run(
        [sys.executable, "-c", STUB_CLIENT, server.target, json.dumps([["pause", str(hers)]])], env=env
    )
    assert res.returncode == 0 and json.loads(res.stdout) == [{"ok": True}], (res.stdout, res.stderr)
    assert group_store.job(hers)["paused"] is True
