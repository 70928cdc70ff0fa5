"""``isolation_env``: what a leased (or GPU-less) process may see, per vendor (DESIGN §4)."""

from __future__ import annotations

from cuectl.gpu.device import Device
from cuectl.run.lease import isolation_env


def dev(
    index: int,
    vendor: str = "NVIDIA",
    *,
    uuid: str | None = None,
    vendor_index: int | None = None,
    mig_parent: str | None = None,
) -> Device:
    return Device(
        index=index,
        uuid=uuid or f"GPU-{vendor}-{index}",
        vendor=vendor,
        model="m",
        backend="fake",
        mig_parent_uuid=mig_parent,
        attributes={} if vendor_index is None else {"vendor_index": vendor_index},
    )


def test_nvidia_devices_by_index_and_uuid():
    env = isolation_env([dev(1), dev(3)], all_vendors_present={"NVIDIA"})
    assert env == {
        "CUE_GPUS": "2",
        "CUE_GPU_CORES": "1,3",
        "CUE_GPU_UUIDS": "GPU-NVIDIA-1,GPU-NVIDIA-3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "1,3",
        "NVIDIA_VISIBLE_DEVICES": "GPU-NVIDIA-1,GPU-NVIDIA-3",
    }


def test_no_devices_on_a_gpu_host_hides_them_all():
    env = isolation_env([], all_vendors_present={"NVIDIA", "AMD"})
    assert env["CUE_GPUS"] == "0" and env["CUE_GPU_CORES"] == "" and env["CUE_GPU_UUIDS"] == ""
    assert env["CUDA_VISIBLE_DEVICES"] == "-1"  # not "": `${CUDA_VISIBLE_DEVICES:-0}` must not undo it
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["ROCR_VISIBLE_DEVICES"] == "-1"
    assert env["HIP_VISIBLE_DEVICES"] == "-1"


def test_no_devices_hides_every_vendor_even_where_discovery_found_no_gpu():
    # A container whose driver library is missing finds no GPU, yet the devices may be
    # there: a CPU frame must not see them.
    assert isolation_env([], all_vendors_present=()) == {
        "CUE_GPUS": "0",
        "CUE_GPU_CORES": "",
        "CUE_GPU_UUIDS": "",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "-1",
        "NVIDIA_VISIBLE_DEVICES": "void",
        "ROCR_VISIBLE_DEVICES": "-1",
        "HIP_VISIBLE_DEVICES": "-1",
    }


def test_mig_instances_are_selected_by_uuid():
    mig = dev(2, uuid="MIG-11111111-2222-3333-4444-555555555555", mig_parent="GPU-NVIDIA-0")
    env = isolation_env([mig], all_vendors_present={"NVIDIA"})
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-11111111-2222-3333-4444-555555555555"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "MIG-11111111-2222-3333-4444-555555555555"


def test_amd_uses_rocr_uuids_and_renumbers_hip():
    cards = [
        dev(4, "AMD", uuid="GPU-a1b2c3d4e5f60718", vendor_index=0),
        dev(6, "AMD", uuid="GPU-0011223344556677", vendor_index=2),
    ]
    env = isolation_env(cards, all_vendors_present={"AMD"})
    assert env["ROCR_VISIBLE_DEVICES"] == "GPU-a1b2c3d4e5f60718,GPU-0011223344556677"
    # HIP numbers what ROCr left visible: 0 and 1, not the host's 4 and 6.
    assert env["HIP_VISIBLE_DEVICES"] == "0,1"
    assert env["CUE_GPU_CORES"] == "4,6"
    assert "CUDA_VISIBLE_DEVICES" not in env  # no NVIDIA GPU on this host


def test_amd_without_rocr_style_uuid_falls_back_to_its_vendor_index():
    env = isolation_env([dev(5, "AMD", uuid="amd-card-x", vendor_index=1)], all_vendors_present={"AMD"})
    assert env["ROCR_VISIBLE_DEVICES"] == "1"


def test_mixed_host_uses_vendor_indices_and_hides_the_other_vendor():
    nvidia = dev(0, "NVIDIA", vendor_index=0)
    amd = dev(2, "AMD", uuid="GPU-00000000000000aa", vendor_index=0)  # host index 2, ROCr's first
    env = isolation_env([amd], all_vendors_present={"NVIDIA", "AMD"})
    assert env["CUDA_VISIBLE_DEVICES"] == "-1" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["ROCR_VISIBLE_DEVICES"] == "GPU-00000000000000aa"
    env = isolation_env([nvidia], all_vendors_present={"nvidia", "amd"})  # vendor spelling normalised
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["ROCR_VISIBLE_DEVICES"] == "-1"


def test_apple_cannot_be_isolated_and_gets_only_the_cue_variables():
    env = isolation_env([dev(0, "Apple", uuid="apple-m3")], all_vendors_present={"Apple"})
    assert env == {"CUE_GPUS": "1", "CUE_GPU_CORES": "0", "CUE_GPU_UUIDS": "apple-m3"}
