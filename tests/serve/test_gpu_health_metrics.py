"""/metrics for sick GPUs (docs/gpu-health.md): ``cuectl_gpu_drained`` per device out of
service and ``cuectl_gpu_xid_total`` per Xid code, from a real SQLite store with device
states and GPU events recorded as a worker records them; parsed back with
prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from cuectl.sched.store import GpuEvent, HostInfo, open_store
from cuectl.serve.metrics import render
from cuectl.top import snapshot

NOW = 1_700_000_000.0
GPUS = [{"index": i, "uuid": f"GPU-{i}", "vendor": "NVIDIA", "model": "T4", "backend": "fake"} for i in range(3)]


def test_drained_devices_and_xid_counts(tmp_path):
    store = open_store(str(tmp_path / "s.db"))
    store.register_host(HostInfo(name="n1", cores=4, memory_bytes=1 << 33, gpus=GPUS), now=NOW)
    store.set_device_state("n1", "GPU-0", "drained", "Xid 79: GPU has fallen off the bus", now=NOW)
    store.set_device_state("n1", "GPU-1", "lost", "GPU is lost", now=NOW)
    store.drain_device("n1", "2", reason="maintenance", now=NOW)
    store.undrain_device("n1", "2", now=NOW + 1)
    store.record_gpu_events(
        "n1",
        [
            GpuEvent(kind="xid", at=NOW, device_uuid="GPU-0", detail="Xid 79: GPU has fallen off the bus"),
            GpuEvent(kind="xid", at=NOW, device_uuid="GPU-0", detail="Xid 79: GPU has fallen off the bus"),
            GpuEvent(kind="xid", at=NOW, device_uuid="GPU-1", detail="Xid 13: graphics engine exception"),
        ],
    )
    body, _ = render(store, snapshot=snapshot(store, now=NOW))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples[("cuectl_gpu_drained", (("host", "n1"), ("state", "drained"), ("uuid", "GPU-0")))] == 1.0
    assert samples[("cuectl_gpu_drained", (("host", "n1"), ("state", "lost"), ("uuid", "GPU-1")))] == 1.0
    assert not any(name == "cuectl_gpu_drained" and ("uuid", "GPU-2") in labels for name, labels in samples)
    assert samples[("cuectl_gpu_xid_total", (("xid", "79"),))] == 2.0
    assert samples[("cuectl_gpu_xid_total", (("xid", "13"),))] == 1.0
    store.close()
