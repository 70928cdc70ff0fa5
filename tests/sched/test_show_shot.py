"""A job's show and shot (OpenCue's job metadata): the spec keys and flags, the store (job
JSON, `job list` filters, the claim, `admin report --by show`) on SQLite and PostgreSQL, the
OpenCue XML importer, and CUE_SHOW/CUE_SHOT in a frame run by a real worker."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.opencue_xml import parse_opencue_xml
from cuectl.sched.spec import spec_from_flags, spec_from_mapping
from cuectl.sched.store import FrameResult

NOW = 1_700_000_000.0
FIXTURES = Path(__file__).parents[1] / "fixtures" / "opencue"


def spec(name="j", frames="1-2", **job):
    return spec_from_mapping(
        {"name": name, **job, "layers": [{"name": "l", "command": ["true"], "range": frames}]}, user="alice"
    )


def test_spec_keys_and_flags():
    s = spec(show="fx", shot="sh010", project="p")
    assert (s.show, s.shot, s.project) == ("fx", "sh010", "p")
    assert (spec().show, spec().shot) == (None, None)
    f = spec_from_flags(name="f", command=["true"], show="demo", shot="sh_020.a", user="alice")
    assert (f.show, f.shot) == ("demo", "sh_020.a")
    for key, value, message in (
        ("show", "a b", "show: invalid show name 'a b'"),
        ("shot", "x/y", "shot: invalid shot name 'x/y'"),
        ("show", "--", "show: invalid show name"),
        ("shot", 7, "shot: expected a string"),
    ):
        with pytest.raises(InvalidInput, match=message):
            spec(**{key: value})
    with pytest.raises(InvalidInput, match="--shot: invalid shot name"):
        spec_from_flags(name="f", command=["true"], shot="a b", user="alice")


def test_store_records_filters_and_claims_them(store):
    fx = store.submit(spec("a", show="fx", shot="sh010"), now=NOW)
    fx2 = store.submit(spec("b", show="fx", shot="sh020"), now=NOW)
    anim = store.submit(spec("c", show="anim", shot="sh010"), now=NOW)
    bare = store.submit(spec("d"), now=NOW)
    got = store.get_job(fx)
    assert (got["show"], got["shot"]) == ("fx", "sh010")
    assert (store.get_job(bare)["show"], store.get_job(bare)["shot"]) == (None, None)
    listed = {j["id"]: (j["show"], j["shot"]) for j in store.list_jobs()}
    assert listed == {fx: ("fx", "sh010"), fx2: ("fx", "sh020"), anim: ("anim", "sh010"), bare: (None, None)}
    assert [j["id"] for j in store.list_jobs(show="fx")] == [fx, fx2]
    assert [j["id"] for j in store.list_jobs(shot="sh010")] == [fx, anim]
    assert [j["id"] for j in store.list_jobs(show="fx", shot="sh010")] == [fx]
    assert [j["id"] for j in store.list_jobs(show="fx", limit=1, newest_first=True)] == [fx2]
    assert (store.count_jobs(show="fx"), store.count_jobs(shot="sh010"), store.count_jobs(show="none")) == (2, 2, 0)
    # What a worker is handed carries them (CUE_SHOW, CUE_SHOT).
    claimed = {}
    for layer in store.runnable_layers():
        c = store.claim_frame(layer.layer_id, host="h", worker="h:1", gpu_uuids=[], now=NOW, lease_s=60)
        assert c is not None
        claimed[c.job_id] = (c.show, c.shot)
    assert claimed == {fx: ("fx", "sh010"), fx2: ("fx", "sh020"), anim: ("anim", "sh010"), bare: (None, None)}


def test_report_by_show(store):
    ids = [
        store.submit(spec(n, frames=f, **kw), now=NOW)
        for n, f, kw in (
            ("a", "1-2", {"show": "fx", "project": "p1"}),
            ("b", "1", {"show": "fx"}),
            ("c", "1-3", {"project": "p1"}),
        )
    ]
    for layer in store.runnable_layers():
        while (
            c := store.claim_frame(layer.layer_id, host="h", worker="h:1", gpu_uuids=[], now=NOW, lease_s=60)
        ) is not None:
            store.complete_frame(
                c.frame_id, c.attempt, FrameResult(exit_code=0, started_at=NOW, ended_at=NOW + 10), now=NOW + 10
            )
    assert len(ids) == 3
    groups, total = store.usage_summary(since=NOW - 100, until=NOW + 100, by="show")
    frames = {g.key: g.frames for g in groups}
    assert frames == {("fx",): 3, (None,): 3}  # jobs without a show: None, the report's "-"
    assert total is not None and total.frames == 6
    from cuectl import report

    assert report.describe("show", (None,))[0] == "-" and report.describe("show", ("fx",))[0] == "fx"


def test_opencue_show_and_shot():
    ((mapping, notes),) = parse_opencue_xml(
        (FIXTURES / "show_alias.xml").read_text(), source="x.xml", submitter="testuser"
    )
    assert (mapping["show"], mapping["shot"], mapping["project"]) == ("fx", "home", "fx")
    s = spec_from_mapping(mapping, user="testuser")
    assert (s.show, s.shot, s.project) == ("fx", "home", "fx")
    ((_, bad_notes),) = parse_opencue_xml(
        (FIXTURES / "jobspec_invalid_shot.xml").read_text(), source="x.xml", submitter="testuser"
    )
    assert any("<shot>" in str(n) and "invalid/shot" in str(n) for n in bad_notes)


# -- a real worker runs a frame ------------------------------------------------------------------
def test_frames_see_cue_show_and_cue_shot(tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1] / "worker"))
    from farmlib import Farm

    farm = Farm(tmp_path)
    try:
        out = tmp_path / "seen"
        out.mkdir()
        record = [
            "sh",
            "-c",
            f'printf "%s|%s|%s" "${{CUE_SHOW-unset}}" "${{CUE_SHOT-unset}}" "$CUE_JOB" > {out}/"$CUE_JOB_ID"',
        ]
        with_show = farm.submit(
            {"name": "lit", "show": "fx", "shot": "sh010", "layers": [{"name": "r", "command": record}]}
        )
        without = farm.submit({"name": "plain", "layers": [{"name": "r", "command": record}]})
        res = farm.run_worker(None)
        assert res.returncode == 0, res.stderr
        assert (out / str(with_show)).read_text() == "fx|sh010|lit"
        assert (out / str(without)).read_text() == "||plain"  # set, empty: as OpenCue always sets them
        shown = json.loads(farm.cuectl("job", "show", str(with_show), "--json").stdout)
        assert (shown["show"], shown["shot"], shown["state"]) == ("fx", "sh010", "FINISHED")
    finally:
        farm.cleanup()
