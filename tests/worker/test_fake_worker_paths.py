"""GPU paths that only the fake format's newer keys can reach, through real `cuectl worker`
runs: MIG instances, unified memory, unhealthy devices, per-vendor numbering and PCI order,
and what a GPU-less process sees on a host where discovery found no GPU."""

from __future__ import annotations

import json
import sys

from farmlib import A100, MI100, RTX4090, V100

from cuectl.gpu.fake import default_fake_uuid

MIB = 1024**2
GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
MIG_3G = "MIG-00000000-0000-0000-0000-000000000000"
MIG_1G = "MIG-00000002-0000-0000-0000-000000000002"
HIDDEN = {
    "CUDA_VISIBLE_DEVICES": "-1",
    "NVIDIA_VISIBLE_DEVICES": "void",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "ROCR_VISIBLE_DEVICES": "-1",
    "HIP_VISIBLE_DEVICES": "-1",
    "CUE_GPUS": "0",
}


def layer(name, command, **kw):
    return {"name": name, "command": command, **kw}


def starts_by_layer(farm) -> dict[str, dict[str, str | None]]:
    return {e["env"]["CUE_LAYER"]: e["env"] for e in farm.starts()}


def gpu_index(farm, fake) -> dict[str, int]:
    """uuid -> host-wide index, as `cuectl gpu list` shows it."""
    listed = json.loads(farm.cuectl("gpu", "list", "--json", fake=fake).stdout)["devices"]
    return {d["uuid"]: d["index"] for d in listed}


def test_cpu_frame_on_a_host_without_gpus_sees_every_gpu_hidden(farm):
    # Discovery found nothing, yet the host may have GPUs it could not see (a container
    # without the driver's NVML library): the frame must see them hidden all the same.
    bare = farm.host("bare", [])
    farm.submit({"name": "cpu", "layers": [layer("c", farm.probe())]})
    res = farm.run_worker(bare)
    assert res.returncode == 0, res.stderr
    (start,) = farm.starts()
    assert {k: start["env"][k] for k in HIDDEN} == HIDDEN


def test_cuectl_run_without_gpus_on_a_host_without_gpus_hides_them(farm):
    bare = farm.host("bare", [])
    show = "import json, os; print(json.dumps(dict(os.environ)))"
    out = farm.cuectl("run", "--gpus", "0", "--", sys.executable, "-c", show, fake=bare)
    env = json.loads(out.stdout)
    assert {k: env.get(k) for k in HIDDEN} == HIDDEN


def test_a_frame_asking_for_a_mig_slice_gets_the_instance_by_uuid(farm):
    fake = farm.host(
        "mig",
        [
            {
                "model": H100,
                "vendor": "NVIDIA",
                "memory": "81559MiB",
                "uuid": "GPU-00000000-0000-0000-0000-0000000000aa",
                "mig": [
                    {"profile": "3g.40gb", "memory": "40448MiB", "uuid": MIG_3G},
                    {"profile": "1g.10gb", "memory": "9984MiB", "uuid": MIG_1G},
                ],
            }
        ],
    )
    job = farm.submit(
        {
            "name": "mig",
            "layers": [
                layer("big", farm.probe(), gpus=1, gpu_models=["H100"], gpu_memory_min="20G"),
                layer("small", farm.probe(), gpus=1, gpu_memory_min="8G"),  # the smallest instance that fits
                layer("whole", farm.probe(), gpus=1, gpu_memory_min="60G"),  # the card itself is not leasable
            ],
        }
    )
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    env = starts_by_layer(farm)
    assert set(env) == {"big", "small"}
    for name, mig, memory in (("big", MIG_3G, 40448 * MIB), ("small", MIG_1G, 9984 * MIB)):
        e = env[name]
        # CUDA selects a MIG instance only by its UUID; the container runtime takes it too.
        assert (e["CUDA_VISIBLE_DEVICES"], e["NVIDIA_VISIBLE_DEVICES"], e["CUE_GPU_UUIDS"]) == (mig, mig, mig)
        assert e["CUE_GPU_MEMORY"] == str(memory)
    states = {f["layer"]: f["state"] for f in farm.frames(job)}
    assert states == {"big": "SUCCEEDED", "small": "SUCCEEDED", "whole": "WAITING"}


