"""`job list --user --state --name --limit` and `host list --vendor --model
--gpu-memory-min` (GPU host filtering): real stores, the CLI through the same error mapping
as the executable."""

from __future__ import annotations

import time

import pytest

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import HostInfo, open_store

GIB = 1024**3


def _gpu(i: int, uuid: str, vendor: str, model: str, memory_gib: float) -> dict:
    return {
        "index": i,
        "uuid": uuid,
        "vendor": vendor,
        "model": model,
        "backend": "fake",
        "memory_total_bytes": int(memory_gib * GIB),
    }


def test_job_list_filters(cli, db_path):
    store = open_store(str(db_path))
    ids = {}
    for name, user in (("shot010-light", "ann"), ("shot010-comp", "ann"), ("shot020-light", "bob"), ("train", "bob")):
        ids[name] = store.submit(
            spec_from_mapping({"name": name, "layers": [{"name": "a", "command": ["true"]}]}, user=user),
            now=time.time(),
        )
    store.close()
    assert cli("job", "kill", str(ids["train"]), "--force").exit_code == 0

    def names(*args: str) -> list[str]:
        return [j["name"] for j in cli("job", "list", "--json", *args).json()["jobs"]]

    assert names("--user", "ann") == ["shot010-light", "shot010-comp"]
    assert names("--name", "shot0?0-light") == ["shot010-light", "shot020-light"]
    assert names("--state", "killed") == ["train"] and names("--state", "FINISHED") == ["train"]
    assert names("--state", "pending", "--user", "bob") == ["shot020-light"]
    assert names("--limit", "2") == ["shot020-light", "train"]
    for args, needle in ((["--state", "done"], "--state"), (["--limit", "0"], "--limit")):
        res = cli("job", "list", *args)
        assert res.exit_code == 2 and needle in res.stderr


def test_host_list_filters_by_gpu(cli, db_path):
    store = open_store(str(db_path), create=True)
    now = time.time()
    store.register_host(
        HostInfo(
            name="a100-box",
            cores=32,
            memory_bytes=256 * GIB,
            gpus=[
                _gpu(0, "GPU-a0", "NVIDIA", "NVIDIA A100-SXM4-80GB", 79.3),
                _gpu(1, "GPU-a1", "NVIDIA", "NVIDIA A10", 22.5),
            ],
        ),
        now=now,
    )
    store.register_host(
        HostInfo(
            name="ws-4090",
            cores=16,
            memory_bytes=64 * GIB,
            gpus=[_gpu(0, "GPU-r0", "NVIDIA", "NVIDIA GeForce RTX 4090", 23.6)],
        ),
        now=now,
    )
    store.register_host(
        HostInfo(
            name="mi-box", cores=16, memory_bytes=64 * GIB, gpus=[_gpu(0, "GPU-m0", "AMD", "AMD Instinct MI210", 64.0)]
        ),
        now=now,
    )
    store.register_host(HostInfo(name="cpu-only", cores=8, memory_bytes=32 * GIB, gpus=[]), now=now)
    store.close()

    def hosts(*args: str) -> dict[str, list[str]]:
        return {h["name"]: [g["uuid"] for g in h["gpus"]] for h in cli("host", "list", "--json", *args).json()["hosts"]}

    assert set(hosts()) == {"a100-box", "ws-4090", "mi-box", "cpu-only"}
    assert hosts("--vendor", "amd") == {"mi-box": ["GPU-m0"]}
    assert hosts("--model", "A10") == {"a100-box": ["GPU-a1"]}  # whole words: not the A100
    assert hosts("--model", "*A100*") == {"a100-box": ["GPU-a0"]}
    # Nominal sizes, as the scheduler matches them: the 23.6 GiB "24 GB" card has 24G.
    assert hosts("--gpu-memory-min", "24G") == {"a100-box": ["GPU-a0"], "ws-4090": ["GPU-r0"], "mi-box": ["GPU-m0"]}
    assert hosts("--vendor", "nvidia", "--gpu-memory-min", "40G") == {"a100-box": ["GPU-a0"]}
    text = cli("host", "list", "--model", "4090").stdout
    assert "ws-4090" in text and "a100-box" not in text
    res = cli("host", "list", "--gpu-memory-min", "lots")
    assert res.exit_code == 2 and "--gpu-memory-min" in res.stderr


@pytest.mark.parametrize("value, expected", [("24G", 24 * GIB), ("24576", 24 * GIB), ("", None), (None, None)])
def test_memory_minimum_parses_like_the_job_spec(value, expected):
    from cuectl.sched.hostfilter import parse_memory_min

    assert parse_memory_min(value, "--gpu-memory-min") == expected
