"""cuectl.gpu.v1.GpuInterface on the wire: a real gRPC server on loopback serving
``GpuServicer`` from a real store file, a real client channel calling each rpc, and a real
`cuectl worker` on fake GPUs running a frame that uses its device (it writes the fake
device's live values, as test_live_devices' frames do)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest
import yaml

from cuectl.cuebot.gpu_service import GpuServicer
from cuectl.cuebot.proto import cuectl_gpu_pb2 as pb
from cuectl.cuebot.proto import cuectl_gpu_pb2_grpc as pb_grpc
from cuectl.sched.store import HostInfo, open_store

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3
INTERVAL = 0.5  # the worker's --sample-interval here
HOST = "gpubox"


# Not imported from tests/conftest.py: a conftest.py beside this file would shadow it.
def cuectl_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def subprocess_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def a100(bus: int) -> dict[str, Any]:
    """A fake A100 on PCI bus ``bus`` (each device of a host has its own)."""
    return {
        "model": "NVIDIA A100-SXM4-80GB",
        "vendor": "NVIDIA",
        "memory": "80GiB",
        "pci_bus_id": f"0000:{bus:02x}:00.0",
        "driver_version": "550.54.15",
        "compute_capability": "8.0",
    }


# A frame that uses its GPU for a while: it writes its fake device's values (61 %, 4 GiB,
# billed to its own pid), then sleeps.
USE_GPU = r"""
import json, os, sys, time
path = os.path.join(sys.argv[1], os.environ["CUDA_VISIBLE_DEVICES"] + ".json")
with open(path + ".tmp", "w") as fh:
    json.dump({"utilization_pct": 61.0, "memory_used_bytes": 4 * 2**30,
               "processes": [{"pid": os.getpid(), "memory_used_bytes": 4 * 2**30, "utilization_pct": 61.0}]}, fh)
