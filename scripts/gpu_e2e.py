#!/usr/bin/env python3
"""End-to-end checks of cuectl on a machine with a real NVIDIA GPU (issue 19, item 7).

Run through ``scripts/gpu-e2e.sh`` (which installs cuectl offline into a throwaway
environment), or directly with a Python that can import cuectl::

    python scripts/gpu_e2e.py            # real GPUs: NVML, nvidia-smi, CUDA
    python scripts/gpu_e2e.py --fake     # the same checks on fake GPUs + a fake nvidia-smi

Every check drives real ``cuectl`` subprocesses (``python -m cuectl``) against a temporary
SQLite store, lock directory and state directory, and returns one row: name, PASS, FAIL or
SKIP (with the reason), and a detail. The table is printed at the end; the exit status is 1
when any check FAILed, 2 for bad usage, else 0.

Checks:
  inventory  ``cuectl gpu list --backend nvml`` equals ``nvidia-smi --query-gpu`` (uuid,
             model, memory, bus id, driver)
  isolation  a ``gpus: 1`` frame sees exactly its leased device (CUDA device count 1, the
             leased UUID); a CPU frame sees none
  overlap    two frames asking for the same single GPU (two workers racing for it) never
             run at the same time
  usage      a frame busy with a matmul loop records utilisation > 50 % and the memory it
             allocated; an idle GPU frame records ~0 % and at most 256 MiB
  run-lease  ``cuectl run --gpus 1`` and ``cuectl.lease(gpus=1)`` isolate the same way
             (and ``--gpus 0`` hides every device)
  mig        MIG instances listed by ``nvidia-smi -L`` are listed by cuectl and leasable

With ``--fake`` no CUDA library is used: the frames' CUDA view is simulated from the
variables cuectl sets (CUDA_VISIBLE_DEVICES, mapped through the fake nvidia-smi's PCI
order as CUDA does under CUDA_DEVICE_ORDER=PCI_BUS_ID), and the busy frame writes the fake
devices' state files, so the worker's real sampling path records its use.

The script is also its own frame payload: ``gpu_e2e.py probe --out FILE`` reports what a
process sees (used as the command of the frames and leases above).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[1]
MIB = 1024 * 1024
GIB = 1024 * MIB

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
CHECKS = ("inventory", "isolation", "overlap", "usage", "run-lease", "share", "escape", "idle", "mig")
SMI_QUERY = "--query-gpu=uuid,name,memory.total,pci.bus_id,driver_version"
SMI_FORMAT = "--format=csv,noheader,nounits"


@dataclass
class Result:
    name: str
    status: str
    detail: str


# =========================================================================== probe
# What a frame (or a leased process) sees. Runs inside frames: no cuectl import needed.


def _uuid_text(raw: Any) -> str:
    """A CUDA UUID (16 bytes, a uuid.UUID, or a string) as lower-case 8-4-4-4-12 hex."""
    if isinstance(raw, (bytes, bytearray)):
        h = bytes(raw).hex()
    else:
        h = re.sub(r"[^0-9a-f]", "", str(raw).lower().replace("gpu-", "").replace("mig-", ""))
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}" if len(h) == 32 else str(raw)


def norm_uuid(value: str | None) -> str:
    """Compare UUIDs without their ``GPU-``/``MIG-`` prefix, case-insensitively."""
    return _uuid_text(value or "")


def _cuda_view_bindings() -> tuple[int, str | None, str]:
    try:
        from cuda.bindings import driver as cu  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from cuda import cuda as cu  # type: ignore[import-not-found,no-redef,unused-ignore]

    def code(err: Any) -> int:  # CUresult: an IntEnum in most releases
        return int(getattr(err, "value", err))

    def ok(res: Any) -> Any:
        err, *rest = res
        if code(err) != 0:
            raise RuntimeError(f"CUDA driver error {err}")
        return rest[0] if rest else None

    (err,) = cu.cuInit(0)
    if code(err) != 0:
        # CUDA_ERROR_NO_DEVICE (100) is what a process with every GPU hidden gets.
        if code(err) == 100:
            return 0, None, "cuda-bindings"
        raise RuntimeError(f"cuInit: {err}")
    count = int(ok(cu.cuDeviceGetCount()))
    uuid = None
    if count:
        dev = ok(cu.cuDeviceGet(0))
        # _v2 gives a MIG instance's own UUID (CUDA 11.4+); gone again in CUDA 13's bindings.
        getter = getattr(cu, "cuDeviceGetUuid_v2", None) or cu.cuDeviceGetUuid
        raw = ok(getter(dev)).bytes
        uuid = _uuid_text(raw.encode("latin-1") if isinstance(raw, str) else raw)
    return count, uuid, "cuda-bindings"


def _cuda_view_cupy() -> tuple[int, str | None, str]:
    import cupy  # type: ignore[import-not-found,unused-ignore]

    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except cupy.cuda.runtime.CUDARuntimeError:
        return 0, None, "cupy"
    uuid = None
    if count:
        props = cupy.cuda.runtime.getDeviceProperties(0)
        raw = props.get("uuid")
        uuid = _uuid_text(raw) if raw is not None else None
    return count, uuid, "cupy"


def _cuda_view_torch() -> tuple[int, str | None, str]:
    import torch  # type: ignore[import-not-found,unused-ignore]

    count = int(torch.cuda.device_count())
    uuid = None
    if count:
        raw = getattr(torch.cuda.get_device_properties(0), "uuid", None)
        uuid = _uuid_text(raw) if raw is not None else None
    return count, uuid, "torch"


_CUDA_VIEWS: dict[str, Callable[[], tuple[int, str | None, str]]] = {
    "cuda-bindings": _cuda_view_bindings,
    "cupy": _cuda_view_cupy,
    "torch": _cuda_view_torch,
}


def _fake_cuda_view(env: dict[str, str], order: Sequence[str]) -> tuple[int, str | None, str]:
    """What CUDA would show, from CUDA_VISIBLE_DEVICES and the devices in PCI order."""
    if env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        raise RuntimeError("CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA's numbering would not be nvidia-smi's")
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return len(order), order[0] if order else None, "simulated"
    visible: list[str] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            break
        if re.fullmatch(r"-?\d+", item):
            i = int(item)
            if i < 0 or i >= len(order):
                break  # CUDA stops at the first invalid entry
            visible.append(order[i])
        else:
            match = [u for u in order if norm_uuid(u) == norm_uuid(item)]
            if not match:
                break
            visible.append(match[0])
    return len(visible), visible[0] if visible else None, "simulated"


def _busy_fake(seconds: float, alloc_bytes: int, state: Path, positions: dict[str, str], uuid: str) -> dict[str, Any]:
    """Make the fake device look busy: the worker samples these state files."""
    stem = positions[norm_uuid(uuid)]
    path = state / f"{stem}.json"
    tmp = state / f".{stem}.json.tmp"
    tmp.write_text(json.dumps({"utilization_pct": 97, "memory_used_bytes": alloc_bytes}))
    os.replace(tmp, path)
    start = time.time()
    time.sleep(seconds)
    end = time.time()
    path.unlink()
    return {"busy_start": start, "busy_end": end, "allocated_bytes": alloc_bytes, "busy_lib": "fake"}


def _busy_real(seconds: float, alloc_bytes: int) -> dict[str, Any]:
    """Allocate ``alloc_bytes`` on device 0 and keep it busy with matrix products."""
    try:
        import torch

        block = torch.empty(alloc_bytes, dtype=torch.uint8, device="cuda")
        block.fill_(1)
        a = torch.randn(8192, 8192, device="cuda")
        b = torch.randn(8192, 8192, device="cuda")
        torch.cuda.synchronize()
        start = time.time()
        n = 0
        while time.time() - start < seconds:
            for _ in range(4):
                c = a @ b
            torch.cuda.synchronize()
            n += 4
        end = time.time()
        allocated = int(torch.cuda.max_memory_reserved())
        del block, a, b, c
        return {"busy_start": start, "busy_end": end, "allocated_bytes": allocated, "matmuls": n, "busy_lib": "torch"}
    except ImportError:
        pass
    import cupy

    block = cupy.ones(alloc_bytes, dtype=cupy.uint8)
    a = cupy.random.rand(8192, 8192, dtype=cupy.float32)
    b = cupy.random.rand(8192, 8192, dtype=cupy.float32)
    cupy.cuda.Device(0).synchronize()
    start = time.time()
    n = 0
    while time.time() - start < seconds:
        for _ in range(4):
            c = a @ b
        cupy.cuda.Device(0).synchronize()
        n += 4
    end = time.time()
    allocated = int(cupy.get_default_memory_pool().total_bytes())
    del block, a, b, c
    return {"busy_start": start, "busy_end": end, "allocated_bytes": allocated, "matmuls": n, "busy_lib": "cupy"}


def _escape(a: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """Allocate on the device ``a.escape`` names (not given to this frame) and hold it for
    ``a.hold`` s: on fake GPUs by listing this pid in that device's state file."""
    if a.fake_state:
        stem = json.loads(a.fake_positions)[norm_uuid(a.escape)]
        path = Path(a.fake_state) / f"{stem}.json"
        entry = {"pid": os.getpid(), "memory_used_bytes": 1 << 30, "utilization_pct": 50}
        path.write_text(json.dumps({"utilization_pct": 50, "memory_used_bytes": 1 << 30, "processes": [entry]}))
        time.sleep(a.hold)
        path.unlink()
        return {"escaped_to": a.escape, "escape_lib": "fake"}
    import torch

    order = [norm_uuid(_uuid_text(torch.cuda.get_device_properties(i).uuid)) for i in range(torch.cuda.device_count())]
    index = order.index(norm_uuid(a.escape))
    block = torch.ones(1 << 30, dtype=torch.uint8, device=f"cuda:{index}")
    torch.cuda.synchronize(index)
    time.sleep(a.hold)
    del block
    return {"escaped_to": a.escape, "escape_lib": "torch", "escape_index": index}


