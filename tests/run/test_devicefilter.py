"""``--devices`` / ``--exclude-devices`` selection and GPU-aware NIMBY (foreign use)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuectl.errors import InvalidInput
from cuectl.gpu.device import Device, DeviceSample, ProcessSample
from cuectl.run.devicefilter import foreign_use, select_inventory
from cuectl.units import GIB, MIB


def gpu(
    index: int,
    uuid: str,
    *,
    total: int | None = 24 * GIB,
    free: int | None = 24 * GIB,
    util: float | None = 0.0,
    parent: str | None = None,
) -> Device:
    return Device(
        index=index,
        uuid=uuid,
        vendor="NVIDIA",
        model="NVIDIA RTX A5000",
        backend="fake",
        memory_total_bytes=total,
        memory_free_bytes=free,
        utilization_pct=util,
        mig_parent_uuid=parent,
    )


G0 = gpu(0, "GPU-aaaa1111-0000-0000-0000-000000000000")
G1 = gpu(1, "GPU-bbbb2222-0000-0000-0000-000000000000")
G2 = gpu(2, "GPU-bbbb3333-0000-0000-0000-000000000000")
G3 = gpu(3, "GPU-cccc4444-0000-0000-0000-000000000000")
PLAIN = [G0, G1, G2, G3]

# An A100 with MIG on, as NVML lists it: the card itself left out, its instances indexed.
CARD = "GPU-dddd5555-0000-0000-0000-000000000000"
M1 = gpu(1, "MIG-11111111-0000-0000-0000-000000000000", parent=CARD, util=None)
M2 = gpu(2, "MIG-22222222-0000-0000-0000-000000000000", parent=CARD, util=None)
MIG_HOST = [G0, M1, M2]


def uuids(devices: list[Device]) -> list[str]:
    return [d.uuid for d in devices]


# --------------------------------------------------------------------------- selection


def test_no_flags_keeps_everything_in_order() -> None:
    assert select_inventory(PLAIN, None, []) == PLAIN
    assert select_inventory(PLAIN, [], ()) == PLAIN


def test_include_by_index_keeps_inventory_order() -> None:
    assert select_inventory(PLAIN, ["2", "1"], []) == [G1, G2]
    assert select_inventory(PLAIN, ["2,1"], []) == [G1, G2]
    assert select_inventory(PLAIN, [" 3 , 0 ,"], []) == [G0, G3]


def test_include_by_uuid_case_insensitive_and_by_prefix() -> None:
    assert select_inventory(PLAIN, [G3.uuid.lower()], []) == [G3]
    assert select_inventory(PLAIN, [G3.uuid.upper()], []) == [G3]
    assert select_inventory(PLAIN, ["gpu-aaaa1"], []) == [G0]  # unique prefix of 9 chars


def test_exclude_alone_and_exclude_wins() -> None:
    assert select_inventory(PLAIN, None, ["0"]) == [G1, G2, G3]
    assert select_inventory(PLAIN, ["0,1"], ["1"]) == [G0]
    assert select_inventory(PLAIN, ["0"], ["0"]) == []  # the caller decides if empty is an error
    assert select_inventory(PLAIN, None, ["0,1,2,3"]) == []


def test_duplicates_are_harmless() -> None:
    assert select_inventory(PLAIN, ["1", "1", G1.uuid], ["2", "2"]) == [G1]


def test_unknown_item_names_it_and_lists_indices() -> None:
    with pytest.raises(InvalidInput) as info:
        select_inventory(PLAIN, ["1,7"], [])
    message = str(info.value)
    assert message == ("--devices: no device '7' on this host (indices: 0, 1, 2, 3; or a UUID from `cuectl gpu list`)")
    assert info.value.exit_code == 2
    with pytest.raises(InvalidInput, match=r"^--exclude-devices: no device 'GPU-zzzz' "):
        select_inventory(PLAIN, None, ["GPU-zzzz"])


def test_short_or_ambiguous_prefix_is_refused() -> None:
    with pytest.raises(InvalidInput, match="no device 'GPU-aaa'"):  # under 8 characters
        select_inventory(PLAIN, ["GPU-aaa"], [])
    with pytest.raises(InvalidInput, match=r"UUID prefix 'GPU-bbbb' matches 2 devices .*give more of it"):
        select_inventory(PLAIN, ["GPU-bbbb"], [])


def test_blank_include_is_an_error_not_everything() -> None:
    with pytest.raises(InvalidInput, match="--devices: names no device"):
        select_inventory(PLAIN, [" , "], [])


def test_no_gpus_message() -> None:
    with pytest.raises(InvalidInput, match=r"indices: none, no GPU found"):
        select_inventory([], ["0"], [])


def test_field_names_are_the_callers() -> None:
    with pytest.raises(InvalidInput, match=r"^devices: no device '9'"):
        select_inventory(PLAIN, ["9"], [], include_field="devices")


def test_mig_card_uuid_names_its_instances() -> None:
    assert select_inventory(MIG_HOST, [CARD], []) == [M1, M2]
    assert select_inventory(MIG_HOST, [CARD.lower()[:12]], []) == [M1, M2]  # prefix of the card
    assert select_inventory(MIG_HOST, None, [CARD]) == [G0]
    assert select_inventory(MIG_HOST, [CARD], [M2.uuid]) == [M1]
    assert select_inventory(MIG_HOST, ["2"], []) == [M2]  # an instance by its own index


def test_mig_card_listed_with_its_instances_by_index() -> None:
    card = gpu(3, CARD)
    host = [G0, card, M1, M2]
    assert select_inventory(host, ["3"], []) == [card, M1, M2]
    assert select_inventory(host, None, ["3"]) == [G0]


def test_ambiguous_index_asks_for_a_uuid() -> None:
    twin = gpu(0, "GPU-eeee6666-0000-0000-0000-000000000000")
    with pytest.raises(InvalidInput, match="device index 0 is ambiguous"):
        select_inventory([G0, twin], ["0"], [])


def test_a_bare_string_is_one_item() -> None:
    assert select_inventory(PLAIN, "1,2", "2") == [G1]


@given(
    st.lists(st.sampled_from(["0", "1", "2", "3"]), max_size=4),
    st.lists(st.sampled_from(["0", "1", "2", "3"]), max_size=4),
)
def test_selection_is_an_ordered_subset(include: list[str], exclude: list[str]) -> None:
    got = select_inventory(PLAIN, include or None, exclude)
    assert got == [d for d in PLAIN if d in got]
    wanted = {int(i) for i in include} if include else {0, 1, 2, 3}
    assert {d.index for d in got} == wanted - {int(i) for i in exclude}


# --------------------------------------------------------------------------- NIMBY


def busy(device: Device, used: int, util: float | None) -> Device:
    total = device.memory_total_bytes
    assert total is not None
    return Device(
        index=device.index,
        uuid=device.uuid,
        vendor=device.vendor,
        model=device.model,
        backend=device.backend,
        memory_total_bytes=total,
        memory_free_bytes=total - used,
        utilization_pct=util,
        mig_parent_uuid=device.mig_parent_uuid,
    )


def test_reason_text_for_the_flag_example() -> None:
    d = busy(G0, int(3.1 * GIB), 45.0)
    got = foreign_use([d], set(), max_memory_bytes=GIB, max_util_pct=20)
    assert got == {G0.uuid: "in use by another process: 3.1 GiB used, 45 % busy (NIMBY threshold 1 GiB / 20 %)"}


def test_idle_and_below_threshold_devices_are_not_reported() -> None:
    devices = [busy(G0, 300 * MIB, 3.0), busy(G1, GIB, 20.0)]  # equal to the threshold: not above
    assert foreign_use(devices, set(), max_memory_bytes=GIB, max_util_pct=20) == {}


def test_either_check_triggers_on_its_own() -> None:
    mem_only = busy(G0, 2 * GIB, 0.0)
    util_only = busy(G1, 100 * MIB, 90.0)
    got = foreign_use([mem_only, util_only], set(), max_memory_bytes=GIB, max_util_pct=50)
    assert got == {
        G0.uuid: "in use by another process: 2 GiB used, 0 % busy (NIMBY threshold 1 GiB / 50 %)",
        G1.uuid: "in use by another process: 100 MiB used, 90 % busy (NIMBY threshold 1 GiB / 50 %)",
    }


def test_leased_devices_are_ours() -> None:
    devices = [busy(G0, 20 * GIB, 100.0), busy(G1, 20 * GIB, 100.0)]
    assert list(foreign_use(devices, {G0.uuid}, max_memory_bytes=GIB, max_util_pct=None)) == [G1.uuid]


def test_thresholds_off() -> None:
    d = busy(G0, 20 * GIB, 100.0)
    assert foreign_use([d], set(), max_memory_bytes=None, max_util_pct=None) == {}
    assert foreign_use([d], set(), max_memory_bytes=None, max_util_pct=50) == {
        G0.uuid: "in use by another process: 20 GiB used, 100 % busy (NIMBY threshold 50 %)"
    }
    assert foreign_use([d], set(), max_memory_bytes=512 * MIB, max_util_pct=None) == {
        G0.uuid: "in use by another process: 20 GiB used, 100 % busy (NIMBY threshold 512 MiB)"
    }


def test_zero_threshold_means_any_use() -> None:
    assert list(foreign_use([busy(G0, 1, None)], set(), max_memory_bytes=0, max_util_pct=None)) == [G0.uuid]
    assert foreign_use([busy(G0, 0, 0.0)], set(), max_memory_bytes=0, max_util_pct=0) == {}


def test_unknown_values_never_trigger() -> None:
    unknown = [gpu(0, G0.uuid, total=None, free=None, util=None), gpu(1, G1.uuid, total=24 * GIB, free=None, util=None)]
    assert foreign_use(unknown, set(), max_memory_bytes=0, max_util_pct=0) == {}
    # Known utilisation with unknown memory: the reason shows only what is known.
    d = gpu(2, G2.uuid, total=None, free=None, util=80.0)
    assert foreign_use([d], set(), max_memory_bytes=GIB, max_util_pct=10) == {
        G2.uuid: "in use by another process: 80 % busy (NIMBY threshold 1 GiB / 10 %)"
    }


def test_mig_instances_and_their_card() -> None:
    card = busy(gpu(3, CARD), 30 * GIB, 100.0)  # the card's numbers are its instances' use
    m1 = busy(M1, 5 * GIB, None)
    m2 = busy(M2, 5 * GIB, None)
    host = [card, m1, m2]
    # m1 is ours; m2 is used by someone else; the card itself is never judged.
    assert list(foreign_use(host, {M1.uuid}, max_memory_bytes=GIB, max_util_pct=10)) == [M2.uuid]
    # The whole card leased: its instances are ours too.
    assert foreign_use(host, {CARD}, max_memory_bytes=GIB, max_util_pct=10) == {}
    # MIG instances report no utilisation: only memory can trigger.
    assert foreign_use([m2], set(), max_memory_bytes=None, max_util_pct=0) == {}


def test_samples_override_the_snapshot() -> None:
    stale = busy(G0, 20 * GIB, 100.0)
    fresh = DeviceSample(uuid=G0.uuid, timestamp=1.0, utilization_pct=1.0, memory_used_bytes=100 * MIB)
    assert foreign_use([stale], set(), max_memory_bytes=GIB, max_util_pct=20, samples={G0.uuid: fresh}) == {}
    # A sample with only free memory: used = total (from the device) - free.
    only_free = DeviceSample(uuid=G0.uuid, timestamp=1.0, memory_free_bytes=20 * GIB)
    got = foreign_use([G0], set(), max_memory_bytes=GIB, max_util_pct=None, samples={G0.uuid: only_free})
    assert got == {G0.uuid: "in use by another process: 4 GiB used (NIMBY threshold 1 GiB)"}


def test_cuectl_processes_are_subtracted() -> None:
    sample = DeviceSample(
        uuid=G0.uuid,
        timestamp=1.0,
        utilization_pct=70.0,
        memory_used_bytes=6 * GIB,
        processes=(ProcessSample(pid=100, memory_used_bytes=5 * GIB, utilization_pct=60.0),),
    )
    # pid 100 is a cuectl frame that escaped its lease's device (or one not yet recorded):
    # what is left, 1 GiB and 10 %, is someone else's.
    assert (
        foreign_use(
            [G0], set(), max_memory_bytes=2 * GIB, max_util_pct=20, samples={G0.uuid: sample}, cuectl_pids={100}
        )
        == {}
    )
    got = foreign_use(
        [G0], set(), max_memory_bytes=512 * MIB, max_util_pct=5, samples={G0.uuid: sample}, cuectl_pids={100}
    )
    assert got == {G0.uuid: "in use by another process: 1 GiB used, 10 % busy (NIMBY threshold 512 MiB / 5 %)"}
    # Not a cuectl pid: nothing is subtracted.
    assert G0.uuid in foreign_use(
        [G0], set(), max_memory_bytes=2 * GIB, max_util_pct=None, samples={G0.uuid: sample}, cuectl_pids={999}
    )


def test_cuectl_process_with_unknown_share_makes_the_value_unknown() -> None:
    sample = DeviceSample(
        uuid=G0.uuid,
        timestamp=1.0,
        utilization_pct=90.0,
        memory_used_bytes=20 * GIB,
        processes=(ProcessSample(pid=100, memory_used_bytes=None, utilization_pct=None),),
    )
    assert (
        foreign_use([G0], set(), max_memory_bytes=GIB, max_util_pct=10, samples={G0.uuid: sample}, cuectl_pids=[100])
        == {}
    )


def test_negative_thresholds_are_bad_input() -> None:
    with pytest.raises(InvalidInput, match="memory threshold"):
        foreign_use([G0], set(), max_memory_bytes=-1, max_util_pct=None)
    with pytest.raises(InvalidInput, match="utilisation threshold"):
        foreign_use([G0], set(), max_memory_bytes=None, max_util_pct=-5)


@given(
    used=st.integers(0, 24 * GIB),
    util=st.one_of(st.none(), st.floats(0, 100)),
    mem_limit=st.one_of(st.none(), st.integers(0, 24 * GIB)),
    util_limit=st.one_of(st.none(), st.floats(0, 100)),
)
def test_triggers_exactly_when_a_known_value_is_above_its_limit(
    used: int, util: float | None, mem_limit: int | None, util_limit: float | None
) -> None:
    d = busy(G0, used, util)
    got = foreign_use([d], set(), max_memory_bytes=mem_limit, max_util_pct=util_limit)
    expected = (mem_limit is not None and used > mem_limit) or (
        util_limit is not None and util is not None and util > util_limit
    )
    assert (G0.uuid in got) == expected
    if expected:
        assert got[G0.uuid].startswith("in use by another process: ") and "(NIMBY threshold " in got[G0.uuid]
    assert foreign_use([d], {G0.uuid}, max_memory_bytes=mem_limit, max_util_pct=util_limit) == {}
