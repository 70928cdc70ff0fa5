"""NVML's health reading (docs/gpu-health.md) through ``NvmlBackend.health``, over the
pynvml stand-in of tests/gpu/nvml_double.py extended here with the calls health makes
(pynvml's names and conventions: ``NVMLError.value``, ``nvmlEventSetWait(set, 0)`` raising
TIMEOUT when nothing is pending, ``eventData`` the Xid, ``nvmlDeviceGetRemappedRows`` as
(correctable, uncorrectable, pending, failure)). A real GPU runs the same path in
scripts/gpu-e2e.sh."""

from __future__ import annotations

from types import SimpleNamespace

from nvml_double import NOT_SUPPORTED, FakeGpu, FakeNvml, NVMLError

from cuectl.gpu.nvml import ERROR_GPU_IS_LOST, ERROR_UNKNOWN, NvmlBackend

TIMEOUT = 10


class HealthNvml(FakeNvml):
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, gpus, **kw) -> None:
        super().__init__(gpus, **kw)
        self.ecc = {g.uuid: 0 for g in gpus}
        self.pending = {g.uuid: 0 for g in gpus}
        self.rows: dict[str, object] = {g.uuid: (0, 0, 0, 0) for g in gpus}
        self.fail: dict[str, int] = {}  # uuid -> error every health query raises
        self.queue: list[tuple[tuple, int]] = []
        self.registered: list[tuple] = []

    def _health_call(self, handle, value):
        err = self.fail.get(self._gpu(handle).uuid)
        if err is not None:
            raise NVMLError(err)
        if isinstance(value, int) and value < 0:
            raise NVMLError(NOT_SUPPORTED)
        return value

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        assert (error_type, counter_type) == (1, 0)  # uncorrected, volatile
        return self._health_call(handle, self.ecc[self._gpu(handle).uuid])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle):
        return self._health_call(handle, self.pending[self._gpu(handle).uuid])

    def nvmlDeviceGetRemappedRows(self, handle):
        rows = self.rows[self._gpu(handle).uuid]
        if rows is None:
            raise NVMLError(NOT_SUPPORTED)
        return self._health_call(handle, rows)

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceRegisterEvents(self, handle, kinds, event_set):
        assert (kinds, event_set) == (8, "set")
        self.registered.append(handle)

    def nvmlEventSetWait(self, event_set, timeout_ms):
        assert timeout_ms == 0
        if not self.queue:
            raise NVMLError(TIMEOUT)
        handle, xid = self.queue.pop(0)
        return SimpleNamespace(device=handle, eventType=8, eventData=xid, gpuInstanceId=0, computeInstanceId=0)


def box():
    gpus = [
        FakeGpu(uuid=f"GPU-{i}", name="NVIDIA A100-SXM4-80GB", total=80 << 30, bus_id=f"00000000:{i + 10}:00.0")
        for i in range(3)
    ]
    lib = HealthNvml(gpus)
    b = NvmlBackend(lib)
    b.discover()
    return lib, b


def test_a_healthy_box_and_not_supported_is_no_signal():
    lib, b = box()
    lib.ecc["GPU-1"] = -1  # NOT_SUPPORTED (a consumer card has no ECC)
    lib.rows["GPU-1"] = None
    health = b.health(["GPU-0", "GPU-1", "GPU-x"])
    assert set(health) == {"GPU-0", "GPU-1"}
    assert all(h.known and h.lost is None and h.xids == () and h.problems == () for h in health.values())
    assert len(lib.registered) == 3  # every card registered once for Xid events
    b.health(["GPU-0"])
    assert len(lib.registered) == 3


def test_xid_events_ecc_pending_and_lost():
    lib, b = box()
    lib.queue = [(("gpu", 2), 79), (("gpu", 0), 13), (("gpu", 2), 48)]
    lib.ecc["GPU-0"] = 2
    lib.pending["GPU-0"] = 1
    lib.rows["GPU-0"] = (0, 1, 1, 0)
    lib.fail["GPU-1"] = ERROR_GPU_IS_LOST
    health = b.health(["GPU-0", "GPU-1", "GPU-2"])
    assert health["GPU-2"].xids == (79, 48) and health["GPU-0"].xids == (13,)
    assert health["GPU-0"].problems == (
        "uncorrectable ECC errors: 2 since the last reset",
        "page retirement pending (needs a reset)",
        "row remapping pending (needs a reset)",
    )
    assert health["GPU-1"].lost == "GPU is lost (NVML: GPU_IS_LOST)"
    assert b.health(["GPU-2"])["GPU-2"].xids == ()  # read once
    lib.fail["GPU-1"] = ERROR_UNKNOWN
    assert b.health(["GPU-1"])["GPU-1"].lost == "NVML answers every query with an unknown error"
    lib.fail["GPU-1"] = NOT_SUPPORTED
    h = b.health(["GPU-1"])["GPU-1"]
    assert (h.known, h.lost) == (False, None)  # nothing supported: no signal either way