def probe_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_e2e.py probe")
    p.add_argument("--out", required=True)
    p.add_argument("--hold", type=float, default=0.0, help="seconds to stay alive (overlap check)")
    p.add_argument("--busy", type=float, default=0.0, help="seconds of matmul loop")
    p.add_argument("--alloc-bytes", type=int, default=0)
    p.add_argument("--fake-order", help="fake mode: JSON list of UUIDs in CUDA (PCI) order")
    p.add_argument("--fake-state", help="fake mode: the fake GPU state_dir")
    p.add_argument("--fake-positions", help="fake mode: JSON {uuid: state file stem}")
    p.add_argument("--cuda-lib", default="auto", choices=("auto", *_CUDA_VIEWS))
    p.add_argument(
        "--escape",
        metavar="UUID",
        help="reset CUDA_VISIBLE_DEVICES to every device and use this one, which the frame was not given",
    )
    a = p.parse_args(argv)
    env = dict(os.environ)
    if a.escape:
        # What a careless program does: overrides the isolation before CUDA starts, so it
        # sees every GPU, and allocates on one it was not given (docs/gpu-health.md).
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env = dict(os.environ)
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "start": time.time(),
        "env": {
            k: env.get(k)
            for k in (
                "CUDA_VISIBLE_DEVICES",
                "NVIDIA_VISIBLE_DEVICES",
                "CUDA_DEVICE_ORDER",
                "CUE_GPUS",
                "CUE_GPU_UUIDS",
                "CUE_FRAME_ID",
                "CUE_GPU_SHARE_BYTES",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            )
        },
    }
    errors: list[str] = []
    if a.fake_order is not None:
        try:
            report["cuda_count"], report["cuda_uuid"], report["cuda_lib"] = _fake_cuda_view(
                env, json.loads(a.fake_order)
            )
        except RuntimeError as exc:
            errors.append(str(exc))
    else:
        names = list(_CUDA_VIEWS) if a.cuda_lib == "auto" else [a.cuda_lib]
        failed: list[str] = []
        for name in names:
            try:
                report["cuda_count"], report["cuda_uuid"], report["cuda_lib"] = _CUDA_VIEWS[name]()
                break
            except ImportError:
                continue
            except Exception as exc:  # a library that is there but fails: note it, try the next
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            errors.append(
                f"no CUDA library ({', '.join(names)}) could report the devices"
                + (f" ({'; '.join(failed)})" if failed else "")
            )
        report["cuda_lib_failures"] = failed
    if a.escape:
        try:
            report.update(_escape(a, env))
        except Exception as exc:
            errors.append(f"escape: {type(exc).__name__}: {exc}")
    elif a.busy > 0:
        try:
            if a.fake_state:
                report.update(
                    _busy_fake(
                        a.busy,
                        a.alloc_bytes,
                        Path(a.fake_state),
                        json.loads(a.fake_positions),
                        env.get("CUE_GPU_UUIDS", "").split(",")[0],
                    )
                )
            else:
                report.update(_busy_real(a.busy, a.alloc_bytes))
        except Exception as exc:
            errors.append(f"busy loop: {type(exc).__name__}: {exc}")
    if a.hold > 0:
        time.sleep(a.hold)
    report["errors"] = errors
    report["end"] = time.time()
    Path(a.out).write_text(json.dumps(report))
    return 0


# =========================================================================== harness


