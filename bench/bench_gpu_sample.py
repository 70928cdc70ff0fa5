"""Cost of one GPU sample of 8 devices, per backend. Prints figures; asserts nothing.

    .venv/bin/python bench/bench_gpu_sample.py

- fake: 8 devices with a state_dir (8 small JSON reads);
- smi: a stub ``nvidia-smi`` shell script printing 8 rows, so the figure is the spawn
  cost of our subprocess path plus parsing; ``true`` beside it is the bare spawn peer;
- nvml: the in-process pynvml double of the tests (the backend's own overhead; real NVML
  calls add the driver's time on top);
- the worker's ownership map (run/worker/gpuwatch.py, issue 39): 8 devices with 200
  processes listed (every process, as each interval's sample asks), owned by 8 running
  frames; then with 10 of them foreign, which costs a pass over /proc and the lease
  records. Beside it, the sample itself of those 8 devices with every process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from cuectl.gpu.fake import FakeBackend  # noqa: E402
from cuectl.gpu.nvml import NvmlBackend  # noqa: E402
from cuectl.gpu.smi import SmiBackend  # noqa: E402

N_DEVICES = 8


def timed(fn: Callable[[], object], runs: int, warmup: int = 3) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.95))]


def fake_backend(tmp: Path) -> FakeBackend:
    state = tmp / "state"
    state.mkdir()
    lines = ["host: bench", "state_dir: state", "devices:"]
    for i in range(N_DEVICES):
        lines.append("  - {model: NVIDIA A100-SXM4-80GB, memory: 80GiB}")
        (state / f"{i}.json").write_text(
            json.dumps(
                {
                    "utilization_pct": 10 * i,
                    "memory_used_bytes": i << 30,
                    "processes": [{"pid": 100 + i, "memory_used_bytes": 1 << 30}],
                }
            )
        )
    path = tmp / "gpus.yaml"
    path.write_text("\n".join(lines) + "\n")
    return FakeBackend(path)


def smi_stub(tmp: Path) -> Path:
    """A stub nvidia-smi answering the discovery, sampling and compute-apps queries for 8 GPUs."""
    uuids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(N_DEVICES)]
    data = tmp / "smi"
    data.mkdir()
    (data / "discover").write_text(
        "".join(
            f"{i}, {u}, NVIDIA A100-SXM4-80GB, 81920, 81000, 920, 0, 00000000:{i + 1:02X}:00.0, 550.54.15, 8.0, Disabled\n"
            for i, u in enumerate(uuids)
        )
    )
    (data / "sample").write_text(
        "".join(f"{u}, {i * 10}, {i * 1024}, {81920 - i * 1024}\n" for i, u in enumerate(uuids))
    )
    (data / "apps").write_text("".join(f"{100 + i}, {u}, 1024\n" for i, u in enumerate(uuids)))
    bindir = tmp / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    q = shlex.quote
    script.write_text(f"""#!/bin/sh
case "$*" in
  *--query-gpu=index*) exec /bin/cat {q(str(data / "discover"))} ;;
  *--query-gpu=uuid*) exec /bin/cat {q(str(data / "sample"))} ;;
  *--query-compute-apps*) exec /bin/cat {q(str(data / "apps"))} ;;