def test_memory_request_on_unified_memory_compares_the_hosts_memory(farm):
    fake = farm.host(
        "mac", [{"model": "Apple M3 Max", "vendor": "Apple", "memory": "64GiB", "unified_memory": True}], state=True
    )
    # Other programs hold 60 GiB of the machine's memory. A discrete card with 4 GiB free
    # would refuse a 32G frame now; unified memory's free share is unknown (apple backend),
    # so only the total counts.
    (farm.tmp / "mac-state" / "0.json").write_text(json.dumps({"utilization_pct": 10, "memory_used_bytes": 60 * GIB}))
    job = farm.submit(
        {
            "name": "metal",
            "layers": [
                layer("fits", farm.probe(), gpus=1, gpu_memory_min="32G"),
                layer("too-big", farm.probe(), gpus=1, gpu_memory_min="96G"),
            ],
        }
    )
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    env = starts_by_layer(farm)
    assert set(env) == {"fits"}
    e = env["fits"]
    assert e["CUE_GPU_UUIDS"] == default_fake_uuid("mac", 0) and e["CUE_GPU_MEMORY"] == str(64 * GIB)
    assert e["CUDA_VISIBLE_DEVICES"] is None  # an Apple GPU cannot be isolated; no NVIDIA GPU here
    listed = json.loads(farm.cuectl("gpu", "list", "--json", fake=fake).stdout)["devices"]
    assert [(d["unified_memory"], d["memory_free_bytes"]) for d in listed] == [(True, None)]
    frames = {f["layer"]: f["state"] for f in farm.frames(job)}
    assert frames == {"fits": "SUCCEEDED", "too-big": "WAITING"}
    assert "memory" in farm.job(job)["pending_reason"]


def test_frames_never_land_on_an_unhealthy_device(farm):
    fake = farm.host(
        "sick",
        [
            dict(V100, healthy=False, error="GPU has fallen off the bus"),
            V100,
            dict(V100, error="Xid 48: double-bit ECC error"),
        ],
    )
    healthy = default_fake_uuid("sick", 1)
    job = farm.submit(
        {
            "name": "sick",
            "layers": [
                layer("one", farm.probe("--sleep", "0.2"), gpus=1, range="1-4"),
                layer("pair", farm.probe(), gpus=2),  # only one healthy device: never runs
            ],
        }
    )
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    starts = farm.starts()
    assert len(starts) == 4
    assert {e["env"]["CUE_GPU_UUIDS"] for e in starts} == {healthy}
    assert list(gpu_index(farm, fake)) == [healthy]
    states = {(f["layer"], f["state"]) for f in farm.frames(job)}
    assert states == {("one", "SUCCEEDED"), ("pair", "WAITING")}


def test_devices_are_numbered_per_vendor_through_a_worker(farm):
    # An AMD card listed first must not shift the NVIDIA numbering: CUDA counts NVIDIA only.
    fake = farm.host("mixed", [MI100, V100, A100])
    farm.submit(
        {
            "name": "mixed",
            "layers": [
                layer("amd", farm.probe(), gpus=1, gpu_vendor="AMD"),
                layer("v100", farm.probe(), gpus=1, gpu_models=["V100"]),
                layer("a100", farm.probe(), gpus=1, gpu_models=["A100"]),
            ],
        }
    )
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    env = starts_by_layer(farm)
    assert (env["v100"]["CUDA_VISIBLE_DEVICES"], env["a100"]["CUDA_VISIBLE_DEVICES"]) == ("0", "1")
    assert (env["amd"]["ROCR_VISIBLE_DEVICES"], env["amd"]["HIP_VISIBLE_DEVICES"]) == ("0", "0")
    assert env["amd"]["CUDA_VISIBLE_DEVICES"] == "-1" and env["v100"]["ROCR_VISIBLE_DEVICES"] == "-1"
    # Host-wide numbers follow auto discovery (NVIDIA, then AMD) and agree with `gpu list`.
    index = gpu_index(farm, fake)
    assert {name: e["CUE_GPU_CORES"] for name, e in env.items()} == {"v100": "0", "a100": "1", "amd": "2"}
    assert {name: str(index[e["CUE_GPU_UUIDS"]]) for name, e in env.items()} == {"v100": "0", "a100": "1", "amd": "2"}


def test_a_vendors_devices_follow_pci_bus_order_through_a_worker(farm):
    # CUDA_DEVICE_ORDER=PCI_BUS_ID numbers cards by bus id, whatever order a file lists them in.
    fake = farm.host("pci", [dict(A100, pci_bus_id="0000:81:00.0"), dict(V100, pci_bus_id="0000:1a:00.0"), RTX4090])
    farm.submit(
        {
            "name": "pci",
            "layers": [
                layer("a100", farm.probe(), gpus=1, gpu_models=["A100"]),
                layer("v100", farm.probe(), gpus=1, gpu_models=["V100"]),
                layer("4090", farm.probe(), gpus=1, gpu_models=["RTX 4090"]),
            ],
        }
    )
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    env = starts_by_layer(farm)
    assert {name: e["CUDA_VISIBLE_DEVICES"] for name, e in env.items()} == {"v100": "0", "a100": "1", "4090": "2"}
    assert {name: e["CUE_GPU_CORES"] for name, e in env.items()} == {"v100": "0", "a100": "1", "4090": "2"}