@dataclass
class Ctx:
    fake: bool
    tmp: Path
    env: dict[str, str]
    timeout: float = 120.0
    #: fake mode: UUIDs in nvidia-smi's (PCI) order, for the simulated CUDA view
    fake_order: list[str] = field(default_factory=list)
    fake_positions: dict[str, str] = field(default_factory=dict)
    fake_state: Path | None = None
    alloc_gib: float = 4.0
    busy_s: float = 20.0
    hold_s: float = 3.0
    idle_s: float = 5.0
    cuda_lib: str = "auto"
    _n: int = 0

    def cuectl(self, *args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "cuectl", *args]
        cp = subprocess.run(
            cmd, env=self.env, cwd=self.tmp, capture_output=True, text=True, timeout=timeout or self.timeout
        )
        if check and cp.returncode != 0:
            raise CheckError(
                f"`cuectl {shlex.join(args)}` exited {cp.returncode}: {(cp.stderr or cp.stdout).strip()[-600:]}"
            )
        return cp

    def cuectl_json(self, *args: str) -> Any:
        out = self.cuectl(*args).stdout
        try:
            return json.loads(out)
        except ValueError:
            raise CheckError(f"`cuectl {shlex.join(args)}` printed no JSON: {out[:300]!r}") from None

    def out_file(self, tag: str) -> Path:
        self._n += 1
        return self.tmp / "out" / f"{self._n:02d}-{tag}.json"

    def probe_cmd(self, out: Path, *extra: str) -> list[str]:
        cmd = [sys.executable, str(SCRIPT), "probe", "--out", str(out), *extra]
        if self.fake:
            cmd += ["--fake-order", json.dumps(self.fake_order)]
        else:
            cmd += ["--cuda-lib", self.cuda_lib]
        return cmd

    def submit(self, gpus: int, command: list[str], *extra: str) -> int:
        job = self.cuectl_json("submit", "--json", "--gpus", str(gpus), "--retries", "0", *extra, "--", *command)
        return int(job["id"])

    def frames(self, job: int) -> list[dict[str, Any]]:
        return list(self.cuectl_json("frame", "list", "--job", str(job), "--json")["frames"])

    def frame(self, job: int, *, show: bool = False) -> dict[str, Any]:
        """The one frame of ``job`` (``frame list``; with ``show``, ``frame show`` with its samples)."""
        frames = self.frames(job)
        if len(frames) != 1:
            raise CheckError(f"job {job}: expected 1 frame, got {len(frames)}")
        if not show:
            return dict(frames[0])
        return dict(self.cuectl_json("frame", "show", str(frames[0]["id"]), "--json"))

    def worker(self, *extra: str) -> None:
        self.cuectl(
            "worker", "--until-idle", "--poll", "0.2", "--lease-timeout", "30", *extra, timeout=self.timeout + 120
        )


class CheckError(Exception):
    """A check could not be carried out as planned (a command failed): reported as FAIL."""