os.replace(path + ".tmp", path)
time.sleep(float(sys.argv[2]))
"""


class Served:
    """A store file, a gRPC server answering GpuInterface from it, and a client stub."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.db = tmp / "store.db"
        open_store(str(self.db)).close()  # created now, so the server's threads only open it
        self._local = threading.local()
        self._opened: list[Any] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_GpuInterfaceServicer_to_server(GpuServicer(self._store), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.GpuInterfaceStub(self.channel)
        self.procs: list[subprocess.Popen[str]] = []

    def _store(self) -> Any:
        """The calling thread's own connection, as `cuectl serve --opencue` gives each."""
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = open_store(str(self.db), create=False)
            with self._lock:
                self._opened.append(store)
        return store

    def cuectl(self, *args: str, fake: Path | None = None) -> str:
        env = subprocess_env(**({"CUECTL_FAKE_GPUS": str(fake)} if fake else {}))
        res = subprocess.run(
            [*cuectl_cmd(), "--db", str(self.db), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=self.tmp,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    def start_worker(self, fake: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [
                *cuectl_cmd(),
                "--db",
                str(self.db),
                "worker",
                "--poll",
                "0.05",
                "--lease-timeout",
                "40",
                "--sample-interval",
                str(INTERVAL),
            ],
            env=subprocess_env(CUECTL_FAKE_GPUS=str(fake), CUECTL_KILL_GRACE="0.5"),
            cwd=self.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def frame(self, ref: str) -> dict[str, Any]:
        store = open_store(str(self.db), create=False)
        try:
            return store.get_frame(store.frame_id(ref))
        finally:
            store.close()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)
        self.channel.close()
        self.server.stop(0).wait(10)
        for store in self._opened:
            store.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path)
    yield s
    s.close()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def fake_host(tmp: Path, devices: list[dict[str, Any]]) -> tuple[Path, Path]:
    """A fake GPU file for HOST whose devices' live values frames can write (its state dir)."""
    state = tmp / "gpu-state"
    state.mkdir()
    path = tmp / "gpus.yaml"
    path.write_text(yaml.safe_dump({"host": HOST, "devices": devices, "state_dir": str(state)}))
    return path, state


def gpu_job(state: Path, seconds: float) -> dict[str, Any]:
    return {
        "name": "j1",
        "layers": [
            {
                "name": "main",
                "gpus": 1,
                "gpu_vendor": "NVIDIA",
                "gpu_models": ["A100"],
                "gpu_memory_min": "40G",
                "retries": 0,
                "command": [sys.executable, "-c", USE_GPU, str(state), str(seconds)],
            }
        ],
    }


def submit(served: Served, spec: dict[str, Any]) -> int:
    path = served.tmp / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return int(served.cuectl("submit", str(path)).strip())


def host_devices(served: Served) -> list[Any]:
    return list(served.stub.GetHostGpus(pb.GetHostGpusRequest(host=HOST), timeout=10).devices)


def running_on_gpu(served: Served) -> Any:
    """The device a running frame holds, once the worker has sampled the frame's use of it."""
    try:
        devices = host_devices(served)
    except grpc.RpcError as exc:  # the worker has not registered the host yet
        assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
        return None
    held = [d for d in devices if d.holder_kind == "frame"]
    return held[0] if held and held[0].utilization_pct == 61.0 else None


def test_a_hosts_devices_with_live_values_and_the_frame_holding_one(served: Served) -> None:
    fake, state = fake_host(served.tmp, [a100(0x3B), a100(0x5E)])
    submit(served, gpu_job(state, 30.0))
    served.start_worker(fake)
    held = wait_for(lambda: running_on_gpu(served), "the frame's use of its device")
    frame = served.frame("j1/0001-main")
    devices = host_devices(served)
    assert [d.index for d in devices] == [0, 1]
    free = next(d for d in devices if d.id != held.id)

    assert held.holder == f"frame {frame['id']} (job j1)" and held.holder_frame_id == str(frame["id"])
    assert [held.uuid] == frame["gpu_uuids"] and held.id == held.uuid
    assert held.memory_used_bytes == 4 * GIB and held.HasField("memory_used_bytes")
    assert abs(held.sampled_at - time.time()) < 10
    # The other device: free, and its (idle) values current, so set: 0 is a reading here.
    assert (free.holder, free.holder_kind, free.holder_frame_id) == ("", "", "")
    assert free.HasField("utilization_pct") and free.utilization_pct == 0.0 and free.memory_used_bytes == 0
    for d in devices:  # what discovery found, from the fake GPU file
        assert (d.vendor, d.model, d.memory_bytes) == ("NVIDIA", "NVIDIA A100-SXM4-80GB", 80 * GIB)
        assert d.driver_version == "550.54.15" and d.attributes["compute_capability"] == "8.0"
        assert d.attributes["backend"] == "fake" and d.cuda_version == "" and d.metal_version == ""
    assert [d.pci_bus for d in devices] == ["0000:3b:00.0", "0000:5e:00.0"]
    response = served.stub.GetHostGpus(pb.GetHostGpusRequest(host=HOST), timeout=10)
    assert response.sample_interval_s == INTERVAL

    # The frame's own current use, through its id.
    usage = served.stub.GetFrameGpuUsage(pb.GetFrameGpuUsageRequest(frame_id=str(frame["id"])), timeout=10)
    assert [(u.device_id, u.utilization_pct, u.memory_used_bytes) for u in usage.current] == [(held.id, 61.0, 4 * GIB)]
    assert usage.attempt == 1 and usage.frame_id == str(frame["id"])
    assert [u.device_id for u in usage.summary] == [held.id] and usage.summary[0].utilization_max_pct == 61.0


def test_a_finished_frames_usage_and_stale_live_values(served: Served) -> None:
    fake, state = fake_host(served.tmp, [a100(0x3B)])
    submit(served, gpu_job(state, 3.0))
    worker = served.start_worker(fake)
    wait_for(lambda: running_on_gpu(served), "the frame's use of its device")
    frame = wait_for(lambda: (f := served.frame("j1/0001-main"))["state"] == "SUCCEEDED" and f, "the frame's end")

    usage = served.stub.GetFrameGpuUsage(pb.GetFrameGpuUsageRequest(frame_id="j1/0001-main"), timeout=10)
    assert usage.frame_id == str(frame["id"]) and usage.attempt == 1
    assert list(usage.current) == []  # it runs no more: nothing is current
    (device,) = usage.summary
    assert device.device_id == frame["gpu_uuids"][0]
    assert device.utilization_max_pct == 61.0 and device.memory_peak_bytes == 4 * GIB
    assert 3.0 <= device.gpu_seconds <= 15.0
    # The total is the attempt's record, exactly; one device's mean from its series agrees.
    (record,) = frame["attempt_history"]
    assert usage.total.device_id == ""
    assert usage.total.utilization_mean_pct == record["gpu_util_mean_pct"]
    assert usage.total.utilization_max_pct == record["gpu_util_max_pct"] == 61.0
    assert usage.total.memory_peak_bytes == record["gpu_memory_peak_bytes"]
    assert usage.total.gpu_seconds == record["gpu_seconds"]
    assert abs(device.utilization_mean_pct - record["gpu_util_mean_pct"]) <= 0.1, (device, record)
    assert abs(device.gpu_seconds - record["gpu_seconds"]) <= 0.1

    # The worker dies (a clean stop would sign the host off, clearing its live values): two
    # sampling intervals on, its last values are no longer current.
    worker.kill()
    worker.communicate(timeout=30)
    time.sleep(3 * INTERVAL)
    (idle,) = host_devices(served)
    assert not idle.HasField("utilization_pct") and not idle.HasField("memory_used_bytes")
    assert idle.sampled_at > 0 and time.time() - idle.sampled_at >= 2 * INTERVAL
    assert idle.holder == ""


def test_a_layers_gpu_request_by_name_and_by_id(served: Served) -> None:
    job_id = submit(
        served,
        {
            "name": "render",
            "layers": [
                {
                    "name": "beauty",
                    "command": ["true"],
                    "gpus": 2,
                    "gpu_vendor": "nvidia",
                    "gpu_models": ["A100", "RTX 4090"],
                    "gpu_memory_min": "24G",
                },
                {"name": "comp", "command": ["true"]},
            ],
        },
    )
    answer = served.stub.GetLayerGpuRequest(pb.GetLayerGpuRequestRequest(job="render", layer="beauty"), timeout=10)
    assert answer.job_id == str(job_id)
    request = answer.request
    assert (request.gpus, request.gpu_vendor, list(request.gpu_models_allowed), request.min_gpu_memory_bytes) == (
        2,
        "NVIDIA",
        ["A100", "RTX 4090"],
        24 * GIB,
    )
    by_id = served.stub.GetLayerGpuRequest(
        pb.GetLayerGpuRequestRequest(job=str(job_id), layer=answer.layer_id), timeout=10
    )
    assert by_id == answer
    cpu = served.stub.GetLayerGpuRequest(pb.GetLayerGpuRequestRequest(job="render", layer="comp"), timeout=10)
    assert cpu.request == pb.LayerGpuRequest() and cpu.layer_id != answer.layer_id


@pytest.mark.parametrize(
    "call, code, says",
    [
        (lambda s: s.GetHostGpus(pb.GetHostGpusRequest(host="nosuchhost"), timeout=10), "NOT_FOUND", "nosuchhost"),
        (
            lambda s: s.GetFrameGpuUsage(pb.GetFrameGpuUsageRequest(frame_id="424242"), timeout=10),
            "NOT_FOUND",
            "424242",
        ),
        (
            lambda s: s.GetFrameGpuUsage(pb.GetFrameGpuUsageRequest(frame_id="render/0099-beauty"), timeout=10),
            "NOT_FOUND",
            "0099-beauty",
        ),
        (
            lambda s: s.GetLayerGpuRequest(pb.GetLayerGpuRequestRequest(job="nosuchjob", layer="x"), timeout=10),
            "NOT_FOUND",
            "nosuchjob",
        ),
        (
            lambda s: s.GetLayerGpuRequest(pb.GetLayerGpuRequestRequest(job="render", layer="nosuchlayer"), timeout=10),
            "NOT_FOUND",
            "nosuchlayer",
        ),
        (lambda s: s.GetHostGpus(pb.GetHostGpusRequest(host=" "), timeout=10), "INVALID_ARGUMENT", "host: required"),
        (
            lambda s: s.GetFrameGpuUsage(pb.GetFrameGpuUsageRequest(frame_id="not a frame"), timeout=10),
            "INVALID_ARGUMENT",
            "JOB/FRAME",
        ),
    ],
)
def test_unknown_or_malformed_names_are_grpc_errors(served: Served, call: Any, code: str, says: str) -> None:
    submit(served, {"name": "render", "layers": [{"name": "beauty", "command": ["true"], "range": "1-3"}]})
    with pytest.raises(grpc.RpcError) as caught:
        call(served.stub)
    assert caught.value.code() == getattr(grpc.StatusCode, code)
    assert says in caught.value.details()


def _register(served: Served, name: str, gpus: list[dict[str, Any]], live: dict[str, Any], *, ago: float = 0.0) -> None:
    """A host as its worker registers it and publishes its live document, ``ago`` seconds ago."""
    store = open_store(str(served.db), create=False)
    try:
        now = store.clock() - ago
        store.register_host(HostInfo(name=name, cores=8, memory_bytes=64 * GIB, gpus=gpus), now=now)
        store.heartbeat(
            name,
            [],
            now=now,
            lease_s=600.0,
            live={"at": now, **live, "devices": [{**d, "sampled_at": now} for d in live["devices"]]},
        )
    finally:
        store.close()


def _gpu(index: int, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "vendor": "NVIDIA",
        "model": "NVIDIA RTX A6000",
        "backend": "fake",
        "memory_total_bytes": 48 * GIB,
        **extra,
    }


def test_leases_other_programs_and_api_versions_as_the_worker_published_them(served: Served) -> None:
    busy = {"utilization_pct": 40.0, "memory_used_bytes": 6 * GIB, "memory_free_bytes": 42 * GIB, "frame_id": None}
    idle = {"utilization_pct": 0.0, "memory_used_bytes": 0, "memory_free_bytes": 48 * GIB, "frame_id": None}
    _register(
        served,
        "ws",
        [_gpu(0, api_version="CUDA 12.4"), _gpu(1), _gpu(2), _gpu(3)],
        {
            "sample_interval_s": 5.0,
            "devices": [
                {"uuid": "GPU-0", **idle},
                {"uuid": "GPU-1", **idle},
                {"uuid": "GPU-2", **busy},
                {"uuid": "GPU-3", **busy},
            ],
            "dispatch": {
                "devices": {
                    "GPU-1": {"state": "lease", "holder": "cuectl run pid 4242 (alice)", "frame_id": None},
                    "GPU-2": {"state": "nimby", "holder": "in use by another process: 6.0 GiB used", "frame_id": None},
                    # A frame the worker last described that the store no longer runs: it holds nothing.
                    "GPU-3": {"state": "frame", "holder": "frame 999 (job old)", "frame_id": 999},
                }
            },
        },
    )
    _register(
        served,
        "mac",
        [
            {
                "index": 0,
                "uuid": "apple-0",
                "vendor": "Apple",
                "model": "Apple M2 Max",
                "backend": "apple",
                "api_version": "Metal 3",
                "unified_memory": True,
                "gpu_cores": 38,
            }
        ],
        {"sample_interval_s": 5.0, "devices": []},
    )
    devices = list(served.stub.GetHostGpus(pb.GetHostGpusRequest(host="ws"), timeout=10).devices)
    assert [(d.holder_kind, d.holder) for d in devices] == [
        ("", ""),
        ("lease", "cuectl run pid 4242 (alice)"),
        ("other", "in use by another process: 6.0 GiB used"),
        # Not the dead frame: a current busy sample taken while no frame held it.
        ("other", "another process (6.0 GiB used, 40 % busy)"),
    ]
    assert all(d.holder_frame_id == "" for d in devices)
    assert (devices[0].cuda_version, devices[0].api_version, devices[0].metal_version) == ("12.4", "CUDA 12.4", "")
    (mac,) = served.stub.GetHostGpus(pb.GetHostGpusRequest(host="mac"), timeout=10).devices
    assert (mac.metal_version, mac.cuda_version, mac.api_version) == ("Metal 3", "", "Metal 3")
    assert mac.attributes["unified_memory"] == "true" and mac.attributes["gpu_cores"] == "38"
    assert mac.memory_bytes == 0 and mac.sampled_at == 0.0 and not mac.HasField("utilization_pct")


def test_a_down_hosts_published_leases_are_not_believed(served: Served) -> None:
    """A host whose worker went silent (DOWN) says nothing current: neither its values nor
    the leases it last saw."""
    _register(
        served,
        "gone",
        [_gpu(0)],
        {
            "sample_interval_s": 5.0,
            "devices": [{"uuid": "GPU-0", "utilization_pct": 90.0, "memory_used_bytes": 9 * GIB, "frame_id": None}],
            "dispatch": {"devices": {"GPU-0": {"state": "lease", "holder": "cuectl run pid 1 (bob)"}}},
        },
        ago=3600.0,
    )
    (device,) = served.stub.GetHostGpus(pb.GetHostGpusRequest(host="gone"), timeout=10).devices
    assert (device.holder_kind, device.holder) == ("", "")
    assert not device.HasField("utilization_pct") and device.sampled_at > 0


def test_the_example_client_reads_a_host_a_frame_and_a_layer(served: Served) -> None:
    fake, state = fake_host(served.tmp, [a100(0x3B)])
    submit(served, gpu_job(state, 1.0))
    served.start_worker(fake)
    wait_for(lambda: served.frame("j1/0001-main")["state"] == "SUCCEEDED", "the frame's end")
    res = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "opencue" / "gpu_client.py"),
            "--server",
            f"127.0.0.1:{served.port}",
            "--host",
            HOST,
            "--frame",
            "j1/0001-main",
            "--job",
            "j1",
            "--layer",
            "main",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(CUEBOT_HOSTS="nowhere"),
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("gpu 0 NVIDIA A100-SXM4-80GB (NVIDIA) ") and "/80.0 GiB" in lines[0], lines
    assert lines[0].endswith("holder: free"), lines
    assert lines[1].startswith("frame ") and " attempt 1 on GPU-" in lines[1] and "max 61%" in lines[1], lines
    assert "peak 4.0 GiB" in lines[1], lines
    assert lines[2] == "layer main: 1 gpus, vendor NVIDIA, models A100, at least 40 GiB each", lines
    assert len(lines) == 3, lines


def test_cuectl_serve_opencue_serves_the_gpu_service_beside_opencues(cuebot: Any, db_path: Path) -> None:
    """The GPU service is not only a class: `cuectl serve --opencue` answers it on the same
    port as OpenCue's services, from the same store."""
    server = cuebot()
    store = open_store(str(db_path), create=False)
    try:
        store.register_host(
            HostInfo(
                "gpu-01",
                cores=8.0,
                memory_bytes=32 * 1024**3,
                gpus=[
                    {
                        "index": 0,
                        "uuid": "GPU-x",
                        "vendor": "NVIDIA",
                        "model": "NVIDIA L40S",
                        "backend": "fake",
                        "memory_total_bytes": 48 * 1024**3,
                    }
                ],
            ),
            now=time.time(),
        )
    finally:
        store.close()
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.GpuInterfaceStub(channel)
        [device] = stub.GetHostGpus(pb.GetHostGpusRequest(host="gpu-01"), timeout=10).devices
        assert (device.uuid, device.model, device.memory_bytes) == ("GPU-x", "NVIDIA L40S", 48 * 1024**3)
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetHostGpus(pb.GetHostGpusRequest(host="nope"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
