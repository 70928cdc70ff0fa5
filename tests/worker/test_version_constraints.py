"""Compute capability, driver and CUDA minimums (issue 39 §4) through real workers on fake
GPUs: each frame lands on the one device that meets its minimum, versions compare as
numbers (8.9 < 8.10, 535.104.05 < 550), a minimum no device meets waits with `job why`
naming it, and malformed versions are input errors (exit 2) on submit."""

from __future__ import annotations

import json

# Three NVIDIA cards of one host that differ only in their versions.
OLD = {
    "model": "Tesla V100-SXM2-16GB",
    "memory": "16160MiB",
    "compute_capability": "7.0",
    "driver_version": "535.104.05",
    "cuda_version": "12.2",
}
MID = {
    "model": "NVIDIA L40S",
    "memory": "46068MiB",
    "compute_capability": "8.9",
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
}
NEW = {
    "model": "NVIDIA GB200",
    "memory": "189471MiB",
    "compute_capability": "10.0",
    "driver_version": "570.86.10",
    "cuda_version": "12.8",
}
AMD = {"model": "AMD Instinct MI210", "vendor": "AMD", "memory": "64GiB", "compute_capability": "gfx90a"}


def _uuids(farm, fake) -> dict[str, str]:
    """model -> uuid, as the worker's discovery sees them."""
    listed = json.loads(farm.cuectl("gpu", "list", "--json", fake=fake).stdout)["devices"]
    return {d["model"]: d["uuid"] for d in listed}


def test_version_minimums_route_each_frame_to_the_device_that_meets_it(farm):
    fake = farm.host("versions", [OLD, MID, NEW, AMD])
    uuids = _uuids(farm, fake)
    listed = json.loads(farm.cuectl("gpu", "list", "--json", fake=fake).stdout)["devices"]
    assert {d["model"]: d["cuda_version"] for d in listed}["NVIDIA L40S"] == "12.4"

    def layer(name: str, **constraints: str) -> dict:
        return {"name": name, "command": farm.probe(), "gpus": 1, **constraints}

    job = farm.submit(
        {
            "name": "versions",
            "layers": [
                # Numeric, not textual: "10.0" >= "8.10" (a string compare says no) and only GB200 is.
                layer("cc", gpu_capability_min="8.10"),
                layer("driver", gpu_driver_min="570"),  # 550.54.15 < 570: GB200 only
                layer("cuda", gpu_cuda_min="12.5"),
                layer("mid", gpu_cuda_min="12.3", gpu_models=["L40S"]),
                layer("old_ok", gpu_driver_min="535.104.05", gpu_models=["V100"]),  # equal is enough
            ],
        }
    )
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    got = {e["env"]["CUE_LAYER"]: e["env"]["CUE_GPU_UUIDS"] for e in farm.starts()}
    assert got == {
        "cc": uuids["NVIDIA GB200"],
        "driver": uuids["NVIDIA GB200"],
        "cuda": uuids["NVIDIA GB200"],
        "mid": uuids["NVIDIA L40S"],
        "old_ok": uuids["Tesla V100-SXM2-16GB"],
    }
    shown = {layer["name"]: layer for layer in farm.job(job)["layers"]}
    assert shown["cc"]["gpu_capability_min"] == "8.10" and shown["driver"]["gpu_driver_min"] == "570"
    assert shown["cuda"]["gpu_cuda_min"] == "12.5" and shown["old_ok"]["gpu_cuda_min"] is None


def test_a_minimum_no_device_meets_waits_and_job_why_names_it(farm):
    fake = farm.host("old-farm", [OLD, AMD])
    res = farm.cuectl(
        "submit", "--name", "needs-new", "--gpus", "1", "--gpu-capability-min", "9.0", "--", *farm.probe()
    )
    job = int(res.stdout.strip())
    proc = farm.start_worker(fake)
    farm.wait_for(
        lambda: farm.cuectl("host", "show", "old-farm", "--json", check=False).returncode == 0,
        what="the host to register",
    )
    why = farm.cuectl("job", "why", str(job), check=False)
    assert "compute capability >= 9.0" in why.stdout + why.stderr, why
    assert "7.0" in why.stdout + why.stderr  # what the host has
    # `host list` filters devices by the same rules: the V100 meets 7.0 (the AMD card's gfx90a
    # is no CUDA capability), nothing meets 9.0, and a malformed version is an input error.
    listed = json.loads(farm.cuectl("host", "list", "--json", "--gpu-capability-min", "7.0").stdout)["hosts"]
    assert [(h["name"], [g["model"] for g in h["gpus"]]) for h in listed] == [("old-farm", [OLD["model"]])]
    listed = json.loads(farm.cuectl("host", "list", "--json", "--gpu-driver-min", "535.104.5").stdout)["hosts"]
    assert [g["driver_version"] for g in listed[0]["gpus"]] == ["535.104.05"]  # 05 == 5: numbers
    assert json.loads(farm.cuectl("host", "list", "--json", "--gpu-cuda-min", "12.10").stdout)["hosts"] == []
    bad = farm.cuectl("host", "list", "--gpu-cuda-min", "12.x", check=False)
    assert bad.returncode == 2 and "--gpu-cuda-min: invalid version '12.x'" in bad.stderr, bad
    proc.terminate()
    proc.wait(30)
    assert farm.starts() == []


def test_malformed_versions_are_input_errors(farm):
    for flag, value in (
        ("--gpu-capability-min", "8.x"),
        ("--gpu-driver-min", "535..104"),
        ("--gpu-cuda-min", "v12"),
        ("--gpu-cuda-min", ""),
    ):
        res = farm.cuectl("submit", "--name", "bad", "--gpus", "1", flag, value, "--", "true", check=False)
        assert res.returncode == 2, (flag, value, res)
        assert flag in res.stderr and "invalid version" in res.stderr, res.stderr
    # --dry-run shows what would be asked, as submitted.
    dry = farm.cuectl(
        "submit", "--dry-run", "--json", "--name", "x", "--gpus", "1", "--gpu-cuda-min", "12.10", "--", "true"
    )
    (layer,) = json.loads(dry.stdout)["jobs"][0]["layers"]
    assert (layer["gpu_cuda_min"], layer["gpu_capability_min"]) == ("12.10", None)
    # Without --gpus a device constraint is refused rather than ignored.
    res = farm.cuectl("submit", "--name", "bad", "--gpu-driver-min", "550", "--", "true", check=False)
    assert res.returncode == 2 and "--gpu-driver-min: only applies to GPU requests" in res.stderr
    # A spec's key: the same check, named by its path.
    path = farm.tmp / "bad.yaml"
    path.write_text('name: bad\nlayers:\n  - {name: a, command: ["true"], gpus: 1, gpu_cuda_min: 12.x}\n')
    res = farm.cuectl("submit", str(path), check=False)
    assert res.returncode == 2 and "layers[0].gpu_cuda_min: invalid version '12.x'" in res.stderr, res.stderr