def read_report(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckError(f"the frame wrote no report ({path.name}): see `cuectl frame log`")
    return dict(json.loads(path.read_text()))


def _fmt_env(r: dict[str, Any]) -> str:
    e = r["env"]
    return (
        f"CUDA_VISIBLE_DEVICES={e.get('CUDA_VISIBLE_DEVICES')} NVIDIA_VISIBLE_DEVICES={e.get('NVIDIA_VISIBLE_DEVICES')} "
        f"count={r.get('cuda_count')} ({r.get('cuda_lib')})"
    )


def judge_gpu_view(r: dict[str, Any], leased: Sequence[str]) -> list[str]:
    """Problems with what a 1-device process saw, given the UUIDs it leased."""
    bad = [f"probe error: {e}" for e in r.get("errors", [])]
    if len(leased) != 1:
        bad.append(f"leased {len(leased)} devices, expected 1: {list(leased)}")
        return bad
    if r.get("cuda_count") != 1:
        bad.append(f"CUDA sees {r.get('cuda_count')} devices, expected 1")
    seen = r.get("cuda_uuid")
    # A MIG instance's CUDA UUID may be reported differently by old drivers: compare
    # when both are known and the lease is not MIG.
    if seen is not None and not leased[0].startswith("MIG-") and norm_uuid(seen) != norm_uuid(leased[0]):
        bad.append(f"CUDA device 0 is {seen}, the lease is {leased[0]}")
    if seen is None and r.get("cuda_count") == 1 and not leased[0].startswith("MIG-"):
        bad.append("the CUDA library gave no UUID for device 0")
    if norm_uuid(r["env"].get("NVIDIA_VISIBLE_DEVICES")) != norm_uuid(leased[0]):
        bad.append(f"NVIDIA_VISIBLE_DEVICES={r['env'].get('NVIDIA_VISIBLE_DEVICES')}, the lease is {leased[0]}")
    return bad


def judge_cpu_view(r: dict[str, Any]) -> list[str]:
    bad = [f"probe error: {e}" for e in r.get("errors", [])]
    if r.get("cuda_count") != 0:
        bad.append(f"a CPU process sees {r.get('cuda_count')} CUDA devices, expected 0")
    if r["env"].get("NVIDIA_VISIBLE_DEVICES") not in ("void", "none", ""):
        bad.append(f"NVIDIA_VISIBLE_DEVICES={r['env'].get('NVIDIA_VISIBLE_DEVICES')} for a CPU process")
    return bad


# --------------------------------------------------------------------------- 1 inventory


def smi_inventory(ctx: Ctx) -> list[dict[str, Any]]:
    smi = shutil.which("nvidia-smi", path=ctx.env.get("PATH"))
    if smi is None:
        raise CheckError("nvidia-smi not found on PATH")
    cp = subprocess.run([smi, SMI_QUERY, SMI_FORMAT], env=ctx.env, capture_output=True, text=True, timeout=60)
    if cp.returncode != 0:
        raise CheckError(f"nvidia-smi exited {cp.returncode}: {(cp.stdout + cp.stderr).strip()[:300]}")
    rows = []
    for row in csv.reader(io.StringIO(cp.stdout)):
        if not row or not "".join(row).strip():
            continue
        uuid, name, mem, bus, driver = (c.strip() for c in row)
        rows.append(
            {
                "uuid": uuid,
                "model": name,
                "memory_mib": int(float(mem)),
                "pci_bus_id": _norm_bus(bus),
                "driver_version": driver,
            }
        )
    return rows


def _norm_bus(bus: str | None) -> str | None:
    """nvidia-smi prints an 8-digit domain (00000000:83:00.0), NVML's short form 4 digits."""
    if not bus:
        return None
    m = re.fullmatch(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", bus.strip())
    if not m:
        return bus.strip().lower()
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def check_inventory(ctx: Ctx) -> Result:
    backend = "fake" if ctx.fake else "nvml"
    listing = ctx.cuectl_json("gpu", "list", "--backend", backend, "--json")
    devices = listing["devices"]
    if not devices:
        why = "; ".join(f"{b['name']}: {b.get('error')}" for b in listing.get("backends", []))
        return Result("inventory", FAIL, f"cuectl --backend {backend} found no GPU ({why})")
    smi = smi_inventory(ctx)
    # A MIG-enabled card is listed by cuectl as its instances: compare those cards by UUID.
    cards: dict[str, dict[str, Any]] = {}
    mig_parents: set[str] = set()
    for d in devices:
        if d.get("mig_parent_uuid"):
            mig_parents.add(norm_uuid(d["mig_parent_uuid"]))
        else:
            cards[norm_uuid(d["uuid"])] = d
    problems = []
    for row in smi:
        key = norm_uuid(row["uuid"])
        if key in mig_parents:
            continue
        d = cards.pop(key, None)
        if d is None:
            problems.append(f"{row['uuid']} ({row['model']}): listed by nvidia-smi, not by cuectl")
            continue
        mine = {
            "uuid": d["uuid"],
            "model": d["model"],
            "memory_mib": None if d["memory_total_bytes"] is None else d["memory_total_bytes"] // MIB,
            "pci_bus_id": _norm_bus(d.get("pci_bus_id")),
            "driver_version": d.get("driver_version"),
        }
        for k in ("model", "pci_bus_id", "driver_version"):
            if mine[k] != row[k]:
                problems.append(f"{row['uuid']}: {k} cuectl={mine[k]!r} nvidia-smi={row[k]!r}")
        if mine["memory_mib"] is None or abs(mine["memory_mib"] - row["memory_mib"]) > 1:
            problems.append(f"{row['uuid']}: memory cuectl={mine['memory_mib']} MiB nvidia-smi={row['memory_mib']} MiB")
    smi_keys = {norm_uuid(r["uuid"]) for r in smi}
    for d in cards.values():
        problems.append(f"{d['uuid']} ({d['model']}): listed by cuectl, not by nvidia-smi")
    for key in mig_parents - smi_keys:
        problems.append(f"MIG parent {key}: listed by cuectl, not by nvidia-smi")
    summary = f"{len(smi)} GPU(s): " + ", ".join(
        f"{r['model']} {r['memory_mib']} MiB {r['pci_bus_id']} drv {r['driver_version']}" for r in smi
    )
    if mig_parents:
        summary += f"; {len(mig_parents)} with MIG on (compared by UUID; instances: check mig)"
    if problems:
        return Result("inventory", FAIL, "; ".join(problems))
    return Result("inventory", PASS, summary)


# --------------------------------------------------------------------------- 2 isolation


def check_isolation(ctx: Ctx) -> Result:
    gpu_out, cpu_out = ctx.out_file("iso-gpu"), ctx.out_file("iso-cpu")
    gpu_job = ctx.submit(1, ctx.probe_cmd(gpu_out), "--name", "e2e-isolation-gpu")
    cpu_job = ctx.submit(0, ctx.probe_cmd(cpu_out), "--name", "e2e-isolation-cpu")
    ctx.worker()
    g, c = ctx.frame(gpu_job), ctx.frame(cpu_job)
    problems = [f"frame {f['id']} is {f['state']}" for f in (g, c) if f["state"] != "SUCCEEDED"]
    if problems:
        return Result("isolation", FAIL, "; ".join(problems))
    gr, cr = read_report(gpu_out), read_report(cpu_out)
    problems = judge_gpu_view(gr, g["gpu_uuids"]) + judge_cpu_view(cr)
    detail = f"GPU frame: {_fmt_env(gr)} uuid={gr.get('cuda_uuid')} lease={g['gpu_uuids']}; CPU frame: {_fmt_env(cr)}"
    return Result("isolation", FAIL if problems else PASS, "; ".join(problems) + (" | " if problems else "") + detail)


# --------------------------------------------------------------------------- 3 overlap


def check_overlap(ctx: Ctx, device: str) -> Result:
    outs = [ctx.out_file("overlap-a"), ctx.out_file("overlap-b")]
    jobs = [
        ctx.submit(1, ctx.probe_cmd(o, "--hold", str(ctx.hold_s)), "--name", f"e2e-overlap-{i}")
        for i, o in enumerate(outs)
    ]
    # Two workers (two host names) race for the same single device: only the device lease
    # (a kernel lock keyed by UUID) keeps them apart.
    cmd = [sys.executable, "-m", "cuectl", "worker", "--until-idle", "--poll", "0.2", "--devices", device]
    procs = [
        subprocess.Popen(
            [*cmd, "--name", f"e2e-overlap-{n}"],
            env=ctx.env,
            cwd=ctx.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in "ab"
    ]
    logs = []
    for pr in procs:
        try:
            out, _ = pr.communicate(timeout=ctx.timeout + 60)
        except subprocess.TimeoutExpired:
            pr.kill()
            out, _ = pr.communicate()
        logs.append(out)
        if pr.returncode != 0:
            return Result("overlap", FAIL, f"worker exited {pr.returncode}: {out.strip()[-400:]}")
    frames = [ctx.frame(j) for j in jobs]
    bad = [f"frame {f['id']} is {f['state']}" for f in frames if f["state"] != "SUCCEEDED"]
    if bad:
        return Result("overlap", FAIL, "; ".join(bad))
    reps = [read_report(o) for o in outs]
    leases = [tuple(f["gpu_uuids"]) for f in frames]
    (s1, e1), (s2, e2) = ((r["start"], r["end"]) for r in reps)
    hosts = sorted({str(f["host"]) for f in frames})
    detail = (
        f"frame A {s1 - min(s1, s2):.2f}-{e1 - min(s1, s2):.2f}s, frame B {s2 - min(s1, s2):.2f}-{e2 - min(s1, s2):.2f}s "
        f"on {leases[0]}; hosts {hosts}"
    )
    problems = []
    if leases[0] != leases[1] or len(leases[0]) != 1:
        problems.append(f"the frames leased {leases}, expected the same single device")
    if not (e1 <= s2 or e2 <= s1):
        problems.append("the two frames ran at the same time")
    return Result("overlap", FAIL if problems else PASS, "; ".join([*problems, detail]))


# --------------------------------------------------------------------------- 4 usage


#: The most GPU memory an idle 1-GPU frame may be charged with (nothing else on the device).
IDLE_PEAK_MAX = 256 * 1024**2


def check_usage(ctx: Ctx, devices: Sequence[str], mig_only: bool = False) -> Result:
    if not ctx.fake and not (_importable("torch") or _importable("cupy")):
        return Result("usage", SKIP, "neither PyTorch nor CuPy is importable: no matmul loop to run")
    alloc = int(ctx.alloc_gib * GIB)
    busy_out = ctx.out_file("busy")  # the idle frame reports nothing of its own: a sleep
    extra = ["--busy", str(ctx.busy_s), "--alloc-bytes", str(alloc)]
    if ctx.fake:
        assert ctx.fake_state is not None
        extra += ["--fake-state", str(ctx.fake_state), "--fake-positions", json.dumps(ctx.fake_positions)]
    # The idle frame first: right after a busy frame, a device's first utilisation reading
    # still covers the busy one's last moments.
    idle = ctx.submit(1, [sys.executable, "-c", f"import time; time.sleep({ctx.idle_s})"], "--name", "e2e-idle")
    busy = ctx.submit(1, ctx.probe_cmd(busy_out, *extra), "--name", "e2e-busy")
    # On a host with several GPUs the two frames run side by side, each on its own device.
    ctx.worker("--sample-interval", "0.5", "--devices", ",".join(devices))
    b, i = ctx.frame(busy, show=True), ctx.frame(idle, show=True)
    bad = [f"frame {f['id']} is {f['state']}" for f in (b, i) if f["state"] != "SUCCEEDED"]
    if bad:
        return Result("usage", FAIL, "; ".join(bad))
    rep = read_report(busy_out)
    problems = [f"busy frame: {e}" for e in rep.get("errors", [])]
    allocated = int(rep.get("allocated_bytes") or alloc)
    mean, peak, imean = b.get("gpu_util_mean_pct"), b.get("gpu_memory_peak_bytes"), i.get("gpu_util_mean_pct")
    # Framework overhead on top of the allocation: the CUDA context (a few hundred MiB).
    overhead = 0 if ctx.fake else int(1.5 * GIB)
    if mig_only:
        pass  # NVIDIA reports no utilisation for MIG instances: memory only
    elif mean is None or mean <= 50:
        problems.append(f"busy frame utilisation mean {mean} %, expected > 50 %")
    if peak is None or not (0.85 * allocated <= peak <= 1.15 * allocated + overhead):
        problems.append(
            f"busy frame memory peak {_gib(peak)}, allocated {_gib(allocated)} (±15 %"
            f"{' + context' if overhead else ''})"
        )
    if not mig_only and (imean is None or imean >= 10):
        problems.append(f"idle frame utilisation mean {imean} %, expected < 10 %")
    # A frame that never opens its GPU holds none of its memory. The driver's own reserve
    # (615 MiB of an H200) counted as the frame's was the first real run's finding.
    ipeak = i.get("gpu_memory_peak_bytes")
    if ipeak is not None and ipeak > IDLE_PEAK_MAX:
        problems.append(f"idle frame memory peak {_gib(ipeak)}, expected at most {_gib(IDLE_PEAK_MAX)}")
    detail = (
        f"busy: mean {mean} % max {b.get('gpu_util_max_pct')} %, peak {_gib(peak)} vs allocated {_gib(allocated)} "
        f"({rep.get('busy_lib')}, {sum(len(v) for v in (b.get('samples') or {}).values())} samples); idle: mean {imean} %, "
        f"peak {_gib(ipeak)}"
        + ("; MIG instances only: utilisation not reported by NVIDIA, not checked" if mig_only else "")
    )
    return Result("usage", FAIL if problems else PASS, "; ".join([*problems, detail]))


def _gib(n: Any) -> str:
    return "None" if n is None else f"{n / GIB:.2f} GiB"


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# --------------------------------------------------------------------------- 5 run + lease


_LEASE_SNIPPET = """
import json, os, subprocess, sys
import cuectl
cmd, out = json.loads(sys.argv[1]), sys.argv[2]
with cuectl.lease(gpus=int(sys.argv[3]), wait=True, timeout=60) as lease:
    subprocess.run(cmd, env={**os.environ, **lease.env}, check=True)
    with open(out, "w") as f:
        json.dump(list(lease.uuids), f)
"""


def check_run_lease(ctx: Ctx) -> Result:
    problems: list[str] = []
    details: list[str] = []
    # cuectl run --gpus 1 / --gpus 0
    for gpus in (1, 0):
        out = ctx.out_file(f"run-{gpus}")
        cp = ctx.cuectl("run", "--gpus", str(gpus), "--timeout", "60", "--", *ctx.probe_cmd(out))
        rep = read_report(out)
        if gpus:
            leased = [u for u in (rep["env"].get("CUE_GPU_UUIDS") or "").split(",") if u]
            said = re.findall(r"\b((?:GPU|MIG)-[0-9A-Za-z-]+)", cp.stderr)
            if said and said != leased:
                problems.append(f"cuectl run said it leased {said}, the command got CUE_GPU_UUIDS={leased}")
            problems += [f"cuectl run --gpus 1: {p}" for p in judge_gpu_view(rep, leased)]
            details.append(f"run --gpus 1: {_fmt_env(rep)} uuid={rep.get('cuda_uuid')} lease={leased}")
        else:
            problems += [f"cuectl run --gpus 0: {p}" for p in judge_cpu_view(rep)]
            details.append(f"run --gpus 0: count={rep.get('cuda_count')}")
    # A plain `cuectl run` twice: the first discovers and leaves its cache, the second takes
    # the quick path (docs/leases.md, "Start-up"), which must isolate the same way. Under
    # -X importtime the quick path shows no GPU backend module (nvml, smi, fake) loaded.
    pair_env = {**ctx.env, "CUECTL_RUN_CACHE": str(ctx.tmp / "run-pair.cache")}  # empty: the first is full
    for way in ("full", "quick"):
        out = ctx.out_file(f"run-{way}")
        cp = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "cuectl", "run", "--", *ctx.probe_cmd(out)],
            env=pair_env,
            cwd=ctx.tmp,
            capture_output=True,
            text=True,
            timeout=ctx.timeout,
        )
        if cp.returncode != 0:
            problems.append(f"plain cuectl run ({way}) exited {cp.returncode}: {cp.stderr.strip()[-300:]}")
            continue
        backends = sorted(set(re.findall(r"\| +(cuectl\.gpu\.(?:nvml|smi|fake|amd|apple))$", cp.stderr, re.M)))
        if (way == "quick") != (not backends):
            problems.append(f"plain cuectl run: expected the {way} path, loaded {backends or 'no GPU backend'}")
        rep = read_report(out)
        leased = [u for u in (rep["env"].get("CUE_GPU_UUIDS") or "").split(",") if u]
        problems += [f"cuectl run ({way} path): {p}" for p in judge_gpu_view(rep, leased)]
        details.append(f"run ({way} path): {_fmt_env(rep)} uuid={rep.get('cuda_uuid')} lease={leased}")
    # cuectl.lease(gpus=1) / (gpus=0) in a Python process, the probe as its child
    for gpus in (1, 0):
        out, uuids_out = ctx.out_file(f"lease-{gpus}"), ctx.out_file(f"lease-{gpus}-uuids")
        cp = subprocess.run(
            [sys.executable, "-c", _LEASE_SNIPPET, json.dumps(ctx.probe_cmd(out)), str(uuids_out), str(gpus)],
            env=ctx.env,
            cwd=ctx.tmp,
            capture_output=True,
            text=True,
            timeout=ctx.timeout,
        )
        if cp.returncode != 0:
            problems.append(f"cuectl.lease(gpus={gpus}) failed: {cp.stderr.strip()[-400:]}")
            continue
        rep, leased = read_report(out), json.loads(uuids_out.read_text())
        if gpus:
            problems += [f"cuectl.lease(gpus=1): {p}" for p in judge_gpu_view(rep, leased)]
            details.append(f"lease(gpus=1): {_fmt_env(rep)} uuid={rep.get('cuda_uuid')} lease={leased}")
        else:
            problems += [f"cuectl.lease(gpus=0): {p}" for p in judge_cpu_view(rep)]
            details.append(f"lease(gpus=0): count={rep.get('cuda_count')}")
    return Result("run-lease", FAIL if problems else PASS, "; ".join([*problems, *details]))


# --------------------------------------------------------------------------- 6 shares

#: What each of the two shares allocates on top of its framework's own use (the CUDA
#: context and the matmul operands of the busy loop: ~1.5 GiB with PyTorch), and its budget.
SHARE_ALLOC = 512 * MIB
SHARE_BUDGET = 4 * GIB


def check_share(ctx: Ctx, device: str) -> Result:
    """Two frames with a memory budget (``--gpu-share``) on one GPU: they run at the same
    time, on that device, each told its budget, and each stays within it (nothing stopped
    as over budget; the worker's own record of the frame's peak is under the budget)."""
    listed = {d["uuid"]: d for d in ctx.cuectl_json("gpu", "list", "--json")["devices"]}
    total = int(listed[device]["memory_total_bytes"] or 0)
    # Two budgets must fit the device: 4 GiB each, less on a card under 9 GiB.
    budget = min(SHARE_BUDGET, int(total * 0.45)) // MIB * MIB
    outs = [ctx.out_file("share-a"), ctx.out_file("share-b")]
    # Each allocates and computes where it can (PyTorch or CuPy); else, as on fake GPUs,
    # whose devices list no processes, it only holds its share.
    allocates = not ctx.fake and (_importable("torch") or _importable("cupy"))
    if allocates:
        extra = ["--busy", str(ctx.hold_s), "--alloc-bytes", str(SHARE_ALLOC)]
    else:
        extra = ["--hold", str(ctx.hold_s)]
    jobs = [
        ctx.submit(1, ctx.probe_cmd(o, *extra), "--name", f"e2e-share-{i}", "--gpu-share", f"{budget // MIB}M")
        for i, o in enumerate(outs)
    ]
    ctx.worker("--sample-interval", "0.5", "--devices", device)
    frames = [ctx.frame(j, show=True) for j in jobs]
    bad = [f"frame {f['id']} is {f['state']} ({f.get('failure')})" for f in frames if f["state"] != "SUCCEEDED"]
    if bad:
        return Result("share", FAIL, "; ".join(bad))
    reps = [read_report(o) for o in outs]
    problems = [f"share {n}: {e}" for n, r in zip("ab", reps) for e in r.get("errors", [])]
    leases = [tuple(f["gpu_uuids"]) for f in frames]
    if leases[0] != leases[1] or leases[0] != (device,):
        problems.append(f"the shares leased {leases}, expected both on {device}")
    (s1, e1), (s2, e2) = ((r["start"], r["end"]) for r in reps)
    if e1 <= s2 or e2 <= s1:
        problems.append("the two shares did not run at the same time")
    told = [r["env"].get("CUE_GPU_SHARE_BYTES") for r in reps]
    if told != [str(budget)] * 2:
        problems.append(f"CUE_GPU_SHARE_BYTES was {told}, expected {budget} for both")
    peaks = [f.get("gpu_memory_peak_bytes") for f in frames]
    if not ctx.fake:
        problems += [
            f"share {n} peaked at {_gib(p)}, over its {_gib(budget)}" for n, p in zip("ab", peaks) if p and p > budget
        ]
    mps = [r["env"].get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") for r in reps]
    detail = (
        f"two {_gib(budget)} shares of {_gib(total)} on {device}: A {s1 - min(s1, s2):.2f}-{e1 - min(s1, s2):.2f}s, "
        f"B {s2 - min(s1, s2):.2f}-{e2 - min(s1, s2):.2f}s; peaks {', '.join(_gib(p) for p in peaks)}"
        f"{'' if allocates else ' (no allocation: fake GPUs, or no PyTorch/CuPy)'}; MPS limit {mps[0]}"
    )
    return Result("share", FAIL if problems else PASS, "; ".join([*problems, detail]))


# --------------------------------------------------------------------------- escapes, idle


def check_escape(ctx: Ctx, device: str) -> Result:
    """A CPU frame (no GPU given, CUDA_VISIBLE_DEVICES hidden) that resets
    CUDA_VISIBLE_DEVICES and allocates on ``device`` anyway: the worker, sampling every
    process on every device, records an ``escape`` event on the attempt, naming the device
    and the frame's pid (docs/gpu-health.md)."""
    if not ctx.fake and not _importable("torch"):
        return Result("escape", SKIP, "needs PyTorch in this interpreter to allocate on a GPU")
    out = ctx.out_file("escape")
    extra = ["--escape", device, "--hold", str(max(ctx.hold_s, 3.0))]
    if ctx.fake:
        extra += ["--fake-state", str(ctx.fake_state), "--fake-positions", json.dumps(ctx.fake_positions)]
    job = ctx.submit(0, ctx.probe_cmd(out, *extra), "--name", "e2e-escape")
    ctx.worker("--sample-interval", "0.5")
    frame = ctx.frame(job, show=True)
    rep = read_report(out)
    problems = [f"probe: {e}" for e in rep.get("errors", [])]
    escapes = [e for e in frame.get("gpu_events") or [] if e["kind"] == "escape"]
    if not escapes:
        problems.append("no escape event was recorded")
    elif norm_uuid(escapes[0]["device"]) != norm_uuid(device) or escapes[0]["pid"] != rep.get("pid"):
        problems.append(
            f"the escape names {escapes[0]['device']} pid {escapes[0]['pid']}, expected {device} pid {rep.get('pid')}"
        )
    detail = escapes[0]["detail"] if escapes else f"frame {frame['id']} {frame['state']}"
    return Result("escape", FAIL if problems else PASS, "; ".join([*problems, detail]))


def check_idle(ctx: Ctx) -> Result:
    """A 1-GPU frame that computes nothing for longer than its ``--gpu-idle-limit``: an
    ``idle`` event on the attempt and the device-seconds held idle kept with it."""
    out = ctx.out_file("idle")
    job = ctx.submit(
        1, ctx.probe_cmd(out, "--hold", str(max(ctx.idle_s, 4.0))), "--name", "e2e-idle", "--gpu-idle-limit", "2s"
    )
    ctx.worker("--sample-interval", "0.5")
    frame = ctx.frame(job, show=True)
    idle = [e for e in frame.get("gpu_events") or [] if e["kind"] == "idle"]
    history = frame.get("attempt_history") or [{}]
    held = history[-1].get("gpu_idle_seconds")
    problems = [] if idle else ["no idle event was recorded"]
    if not held:
        problems.append(f"no idle device-seconds on the attempt ({held})")
    detail = f"{idle[0]['detail']}; held idle {held} s" if idle else f"frame {frame['id']} {frame['state']}"
    return Result("idle", FAIL if problems else PASS, "; ".join([*problems, detail]))


# --------------------------------------------------------------------------- 7 MIG

_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(MIG-[^)\s]+)\)", re.M)


