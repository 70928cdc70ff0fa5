"""Device isolation: the environment that confines a child process to its leased devices.

Used for ``cuectl run`` commands, ``cuectl.lease()`` callers and the worker's frames alike
(DESIGN §4), so all three hide the same devices the same way.
"""

from __future__ import annotations

import re
from typing import Collection, Sequence

from cuectl.gpu.device import Device, normalize_vendor

#: Value that hides every device for CUDA, HIP and ROCr. An invalid index ends each
#: runtime's device list there (CUDA: documented in the programming guide's environment
#: variables; ROCr: ``RvdFilter`` stops at a negative index and surfaces zero devices; HIP
#: mirrors CUDA). Chosen over the empty string, which the runtimes also read as "none",
#: because tools and shell snippets often treat an empty variable as unset
#: (``${CUDA_VISIBLE_DEVICES:-0}``) and would un-hide the GPUs.
HIDE_ALL = "-1"
#: nvidia-container-runtime: ``void`` = inject no GPU into a container started from here.
NVIDIA_HIDE_ALL = "void"
_ROCR_UUID = re.compile(r"GPU-[0-9A-Fa-f]{1,16}")
#: Vendors whose devices an environment variable can hide (Apple and Intel: none).
_HIDEABLE = frozenset({"NVIDIA", "AMD"})


def _vendor_index(device: Device) -> int:
    """The device's index within its vendor's runtime (``Device.index`` is host-wide)."""
    value = device.attributes.get("vendor_index") if device.attributes else None
    return value if isinstance(value, int) and not isinstance(value, bool) else device.index


def _cuda_id(device: Device) -> str:
    # MIG instances have no index of their own in CUDA: only their UUID selects them.
    # Whole cards: the index, which with CUDA_DEVICE_ORDER=PCI_BUS_ID is NVML's index.
    return device.uuid if device.mig_parent_uuid else str(_vendor_index(device))


def _rocr_id(device: Device) -> str:
    # ROCr takes "GPU-<unique id>" tokens (robust against enumeration order); else the index.
    return device.uuid if _ROCR_UUID.fullmatch(device.uuid) else str(_vendor_index(device))


def isolation_env(devices: Sequence[Device], *, all_vendors_present: Collection[str]) -> dict[str, str]:
    """The variables that confine a child process to ``devices`` (DESIGN §4).

    ``all_vendors_present`` are the vendors of every GPU on the host: a vendor's variables
    are set whenever the host has such GPUs, so a process leased none of them sees them
    hidden. A process leased no device at all gets the NVIDIA and AMD variables on every
    host, even one where discovery found no GPU: discovery can miss GPUs that CUDA or ROCm
    would still find (a container without the driver's NVML library), and hiding devices
    that do not exist costs nothing. Per vendor:

    - NVIDIA: ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; ``CUDA_VISIBLE_DEVICES`` = indices (MIG
      instances by UUID) or ``-1``; ``NVIDIA_VISIBLE_DEVICES`` = UUIDs or ``void``.
    - AMD: ``ROCR_VISIBLE_DEVICES`` = UUIDs (indices where the backend has none) or ``-1``;
      ``HIP_VISIBLE_DEVICES`` = ``0..n-1`` — HIP numbers the devices ROCr left visible, so
      repeating ROCr's indices there would hide them — or ``-1``. Setting it also keeps HIP
      from reading ``CUDA_VISIBLE_DEVICES`` (meant for NVIDIA) on a mixed host.
    - Apple, Intel: nothing — they cannot be isolated by environment; usage is reported only.

    Always: ``CUE_GPUS`` (count), ``CUE_GPU_CORES`` (host-wide indices as in `gpu list`),
    ``CUE_GPU_UUIDS``.
    """
    vendors = {normalize_vendor(v) or v for v in all_vendors_present} | {d.vendor for d in devices}
    if not devices:
        vendors |= _HIDEABLE
    env = {
        "CUE_GPUS": str(len(devices)),
        "CUE_GPU_CORES": ",".join(str(d.index) for d in devices),
        "CUE_GPU_UUIDS": ",".join(d.uuid for d in devices),
    }
    nvidia = [d for d in devices if d.vendor == "NVIDIA"]
    if "NVIDIA" in vendors:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(_cuda_id(d) for d in nvidia) or HIDE_ALL
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(d.uuid for d in nvidia) or NVIDIA_HIDE_ALL
    amd = [d for d in devices if d.vendor == "AMD"]
    if "AMD" in vendors:
        env["ROCR_VISIBLE_DEVICES"] = ",".join(_rocr_id(d) for d in amd) or HIDE_ALL
        env["HIP_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(amd))) or HIDE_ALL
    return env


def isolation_key(devices: Sequence[Device], *, all_vendors_present: Collection[str]) -> tuple[object, ...]:
    """Everything :func:`isolation_env` reads of its arguments: equal keys, equal
    environments (a worker keeps the environment its frames share under it)."""
    return (
        frozenset(all_vendors_present),
        tuple((d.uuid, d.index, _vendor_index(d), d.vendor, d.mig_parent_uuid) for d in devices),
    )
