"""Device matching (DESIGN §5): pure functions, so real values in, real values out."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuectl.gpu.device import Device
from cuectl.sched.match import (
    CpuPool,
    GpuRequest,
    MatchResult,
    cpu_fits,
    device_fits,
    device_fits_now,
    device_fits_statically,
    explain_hosts,
    model_matches,
    select_devices,
    tags_fit,
)
from cuectl.units import GIB, MIB

A100 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-16GB"
RTX4090 = "NVIDIA GeForce RTX 4090"


def dev(
    index: int,
    *,
    model: str = V100,
    vendor: str = "NVIDIA",
    total: int | None = 16160 * MIB,
    free: int | None = None,
    uuid: str | None = None,
    parent: str | None = None,
) -> Device:
    return Device(
        index=index,
        uuid=uuid or f"GPU-{index:04d}",
        vendor=vendor,
        model=model,
        backend="fake",
        memory_total_bytes=total,
        memory_free_bytes=free,
        mig_parent_uuid=parent,
    )


def uuids(result: MatchResult) -> list[str]:
    assert result.devices is not None, result.reason
    return [d.uuid for d in result.devices]


# --------------------------------------------------------------------------- model_matches


@pytest.mark.parametrize(
    ("pattern", "model"),
    [
        ("A100", A100),
        ("a100", A100),
        ("A100-SXM4", A100),
        ("a100 sxm4 80gb", A100),
        ("A100_SXM4", A100),
        ("NVIDIA A100", A100),
        ("RTX 4090", RTX4090),
        ("rtx-4090", RTX4090),
        ("rtx_4090", RTX4090),
        ("  RTX   4090 ", RTX4090),
        ("GeForce", RTX4090),
        ("4090", RTX4090),
        ("M3 Max", "Apple M3 Max"),
        ("V100", V100),
        ("Tesla V100", V100),
        ("MI300X", "AMD Instinct MI300X"),
    ],
)
def test_model_words_match(pattern: str, model: str) -> None:
    assert model_matches(pattern, model)


@pytest.mark.parametrize(
    ("pattern", "model"),
    [
        ("A10", A100),  # a prefix of a word is not a word
        ("100", A100),
        ("SXM", A100),
        ("A100 80GB", A100),  # words present but not consecutive
        ("80GB A100", A100),  # wrong order
        ("RTX 409", RTX4090),
        ("4090 RTX", RTX4090),
        ("M3 Pro", "Apple M3 Max"),
        ("Max M3", "Apple M3 Max"),
        ("V100S", V100),
        ("GeForce RTX 4090 Ti", RTX4090),
    ],
)
def test_model_words_do_not_match(pattern: str, model: str) -> None:
    assert not model_matches(pattern, model)


def test_model_single_word_of_multiword_name_matches() -> None:
    assert model_matches("M3", "Apple M3 Max")
    assert model_matches("Max", "Apple M3 Max")


@pytest.mark.parametrize(
    ("pattern", "model", "expected"),
    [
        ("*4090", RTX4090, True),
        ("*4090", "NVIDIA GeForce RTX 4090 D", False),  # glob is on the FULL name
        ("*4090*", "NVIDIA GeForce RTX 4090 D", True),
        ("nvidia a100*", A100, True),
        ("NVIDIA A100*", A100, True),
        ("nvidia a100*", "Tesla A100", False),
        ("a100*", A100, False),  # anchored at the start, unlike word matching
        ("*A10-*", A100, False),
        ("*a100-sxm?-80gb", A100, True),
        ("?", A100, False),
        ("?", "X", True),
        ("?", "", False),
        ("*", A100, True),
        ("Tesla V100-SXM2-??GB", V100, True),
        ("Tesla V100-SXM2-?GB", V100, False),
        ("*m3 max", "Apple M3 Max", True),
    ],
)
def test_model_globs(pattern: str, model: str, expected: bool) -> None:
    assert model_matches(pattern, model) is expected


@pytest.mark.parametrize("pattern", ["", " ", "\t", "-", " _- "])
def test_blank_pattern_matches_nothing(pattern: str) -> None:
    assert not model_matches(pattern, A100)
    assert not model_matches(pattern, "")


def test_square_brackets_without_wildcards_are_words() -> None:
    # Only '*' and '?' switch to glob mode; '[' alone is part of a word.
    assert not model_matches("[A]100", A100)
    assert model_matches("[A]100", "Weird [A]100 card")


# --------------------------------------------------------------------------- device_fits


def test_device_fits_any_request() -> None:
    assert device_fits(GpuRequest(gpus=1), dev(0)) is None


def test_vendor_mismatch_reason() -> None:
    reason = device_fits(GpuRequest(gpus=1, gpu_vendor="NVIDIA"), dev(0, vendor="AMD", model="Radeon RX 7900 XTX"))
    assert reason == "vendor AMD != NVIDIA"


@pytest.mark.parametrize("req_vendor", ["NVIDIA", "nvidia", "Nvidia", " NVIDIA "])
@pytest.mark.parametrize("dev_vendor", ["NVIDIA", "nvidia", "NVIDIA Corporation"])
def test_vendor_case_insensitive(req_vendor: str, dev_vendor: str) -> None:
    assert device_fits(GpuRequest(gpus=1, gpu_vendor=req_vendor), dev(0, vendor=dev_vendor)) is None


def test_model_mismatch_reason() -> None:
    reason = device_fits(GpuRequest(gpus=1, gpu_models=("V100",)), dev(0, model=A100, total=80 * GIB))
    assert reason == f"model '{A100}' not in ['V100']"


def test_any_of_models() -> None:
    req = GpuRequest(gpus=1, gpu_models=("H100", "A100"))
    assert device_fits(req, dev(0, model=A100, total=80 * GIB)) is None
    assert device_fits(req, dev(0, model=V100)) is not None


def test_rtx4090_24564mib_satisfies_24g() -> None:
    card = dev(0, model=RTX4090, total=24564 * MIB)
    assert device_fits(GpuRequest(gpus=1, gpu_memory_min_bytes=24 * GIB), card) is None
    assert device_fits(GpuRequest(gpus=1, gpu_memory_min_bytes=25 * GIB), card) is not None


def test_v100_16160mib_satisfies_16g_not_17g() -> None:
    card = dev(0)
    assert device_fits(GpuRequest(gpus=1, gpu_memory_min_bytes=16 * GIB), card) is None
    reason = device_fits(GpuRequest(gpus=1, gpu_memory_min_bytes=17 * GIB), card)
    assert reason == "memory 15.8 GiB < 17.0 GiB"


def test_memory_reason_format() -> None:
    reason = device_fits(GpuRequest(gpus=1, gpu_memory_min_bytes=24 * GIB), dev(0, total=16 * GIB))
    assert reason == "memory 16.0 GiB < 24.0 GiB"


def test_unknown_total_memory_fails_a_memory_request_only() -> None:
    card = dev(0, total=None)
    assert device_fits(GpuRequest(gpus=1), card) is None
    assert device_fits(GpuRequest(gpus=1, gpu_memory_min_bytes=1 * GIB), card) == "memory unknown < 1.0 GiB"


def test_free_memory_below_request_is_not_now() -> None:
    req = GpuRequest(gpus=1, gpu_memory_min_bytes=8 * GIB)
    card = dev(0, model=RTX4090, total=24564 * MIB, free=2 * GIB)
    assert device_fits_statically(req, card) is None  # could run it one day …
    assert device_fits_now(req, card) == "free memory 2.0 GiB < 8.0 GiB"  # … but not now
    assert device_fits(req, card) == "free memory 2.0 GiB < 8.0 GiB"


def test_unknown_free_memory_never_rules_a_device_out() -> None:
    req = GpuRequest(gpus=1, gpu_memory_min_bytes=8 * GIB, gpu_memory_free_min_bytes=8 * GIB)
    assert device_fits(req, dev(0, free=None)) is None


def test_free_min_checked_against_free_memory() -> None:
    req = GpuRequest(gpus=1, gpu_memory_free_min_bytes=8 * GIB)
    assert device_fits(req, dev(0, free=10 * GIB)) is None
    assert device_fits(req, dev(0, free=6 * GIB)) == "free memory 6.0 GiB < 8.0 GiB"
    # min_free is literal: 7.9 GiB free is not 8 GiB free.
    assert device_fits(req, dev(0, free=8 * GIB - 100 * MIB)) is not None


def test_threshold_is_max_of_memory_min_and_min_free() -> None:
    req = GpuRequest(gpus=1, gpu_memory_min_bytes=4 * GIB, gpu_memory_free_min_bytes=12 * GIB)
    assert device_fits(req, dev(0, free=10 * GIB)) == "free memory 10.0 GiB < 12.0 GiB"
    req = GpuRequest(gpus=1, gpu_memory_min_bytes=12 * GIB, gpu_memory_free_min_bytes=4 * GIB)
    assert device_fits(req, dev(0, free=10 * GIB)) == "free memory 10.0 GiB < 12.0 GiB"


def test_idle_24gb_card_with_a_few_mib_reserved_takes_a_24g_frame() -> None:
    # An idle 4090 reports e.g. 24564 MiB total, ~24561 MiB free: still a "24 GB" card now.
    card = dev(0, model=RTX4090, total=24564 * MIB, free=24561 * MIB)
    assert device_fits(GpuRequest(gpus=1, gpu_memory_min_bytes=24 * GIB), card) is None
    # A desktop session holding a GiB of it makes it ineligible now.
    held = dev(0, model=RTX4090, total=24564 * MIB, free=23 * GIB)
    assert device_fits_now(GpuRequest(gpus=1, gpu_memory_min_bytes=24 * GIB), held) is not None


def test_min_free_larger_than_the_card_never_fits() -> None:
    req = GpuRequest(gpus=1, gpu_memory_free_min_bytes=32 * GIB)
    assert device_fits_statically(req, dev(0, model=RTX4090, total=24564 * MIB)) == "memory 24.0 GiB < 32.0 GiB"


def test_static_reason_wins_over_free_memory() -> None:
    req = GpuRequest(gpus=1, gpu_vendor="AMD", gpu_memory_min_bytes=8 * GIB)
    assert device_fits(req, dev(0, free=1 * GIB)) == "vendor NVIDIA != AMD"


def test_apple_unified_memory_counts_its_total() -> None:
    mac = Device(0, "apple-0", "Apple", "Apple M3 Max", "apple", memory_total_bytes=64 * GIB, unified_memory=True)
    req = GpuRequest(gpus=1, gpu_vendor="Apple", gpu_models=("M3 Max",), gpu_memory_min_bytes=32 * GIB)
    assert device_fits(req, mac) is None


# --------------------------------------------------------------------------- select_devices


def test_zero_gpus_needs_nothing() -> None:
    assert select_devices(GpuRequest(gpus=0), []) == MatchResult(devices=(), reason=None, could_ever_fit=True)
    assert select_devices(GpuRequest(gpus=0, gpu_vendor="AMD"), [dev(0)]).devices == ()


def test_no_gpu_host() -> None:
    result = select_devices(GpuRequest(gpus=1), [])
    assert result.devices is None and not result.could_ever_fit
    assert result.reason == "needs 1 GPU device; host has no GPU"


def test_busy_desktop_gpu_skipped_idle_one_chosen() -> None:
    desktop = dev(0, model=RTX4090, total=24564 * MIB, free=1 * GIB)
    idle = dev(1, model=RTX4090, total=24564 * MIB, free=24 * GIB)
    result = select_devices(GpuRequest(gpus=1, gpu_memory_min_bytes=8 * GIB), [desktop, idle])
    assert uuids(result) == [idle.uuid]
    assert result.reason is None and result.could_ever_fit


def test_only_desktop_gpu_held_is_not_now() -> None:
    desktop = dev(0, model=RTX4090, total=24564 * MIB, free=1 * GIB)
    result = select_devices(GpuRequest(gpus=1, gpu_memory_min_bytes=8 * GIB), [desktop])
    assert result.devices is None and result.could_ever_fit
    assert result.reason is not None and "gpu 0 free memory 1.0 GiB < 8.0 GiB" in result.reason


def test_prefers_smallest_that_fits() -> None:
    big = dev(0, model=A100, total=80 * GIB)
    mid = dev(1, model=RTX4090, total=24564 * MIB)
    small = dev(2, total=16160 * MIB)
    result = select_devices(GpuRequest(gpus=1, gpu_memory_min_bytes=16 * GIB), [big, mid, small])
    assert uuids(result) == [small.uuid]
    result = select_devices(GpuRequest(gpus=2, gpu_memory_min_bytes=16 * GIB), [big, mid, small])
    assert uuids(result) == [small.uuid, mid.uuid]
    result = select_devices(GpuRequest(gpus=1, gpu_memory_min_bytes=20 * GIB), [big, mid, small])
    assert uuids(result) == [mid.uuid]


def test_ties_broken_by_index_and_unknown_memory_last() -> None:
    devices = [dev(3, total=None), dev(2), dev(1), dev(0, total=None)]
    assert uuids(select_devices(GpuRequest(gpus=3), devices)) == ["GPU-0001", "GPU-0002", "GPU-0000"]


def test_two_needed_only_one_matching_never_fits() -> None:
    devices = [dev(0, model=A100, total=80 * GIB), dev(1)]
    result = select_devices(GpuRequest(gpus=2, gpu_models=("A100",)), devices)
    assert result.devices is None
    assert result.could_ever_fit is False
    assert result.reason == "needs 2 devices matching model 'A100'; host has 1 matching"


def test_two_matching_one_busy_fits_later() -> None:
    devices = [dev(0), dev(1)]
    req = GpuRequest(gpus=2, gpu_vendor="NVIDIA", gpu_memory_min_bytes=16 * GIB)
    result = select_devices(req, devices, busy={"GPU-0000"})
    assert result.devices is None
    assert result.could_ever_fit is True
    assert result.reason == "needs 2 NVIDIA devices with >= 16 GiB; host has 2 matching, 1 available (gpu 0 busy)"


def test_busy_device_skipped_for_next() -> None:
    result = select_devices(GpuRequest(gpus=1), [dev(0), dev(1)], busy=["GPU-0000"])
    assert uuids(result) == ["GPU-0001"]


def test_summed_memory_never_counts() -> None:
    two_12g = [dev(0, model="Tesla K80", total=12 * GIB), dev(1, model="Tesla K80", total=12 * GIB)]
    for gpus in (1, 2):
        result = select_devices(GpuRequest(gpus=gpus, gpu_memory_min_bytes=24 * GIB), two_12g)
        assert result.devices is None and not result.could_ever_fit
        assert "memory >= 24 GiB" in (result.reason or "")


def test_vendor_reason_lists_the_host() -> None:
    result = select_devices(GpuRequest(gpus=1, gpu_vendor="AMD"), [dev(i) for i in range(4)])
    assert not result.could_ever_fit
    assert result.reason == "no device matches vendor AMD (host has NVIDIA Tesla V100-SXM2-16GB ×4)"


def test_mixed_vendor_host_picks_the_requested_vendor() -> None:
    devices = [dev(0, vendor="AMD", model="AMD Instinct MI300X", total=192 * GIB), dev(1, vendor="NVIDIA")]
    assert uuids(select_devices(GpuRequest(gpus=1, gpu_vendor="amd"), devices)) == ["GPU-0000"]
    assert uuids(select_devices(GpuRequest(gpus=1, gpu_vendor="NVIDIA"), devices)) == ["GPU-0001"]


def test_mig_parents_skipped() -> None:
    parent = dev(0, model=A100, total=80 * GIB, uuid="GPU-card")
    mig1 = dev(1, model="NVIDIA A100-SXM4-80GB MIG 3g.40gb", total=40 * GIB, uuid="MIG-1", parent="GPU-card")
    mig2 = dev(2, model="NVIDIA A100-SXM4-80GB MIG 3g.40gb", total=40 * GIB, uuid="MIG-2", parent="GPU-card")
    inventory = [parent, mig1, mig2]
    # 80G only exists as the parent, which is not leasable while its instances are listed.
    result = select_devices(GpuRequest(gpus=1, gpu_memory_min_bytes=80 * GIB), inventory)
    assert result.devices is None and not result.could_ever_fit
    assert uuids(select_devices(GpuRequest(gpus=2, gpu_models=("A100",)), inventory)) == ["MIG-1", "MIG-2"]
    assert not select_devices(GpuRequest(gpus=3), inventory).could_ever_fit
    # A card without instances listed is leasable as a whole.
    assert uuids(select_devices(GpuRequest(gpus=1, gpu_memory_min_bytes=80 * GIB), [parent])) == ["GPU-card"]


def test_mig_instance_of_a_busy_card_is_busy() -> None:
    mig = dev(1, total=40 * GIB, uuid="MIG-1", parent="GPU-card")
    result = select_devices(GpuRequest(gpus=1), [mig], busy={"GPU-card"})
    assert result.devices is None and result.could_ever_fit


def test_duplicate_uuid_is_one_device() -> None:
    result = select_devices(GpuRequest(gpus=2), [dev(0, uuid="same"), dev(1, uuid="same")])
    assert result.devices is None and not result.could_ever_fit


def test_not_now_reason_lists_every_blocker_briefly() -> None:
    devices = [dev(i, free=1 * GIB) for i in range(8)]
    result = select_devices(GpuRequest(gpus=1, gpu_memory_min_bytes=8 * GIB), devices)
    assert result.could_ever_fit and result.reason is not None
    assert "host has 8 matching, 0 available" in result.reason
    assert "+4 more" in result.reason


def test_model_reason_on_host() -> None:
    result = select_devices(GpuRequest(gpus=1, gpu_vendor="NVIDIA", gpu_models=("A100",)), [dev(0), dev(1)])
    assert result.reason == "no device matches vendor NVIDIA, model 'A100' (host has NVIDIA Tesla V100-SXM2-16GB ×2)"


def test_too_many_gpus_on_host() -> None:
    result = select_devices(GpuRequest(gpus=9), [dev(i) for i in range(4)])
    assert result.reason == "needs 9 GPU devices; host has only 4"
    assert not result.could_ever_fit


def test_select_does_not_mutate_or_depend_on_input_list() -> None:
    devices = [dev(2), dev(0), dev(1)]
    before = list(devices)
    select_devices(GpuRequest(gpus=2), devices)
    assert devices == before


# --------------------------------------------------------------------------- explain_hosts


V100_HOST = [dev(i) for i in range(4)]


def test_explain_no_hosts() -> None:
    assert explain_hosts(GpuRequest(gpus=1), {}) == "no host registered"
    assert explain_hosts(GpuRequest(gpus=0), {}) == "no host registered"


def test_explain_fits_somewhere() -> None:
    hosts = {"render-01": V100_HOST, "render-02": [dev(0, model=A100, total=80 * GIB)]}
    assert explain_hosts(GpuRequest(gpus=1, gpu_models=("A100",)), hosts) is None
    assert explain_hosts(GpuRequest(gpus=0, gpu_vendor="AMD"), {"cpu-01": []}) is None
    # Busy/free memory never enters the farm explanation: it is static.
    full = {"render-01": [dev(0, free=0)]}
    assert explain_hosts(GpuRequest(gpus=1, gpu_memory_min_bytes=8 * GIB), full) is None


def test_explain_vendor() -> None:
    reason = explain_hosts(GpuRequest(gpus=1, gpu_vendor="AMD"), {"render-01": V100_HOST})
    assert (
        reason
        == "no registered host has 1 device matching vendor AMD (hosts have: NVIDIA Tesla V100-SXM2-16GB ×4 on render-01)"
    )


def test_explain_count() -> None:
    reason = explain_hosts(GpuRequest(gpus=9), {"render-01": V100_HOST, "render-02": V100_HOST[:2], "cpu-01": []})
    assert reason == "no registered host has 9 GPU devices (most: 4 on render-01)"


def test_explain_count_after_a_constraint() -> None:
    hosts = {
        "render-01": V100_HOST,
        "render-02": [dev(0, model=A100, total=80 * GIB), dev(1, model=A100, total=80 * GIB)],
    }
    reason = explain_hosts(GpuRequest(gpus=3, gpu_models=("A100",)), hosts)
    assert reason == "no registered host has 3 devices matching model 'A100' (most: 2 on render-02)"


def test_explain_memory() -> None:
    req = GpuRequest(gpus=1, gpu_vendor="NVIDIA", gpu_memory_min_bytes=24 * GIB)
    reason = explain_hosts(req, {"render-01": V100_HOST})
    assert reason is not None
    assert reason.startswith("no registered host has 1 device matching vendor NVIDIA, memory >= 24 GiB (hosts have: ")
    assert "15.8 GiB" in reason and "on render-01" in reason


def test_explain_summed_memory_does_not_count() -> None:
    hosts = {"k80": [dev(0, total=12 * GIB), dev(1, total=12 * GIB)]}
    assert explain_hosts(GpuRequest(gpus=1, gpu_memory_min_bytes=24 * GIB), hosts) is not None


def test_explain_only_cpu_hosts() -> None:
    reason = explain_hosts(GpuRequest(gpus=1), {"cpu-01": [], "cpu-02": []})
    assert reason == "no registered host has 1 GPU device (hosts have: no GPUs)"


def test_explain_is_one_line_for_a_big_farm() -> None:
    hosts = {f"render-{i:02d}": V100_HOST for i in range(40)}
    reason = explain_hosts(GpuRequest(gpus=1, gpu_vendor="AMD"), hosts)
    assert reason is not None and "\n" not in reason
    assert "+36 more hosts" in reason


def test_explain_mixed_farm_names_each_inventory() -> None:
    hosts = {"b": [dev(0, model=A100, total=80 * GIB)], "a": V100_HOST}
    reason = explain_hosts(GpuRequest(gpus=1, gpu_vendor="Apple"), hosts)
    assert reason == (
        "no registered host has 1 device matching vendor Apple "
        "(hosts have: NVIDIA Tesla V100-SXM2-16GB ×4 on a; NVIDIA A100-SXM4-80GB on b)"
    )


# --------------------------------------------------------------------------- CPU pool, tags


def test_cpu_fits() -> None:
    pool = CpuPool(cores=4.0, memory_bytes=16 * GIB)
    assert cpu_fits(4, 16 * GIB, pool) is None
    assert cpu_fits(0.5, 0, pool) is None
    assert cpu_fits(4.5, 0, pool) == "cores 4.5 > 4 free"
    assert cpu_fits(1, 17 * GIB, pool) == "memory 17.0 GiB > 16.0 GiB free"


def test_cpu_fits_tolerates_float_noise() -> None:
    free = 1.0 - 0.7  # 0.30000000000000004 … or 0.29999999999999993
    assert cpu_fits(0.3, 0, CpuPool(cores=free, memory_bytes=0)) is None


@pytest.mark.parametrize(
    ("layer", "host", "expected"),
    [
        ((), (), True),
        ((), ("gpu", "linux"), True),
        (("gpu",), ("gpu", "linux"), True),
        (("gpu", "linux"), ("gpu", "linux"), True),
        (("gpu", "mac"), ("gpu", "linux"), False),
        (("gpu",), (), False),
        (("GPU",), ("gpu",), True),
    ],
)
def test_tags_fit(layer: tuple[str, ...], host: tuple[str, ...], expected: bool) -> None:
    assert tags_fit(layer, host) is expected


# --------------------------------------------------------------------------- properties

MODELS = (V100, A100, RTX4090, "AMD Instinct MI300X", "Apple M3 Max")
VENDOR_OF = {V100: "NVIDIA", A100: "NVIDIA", RTX4090: "NVIDIA", "AMD Instinct MI300X": "AMD", "Apple M3 Max": "Apple"}
SIZES = st.one_of(st.none(), st.sampled_from([8 * GIB, 12 * GIB, 16160 * MIB, 24564 * MIB, 40 * GIB, 80 * GIB]))


@st.composite
def inventories(draw: st.DrawFn) -> list[Device]:
    n = draw(st.integers(min_value=0, max_value=8))
    out = []
    for i in range(n):
        model = draw(st.sampled_from(MODELS))
        total = draw(SIZES)
        free = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=total or 80 * GIB)))
        # Indexes may collide (two backends): the uuid keeps the order total.
        index = draw(st.integers(min_value=0, max_value=n))
        out.append(dev(index, model=model, vendor=VENDOR_OF[model], total=total, free=free, uuid=f"GPU-{i}"))
    return out


requests = st.builds(
    GpuRequest,
    gpus=st.integers(min_value=0, max_value=5),
    gpu_vendor=st.sampled_from([None, "NVIDIA", "AMD", "Apple", "nvidia"]),
    gpu_models=st.lists(st.sampled_from(["A100", "V100", "RTX 4090", "*4090", "M3 Max", "A10"]), max_size=2).map(tuple),
    gpu_memory_min_bytes=st.sampled_from([0, 8 * GIB, 16 * GIB, 24 * GIB, 48 * GIB]),
    gpu_memory_free_min_bytes=st.sampled_from([0, 0, 4 * GIB, 20 * GIB]),
)


@settings(max_examples=300, deadline=None)
@given(request=requests, devices=inventories(), data=st.data())
def test_property_chosen_devices_are_valid(request: GpuRequest, devices: list[Device], data: st.DataObject) -> None:
    busy = data.draw(st.sets(st.sampled_from([d.uuid for d in devices]))) if devices else set()
    result = select_devices(request, devices, busy=busy)
    if result.devices is None:
        assert result.reason
        return
    assert result.reason is None and result.could_ever_fit
    chosen = result.devices
    assert len(chosen) == request.gpus
    assert len({d.uuid for d in chosen}) == len(chosen)
    for d in chosen:
        assert d.uuid not in busy
        assert device_fits(request, d) is None
        assert d in devices


@settings(max_examples=300, deadline=None)
@given(request=requests, devices=inventories(), seed=st.integers(), data=st.data())
def test_property_deterministic_under_permutation(
    request: GpuRequest, devices: list[Device], seed: int, data: st.DataObject
) -> None:
    busy = data.draw(st.sets(st.sampled_from([d.uuid for d in devices]))) if devices else set()
    shuffled = list(devices)
    random.Random(seed).shuffle(shuffled)
    assert select_devices(request, devices, busy=busy) == select_devices(request, shuffled, busy=busy)


@settings(max_examples=300, deadline=None)
@given(request=requests, devices=inventories())
def test_property_static_fit_and_idle_host_agree(request: GpuRequest, devices: list[Device]) -> None:
    # could_ever_fit depends on static facts only, and on an idle host with free memory
    # unknown, "could ever fit" means "fits now".
    idle = [dataclasses.replace(d, memory_free_bytes=None) for d in devices]
    everyone_busy = select_devices(request, devices, busy={d.uuid for d in devices})
    now = select_devices(request, idle)
    assert everyone_busy.could_ever_fit == now.could_ever_fit
    assert (now.devices is not None) == now.could_ever_fit
    # The farm explainer agrees with the per-host answer.
    assert (explain_hosts(request, {"h": devices}) is None) == now.could_ever_fit


@settings(max_examples=200, deadline=None)
@given(request=requests, devices=inventories())
def test_property_smallest_first(request: GpuRequest, devices: list[Device]) -> None:
    result = select_devices(request, devices)
    if not result.devices:
        return
    worst = max((d.memory_total_bytes or float("inf")) for d in result.devices)
    for d in devices:
        if d not in result.devices and device_fits(request, d) is None:
            assert (d.memory_total_bytes or float("inf")) >= worst