def check_mig(ctx: Ctx) -> Result:
    smi = shutil.which("nvidia-smi", path=ctx.env.get("PATH"))
    if smi is None:
        return Result("mig", FAIL, "nvidia-smi not found on PATH")
    cp = subprocess.run([smi, "-L"], env=ctx.env, capture_output=True, text=True, timeout=60)
    if cp.returncode != 0:
        return Result("mig", FAIL, f"nvidia-smi -L exited {cp.returncode}: {cp.stdout.strip()[:300]}")
    listed = {m.group(3): m.group(1) for m in _MIG_LINE.finditer(cp.stdout)}
    if not listed:
        return Result("mig", SKIP, "MIG not enabled (nvidia-smi -L lists no MIG device)")
    devices = ctx.cuectl_json("gpu", "list", "--backend", "fake" if ctx.fake else "nvml", "--json")["devices"]
    mine = {d["uuid"]: d.get("mig_profile") for d in devices if d.get("mig_parent_uuid")}
    problems = []
    if set(mine) != set(listed):
        problems.append(f"MIG devices: nvidia-smi -L {sorted(listed)}, cuectl {sorted(mine)}")
    for uuid, profile in listed.items():
        if uuid in mine and mine[uuid] != profile:
            problems.append(f"{uuid}: profile cuectl={mine[uuid]!r} nvidia-smi={profile!r}")
    out = ctx.out_file("mig")
    job = ctx.submit(1, ctx.probe_cmd(out), "--name", "e2e-mig", "--gpu-model", "MIG")
    ctx.worker()
    f = ctx.frame(job)
    if f["state"] != "SUCCEEDED":
        return Result("mig", FAIL, "; ".join([*problems, f"MIG frame {f['id']} is {f['state']}"]))
    rep = read_report(out)
    leased = list(f["gpu_uuids"])
    if len(leased) != 1 or leased[0] not in listed:
        problems.append(f"the MIG frame leased {leased}, not one MIG instance")
    problems += judge_gpu_view(rep, leased)
    if rep["env"].get("CUDA_VISIBLE_DEVICES") != (leased[0] if leased else None):
        problems.append(f"CUDA_VISIBLE_DEVICES={rep['env'].get('CUDA_VISIBLE_DEVICES')}, expected the MIG UUID")
    detail = f"{len(listed)} MIG instance(s) {sorted(set(listed.values()))}; frame leased {leased}: {_fmt_env(rep)}"
    return Result("mig", FAIL if problems else PASS, "; ".join([*problems, detail]))