esac
exit 2
""")
    script.chmod(0o755)
    return bindir


def crowded_fake(tmp: Path, foreign: int) -> tuple[FakeBackend, dict[int, set[int]]]:
    """8 devices with 25 processes each (200): frame f owns the pids of device f, but
    ``foreign`` of them belong to nobody. Returns the backend and frame -> its pids."""
    state = tmp / f"crowd-{foreign}"
    state.mkdir()
    lines = ["host: bench", f"state_dir: crowd-{foreign}", "devices:"]
    owned: dict[int, set[int]] = {}
    for i in range(N_DEVICES):
        lines.append("  - {model: NVIDIA A100-SXM4-80GB, memory: 80GiB}")
        pids = [10_000 + i * 100 + k for k in range(25)]
        owned[i] = set(pids[: 25 - (foreign // N_DEVICES if i < foreign % N_DEVICES or foreign >= N_DEVICES else 0)])
        procs = [{"pid": p, "memory_used_bytes": 1 << 28, "utilization_pct": 3} for p in pids]
        (state / f"{i}.json").write_text(
            json.dumps({"utilization_pct": 75, "memory_used_bytes": 25 << 28, "processes": procs})
        )
    path = tmp / f"crowd-{foreign}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return FakeBackend(path), owned


def ownership_bench(tmp: Path) -> list[tuple[str, float, float]]:
    """The ownership map of one sample of every device (GpuWatch.observe) on 8 devices with
    200 processes: run against stand-ins for the worker and its 8 frames (the map's own
    cost; no store write: nothing new to record after the first call)."""
    from types import SimpleNamespace

    from cuectl.run.worker.gpuwatch import GpuWatch

    rows = []
    for foreign in (0, 10):
        backend, owned = crowded_fake(tmp, foreign)
        devices = backend.discover()
        uuids = [d.uuid for d in devices]
        frames = {}
        for i, d in enumerate(devices):
            claim = SimpleNamespace(
                frame_id=i + 1,
                attempt=1,
                job="bench",
                job_id=1,
                gpu_uuids=(d.uuid,),
                gpu_escape=None,
                gpu_idle_limit_s=None,
                gpu_idle_util=None,
                gpu_idle_action=None,
            )
            proc = SimpleNamespace(finished=False, pids=lambda table, i=i: owned[i], add_footer_note=lambda line: None)
            frames[i + 1] = SimpleNamespace(
                claim=claim,
                proc=proc,
                seen_pids=set(owned[i]),
                lost=False,
                watch={},
                usage=SimpleNamespace(started_at=0.0),
            )
        worker = SimpleNamespace(
            running=frames,
            devices=devices,
            link=SimpleNamespace(live_paused=True),
            opts=SimpleNamespace(
                lock_dir=tmp / "locks", gpu_escape="warn", gpu_idle_limit_s=None, name="bench", sample_interval_s=10.0
            ),
            store=None,
            tell_warn=lambda message: None,
        )
        (tmp / "locks").mkdir(exist_ok=True)
        watch = GpuWatch(worker)  # type: ignore[arg-type]
        samples = backend.sample(uuids, every_process=True)
        assert sum(len(s.processes) for s in samples.values()) == 200
        label = "all 200 owned by 8 frames" if not foreign else f"{foreign} of 200 foreign, steady"
        rows.append(
            ("fake, 8 devices, every process (200)", *timed(lambda: backend.sample(uuids, every_process=True), 300))
        )
        rows.append((f"ownership map: {label}", *timed(lambda: watch.observe(samples, 1.0), 300)))
        if foreign:

            def fresh_pass() -> None:
                watch.strangers = frozenset()  # as when they are new: a pass over /proc
                watch.observe(samples, 1.0)

            rows.append((f"ownership map: {foreign} of 200 foreign, new (/proc pass)", *timed(fresh_pass, 300)))
    return rows


def load_nvml_double():
    path = ROOT / "tests" / "gpu" / "nvml_double.py"
    spec = importlib.util.spec_from_file_location("bench_nvml_double", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fake = fake_backend(tmp)
        uuids = [dev.uuid for dev in fake.discover()]
        rows.append(("fake, 8 devices", *timed(lambda: fake.sample(uuids), 500)))
        rows.append(("fake, 8 devices + pids", *timed(lambda: fake.sample(uuids, {100, 105}), 500)))
        rows += ownership_bench(tmp)

        bindir = smi_stub(tmp)
        os.environ["PATH"] = str(bindir)  # the stub is the only nvidia-smi the bench can find
        smi = SmiBackend()
        smi_uuids = [dev.uuid for dev in smi.discover()]
        assert len(smi.sample(smi_uuids)) == N_DEVICES
        rows.append(("smi, 8 devices (1 spawn)", *timed(lambda: smi.sample(smi_uuids), 60)))
        rows.append(("smi, 8 devices + pids (2 spawns)", *timed(lambda: smi.sample(smi_uuids, {100, 103}), 40)))
        stub_argv = [str(bindir / "nvidia-smi"), "--query-gpu=uuid", "--format=csv,noheader,nounits"]
        rows.append(
            (
                "peer: the stub script alone",
                *timed(lambda: subprocess.run(stub_argv, stdin=subprocess.DEVNULL, capture_output=True), 60),
            )
        )
        rows.append(
            (
                "peer: spawn of /bin/true",
                *timed(lambda: subprocess.run(["/bin/true"], stdin=subprocess.DEVNULL, capture_output=True), 60),
            )
        )

        double = load_nvml_double()
        nvml = NvmlBackend(nvml=double.h100_box(N_DEVICES))
        nv_uuids = [dev.uuid for dev in nvml.discover()]
        rows.append(("nvml (double), 8 devices", *timed(lambda: nvml.sample(nv_uuids), 2000)))
        rows.append(("nvml (double), 8 devices + pids", *timed(lambda: nvml.sample(nv_uuids, {1000, 1003}), 2000)))

    width = max(len(r[0]) for r in rows)
    print(f"{'one sample of 8 GPUs'.ljust(width)}  {'median ms':>10}  {'p95 ms':>8}")
    for name, med, p95 in rows:
        print(f"{name.ljust(width)}  {med:10.3f}  {p95:8.3f}")


if __name__ == "__main__":
    main()
