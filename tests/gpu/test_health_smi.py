"""nvidia-smi's health reading (docs/gpu-health.md): ``nvidia-smi -q -x`` of real cards
(tests/fixtures/gpu/nvidia-smi/xml) through ``parse_xml_health``. Every real capture is of
healthy cards; the sick ones are those captures with values edited in the test, named where
they are made: an uncorrectable count, a pending remap or retirement."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuectl.gpu.smi import lost_bus_ids, parse_xml_health

XML = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "nvidia-smi" / "xml"


@pytest.mark.parametrize("capture", sorted(p.name for p in XML.glob("*.xml")))
def test_real_captures_are_healthy(capture):
    health = parse_xml_health((XML / capture).read_text())
    assert health and all(h.known and not h.problems and h.lost is None and h.xids == () for h in health.values())


def test_edited_a5000_capture_pending_remap_and_uncorrectable_errors():
    text = (XML / "2x-rtx-a5000_dual-gpu.xml").read_text()
    first, rest = text.split("</gpu>", 1)
    # Edit: the first card's volatile DRAM count 2 (was N/A) and a remap pending (was No).
    first = first.replace(
        "<dram_uncorrectable>N/A</dram_uncorrectable>", "<dram_uncorrectable>2</dram_uncorrectable>", 1
    )
    first = first.replace("<remapped_row_pending>No<", "<remapped_row_pending>Yes<")
    health = parse_xml_health(first + "</gpu>" + rest)
    sick = health["GPU-12345678-aaaa-bbbb-cccc-0123456789ab"]
    assert sick.problems == (
        "uncorrectable ECC errors: 2 since the last reset",
        "row remapping pending (needs a reset)",
    )
    assert health["GPU-12345678-aaaa-bbbb-cccc-0123456789cd"].problems == ()


def test_edited_p100_capture_double_bit_total_and_pending_retirement():
    text = (XML / "tesla-p100-pcie-16gb_510.47.03.xml").read_text()
    volatile, rest = text.split("</volatile>", 1)
    # Edit: the volatile double-bit total 1 (older drivers' form), a retirement pending.
    head, double = volatile.rsplit("<double_bit>", 1)
    double = double.replace("<total>0</total>", "<total>1</total>")
    rest = rest.replace("<pending_retirement>No<", "<pending_retirement>Yes<").replace(
        "<pending_retirement>N/A<", "<pending_retirement>Yes<"
    )
    (sick,) = parse_xml_health(head + "<double_bit>" + double + "</volatile>" + rest).values()
    assert sick.problems == (
        "uncorrectable ECC errors: 1 since the last reset",
        "page retirement pending (needs a reset)",
    )


def test_a_lost_card_by_its_bus_id():
    # nvidia-smi's line for a card it cannot reach (its wording, with this bus id).
    out = "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU\n"
    assert lost_bus_ids(out) == {"0000:3b:00.0": "GPU is lost.  Reboot the system to recover this GPU"}
    assert lost_bus_ids("No devices were found\n") == {}