# =========================================================================== fake setup


def find_fixtures(explicit: str | None) -> Path:
    candidates = [Path(explicit)] if explicit else [REPO / "tests" / "fixtures" / "gpu"]
    for c in candidates:
        if (c / "nvidia-smi" / "query-gpu").is_dir():
            return c
    raise SystemExit(
        f"gpu_e2e: --fake needs the real nvidia-smi fixtures (tests/fixtures/gpu); "
        f"not found at {', '.join(map(str, candidates))} (use --fixtures DIR)"
    )


# The fixtures used for --fake: an H100 and an H200 on one driver (590.48.01); with
# --fake-mig the H100 is the capture of the same card with MIG on, with its `nvidia-smi -L`.
FAKE_CARDS = ("nvidia-smi/query-gpu/h100-80gb-hbm3_590.48.01_load.csv", "nvidia-smi/query-gpu/h200_590.48.01_idle.csv")
FAKE_MIG_CARD = "nvidia-smi/query-gpu/h100-80gb-hbm3-mig_590.48.01_load.csv"
FAKE_MIG_LIST = "nvidia-smi/list/h100-80gb-hbm3-mig_590.48.01_L.txt"


def _fixture_card(path: Path) -> dict[str, str]:
    rows = list(csv.reader(path.read_text().splitlines()))
    header = [h.strip().split(" ")[0] for h in rows[0]]
    values = dict(zip(header, (v.strip() for v in rows[1])))

    def bare(v: str) -> str:  # what --format=...,nounits prints
        return re.sub(r"\s*(MiB|%|W|MHz|C)$", "", v)

    return {k: bare(values[k]) for k in ("uuid", "name", "memory.total", "pci.bus_id", "driver_version")}


