"""Hostile and odd input, property-based: only our typed errors, never a traceback."""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuectl.errors import InvalidInput
from cuectl.gpu.device import Device
from cuectl.sched.match import GpuRequest, model_matches, select_devices
from cuectl.units import parse_duration, parse_size, parse_time

ODD_TEXT = st.one_of(
    st.text(max_size=60),
    st.text(alphabet=string.digits + "KMGTPBiIb .-+eE_xX", max_size=20),
    st.text(alphabet=string.digits + "smhdwSMHDW .:-TZ+", max_size=30),
)


@given(ODD_TEXT)
def test_sizes_parse_or_raise_invalid_input(text: str) -> None:
    try:
        value = parse_size(text)
    except InvalidInput as exc:
        assert "size" in exc.message
    else:
        assert isinstance(value, int) and value >= 0


@given(ODD_TEXT)
def test_durations_parse_or_raise_invalid_input(text: str) -> None:
    try:
        value = parse_duration(text)
    except InvalidInput as exc:
        assert "duration" in exc.message
    else:
        assert value >= 0


@given(ODD_TEXT)
def test_times_parse_or_raise_invalid_input(text: str) -> None:
    try:
        parse_time(text, now=1_700_000_000.0)
    except InvalidInput:
        pass


@given(st.text(max_size=80), st.text(max_size=80))
def test_model_patterns_never_crash(pattern: str, model: str) -> None:
    assert model_matches(pattern, model) in (True, False)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=60)
@given(st.lists(st.text(max_size=30), max_size=4), st.text(max_size=40), st.integers(0, 3))
def test_selection_with_odd_patterns_and_models(patterns: list[str], model: str, gpus: int) -> None:
    devices = [
        Device(index=i, uuid=f"GPU-{i}", vendor="NVIDIA", model=model, backend="fake", memory_total_bytes=16 << 30)
        for i in range(2)
    ]
    result = select_devices(GpuRequest(gpus=gpus, gpu_models=tuple(patterns)), devices)
    assert result.devices is None or len(result.devices) == gpus


def test_very_long_inputs_are_refused_quickly(cli, tmp_path):
    huge_name = "n" * 100_000
    res = cli("submit", "--name", huge_name, "--", "true")
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and len(res.stderr) < 2000
    res = cli("submit", "--name", "x", "--range", ",".join(["1-2"] * 50_000), "--", "true")
    assert res.exit_code in (0, 2) and "Traceback" not in res.stderr
    res = cli("submit", "--name", "x", "--range", "9" * 5000, "--", "true")
    assert res.exit_code == 2 and len(res.stderr) < 2000