def setup_fake(ctx: Ctx, fixtures: Path, *, mig: bool, cuda_order: str) -> None:
    """Fake GPUs + a fake nvidia-smi that agree, both from real nvidia-smi outputs.

    The fixtures' UUIDs are masked by their publishers (all zeros), so each card's UUID gets
    its position as last digit to make them distinct; everything else is as captured."""
    cards = [_fixture_card(fixtures / rel) for rel in FAKE_CARDS]
    mig_lines: list[tuple[str, str]] = []
    if mig:
        cards[0] = {**_fixture_card(fixtures / FAKE_MIG_CARD), "mig": "yes"}
        text = (fixtures / FAKE_MIG_LIST).read_text()
        mig_lines = [(m.group(1), m.group(3)) for m in _MIG_LINE.finditer(text)]
    for i, c in enumerate(cards):
        c["uuid"] = c["uuid"][: -len(str(i + 1))] + str(i + 1)
    cards.sort(key=lambda c: _norm_bus(c["pci.bus_id"]) or "")  # nvidia-smi's order
    ctx.fake_state = ctx.tmp / "fake-state"
    ctx.fake_state.mkdir()
    devices: list[dict[str, Any]] = []
    for c in cards:
        dev: dict[str, Any] = {
            "model": c["name"],
            "memory": f"{c['memory.total']}MiB",
            "uuid": c["uuid"],
            "pci_bus_id": _norm_bus(c["pci.bus_id"]),
            "driver_version": c["driver_version"],
        }
        if c.get("mig"):
            # nvidia-smi -L gives no instance memory: take it from the profile name.
            dev["mig"] = [
                {"profile": prof, "memory": f"{_profile_gb(prof) * 1000}MiB", "uuid": uuid} for prof, uuid in mig_lines
            ]
        devices.append(dev)
    ctx.fake_positions = {norm_uuid(d["uuid"]): str(p) for p, d in enumerate(devices) if "mig" not in d}
    for p, d in enumerate(devices):
        for m, inst in enumerate(d.get("mig", [])):
            ctx.fake_positions[norm_uuid(inst["uuid"])] = f"{p}.{m}"
    yaml_text = "host: e2e-fake\nstate_dir: fake-state\ndevices:\n" + "".join(
        "  - " + json.dumps(d) + "\n" for d in devices
    )  # JSON is YAML
    (ctx.tmp / "fake-gpus.yaml").write_text(yaml_text)
    ctx.env["CUECTL_FAKE_GPUS"] = str(ctx.tmp / "fake-gpus.yaml")

    # CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID: the cards (or their MIG instances) by bus id.
    order: list[str] = []
    for d in devices:
        order += [i["uuid"] for i in d["mig"]] if "mig" in d else [d["uuid"]]
    ctx.fake_order = list(reversed(order)) if cuda_order == "reversed" else order

    # The fake nvidia-smi: answers the two commands the checks run, as the real one would.
    bindir = ctx.tmp / "fake-bin"
    bindir.mkdir()
    query = "".join(
        f"{c['uuid']}, {c['name']}, {c['memory.total']}, {c['pci.bus_id']}, {c['driver_version']}\n" for c in cards
    )
    listing = ""
    for i, c in enumerate(cards):
        listing += f"GPU {i}: {c['name']} (UUID: {c['uuid']})\n"
        for d in devices:
            if d["uuid"] == c["uuid"] and "mig" in d:
                listing += "".join(
                    f"  MIG {m['profile']:<13} Device {j:>2}: (UUID: {m['uuid']})\n" for j, m in enumerate(d["mig"])
                )
    (ctx.tmp / "fake-smi-query.txt").write_text(query)
    (ctx.tmp / "fake-smi-L.txt").write_text(listing)
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        "# fake nvidia-smi of scripts/gpu_e2e.py --fake (values from tests/fixtures/gpu)\n"
        'case "$*" in\n'
        f'  "{SMI_QUERY} {SMI_FORMAT}") cat {shlex.quote(str(ctx.tmp / "fake-smi-query.txt"))} ;;\n'
        f'  "-L") cat {shlex.quote(str(ctx.tmp / "fake-smi-L.txt"))} ;;\n'
        '  *) echo "fake nvidia-smi: unexpected arguments: $*"; exit 2 ;;\n'
        "esac\n"
    )
    smi.chmod(0o755)
    ctx.env["PATH"] = f"{bindir}{os.pathsep}{ctx.env.get('PATH', '')}"


def _profile_gb(profile: str) -> int:
    m = re.search(r"(\d+)gb$", profile)
    return int(m.group(1)) if m else 10


# =========================================================================== main


def make_ctx(args: argparse.Namespace, tmp: Path) -> Ctx:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("CUECTL_") or k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
            del env[k]
    (tmp / "out").mkdir()
    (tmp / "locks").mkdir()
    env.update(
        {
            "CUECTL_DB": str(tmp / "cuectl.db"),
            "CUECTL_LOCK_DIR": str(tmp / "locks"),
            "CUECTL_CREATE_LOCK_DIR": "1",
            "XDG_STATE_HOME": str(tmp / "state"),
            "CUECTL_LOCK_REGISTRY": str(tmp / "lock-registry"),
            "CUECTL_RUN_CACHE": str(tmp / "run.cache"),
        }
    )
    # The script's own interpreter must find cuectl in the frames too (a --target install).
    ctx = Ctx(fake=args.fake, tmp=tmp, env=env, alloc_gib=args.alloc_gib, cuda_lib=args.cuda_lib)
    if args.fake:
        ctx.busy_s, ctx.hold_s, ctx.idle_s, ctx.timeout = 2.0, 1.5, 2.0, 60.0
        setup_fake(ctx, find_fixtures(args.fixtures), mig=args.fake_mig, cuda_order=args.fake_cuda_order)
    else:
        ctx.busy_s = args.busy_seconds
    return ctx


def plain_devices(ctx: Ctx) -> tuple[list[str], bool]:
    """The devices the overlap and usage checks use: the GPUs that are not MIG instances
    (NVIDIA reports no utilisation for those), else every device; and whether they are
    all MIG instances."""
    devices = ctx.cuectl_json("gpu", "list", "--json")["devices"]
    if not devices:
        raise CheckError("cuectl found no GPU")
    plain = [d for d in devices if not d.get("mig_parent_uuid")]
    return [str(d["uuid"]) for d in (plain or devices)], not plain


def run_checks(ctx: Ctx, names: Sequence[str]) -> list[Result]:
    results: list[Result] = []
    devices: list[str] = []
    mig_only = False
    for name in names:
        t0 = time.monotonic()
        try:
            if name in ("overlap", "usage", "share", "escape") and not devices:
                devices, mig_only = plain_devices(ctx)
            if name == "inventory":
                r = check_inventory(ctx)
            elif name == "isolation":
                r = check_isolation(ctx)
            elif name == "overlap":
                r = check_overlap(ctx, devices[0])
            elif name == "usage":
                r = check_usage(ctx, devices, mig_only)
            elif name == "run-lease":
                r = check_run_lease(ctx)
            elif name == "share":
                r = check_share(ctx, devices[0])
            elif name == "escape":
                r = check_escape(ctx, devices[0])
            elif name == "idle":
                r = check_idle(ctx)
            else:
                r = check_mig(ctx)
        except (CheckError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as exc:
            r = Result(name, FAIL, f"{type(exc).__name__}: {exc}")
        r.detail = f"[{time.monotonic() - t0:.1f}s] {r.detail}"
        results.append(r)
        line = f"{r.status} {r.name}: {r.detail}"
        print(line if len(line) <= 200 else line[:197] + "...", file=sys.stderr, flush=True)
    return results


def print_table(results: Sequence[Result], header: str) -> None:
    width = max(len(r.name) for r in results)
    print(header)
    print(f"{'check':<{width}}  result  detail")
    print(f"{'-' * width}  ------  ------")
    for r in results:
        print(f"{r.name:<{width}}  {r.status:<6}  {r.detail}")
    counts = {s: sum(r.status == s for r in results) for s in (PASS, FAIL, SKIP)}
    verdict = "FAILED" if counts[FAIL] else "OK"
    print(f"gpu-e2e: {verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["probe"]:
        return probe_main(argv[1:])
    p = argparse.ArgumentParser(prog="gpu_e2e.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--fake", action="store_true", help="fake GPUs and a fake nvidia-smi built from the fixtures")
    p.add_argument("--fake-mig", action="store_true", help="with --fake: add a MIG-enabled H100 (from the fixtures)")
    p.add_argument(
        "--fake-cuda-order",
        choices=("pci", "reversed"),
        default="pci",
        help="with --fake: how the simulated CUDA numbers devices (reversed: a deliberate mismatch, "
        "to see the isolation checks fail)",
    )
    p.add_argument("--fixtures", help="the GPU fixtures directory (default: tests/fixtures/gpu of this repository)")
    p.add_argument("--only", help=f"comma list of checks to run (default all: {','.join(CHECKS)})")
    p.add_argument("--alloc-gib", type=float, default=4.0, help="GiB the busy frame allocates (default 4)")
    p.add_argument("--busy-seconds", type=float, default=20.0, help="seconds of matmul loop (real mode; default 20)")
    p.add_argument(
        "--cuda-lib",
        default="auto",
        choices=("auto", *_CUDA_VIEWS),
        help="library the frames use to count CUDA devices (default: the first importable)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (store, logs, reports)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = p.parse_args(argv)
    names = CHECKS if not args.only else tuple(n.strip() for n in args.only.split(",") if n.strip())
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        p.error(f"unknown check(s) {unknown}; choose from {', '.join(CHECKS)}")

    tmp = Path(tempfile.mkdtemp(prefix="cuectl-gpu-e2e-"))
    started = time.monotonic()
    try:
        ctx = make_ctx(args, tmp)
        import cuectl  # noqa: F401  (fail early, with a clear message, when cuectl is not importable)

        results = run_checks(ctx, names)
    finally:
        if args.keep:
            print(f"gpu-e2e: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    mode = "fake GPUs (--fake)" if args.fake else "real GPUs"
    print_table(results, f"cuectl GPU end-to-end checks on {mode}, {time.strftime('%Y-%m-%d')}, {elapsed:.1f}s")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "mode": "fake" if args.fake else "real",
                    "seconds": round(elapsed, 1),
                    "results": [r.__dict__ for r in results],
                },
                indent=2,
            )
        )
    return 1 if any(r.status == FAIL for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
