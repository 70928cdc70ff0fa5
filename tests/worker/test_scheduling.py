"""Fair, explainable dispatch with real workers (issue 16): reservations for frames that need
more devices than are free, no window of unrunnable layers, device selection, GPU NIMBY, a
host schedule, retry back-off and failure reasons."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from farmlib import A100, V100, cuectl_cmd

T4 = {"model": "Tesla T4", "vendor": "NVIDIA", "memory": "15360MiB"}
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def uuids_of(event) -> list[str]:
    raw = event["env"]["CUE_GPU_UUIDS"]
    return [u for u in raw.split(",") if u] if raw else []


def devices_of(farm, fake) -> dict[int, str]:
    """index -> uuid, as `cuectl gpu list` shows them."""
    return {
        d["index"]: d["uuid"] for d in json.loads(farm.cuectl("gpu", "list", "--json", fake=fake).stdout)["devices"]
    }


def host_live(farm, name: str) -> dict:
    res = farm.cuectl("host", "show", name, "--json", check=False)
    return (json.loads(res.stdout).get("live") or {}) if res.returncode == 0 else {}  # {}: not registered yet


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


# -- 1. reservations ----------------------------------------------------------------------------------------
def test_a_multi_gpu_frame_reserves_devices_as_they_free_up_and_others_backfill(farm):
    """A priority-100 frame needing 4 A100s behind a stream of 1-GPU frames: the A100s are
    held for it as they free up (no new small frame starts on them), the T4 it cannot use
    keeps taking small frames, and it starts as soon as the four are free."""
    fake = farm.host("resv-a", [A100, A100, A100, A100, T4])
    small = farm.submit(
        {
            "name": "sweep",
            "priority": 0,
            "layers": [{"name": "s", "command": farm.probe("--sleep", "2"), "range": "1-30", "gpus": 1}],
        }
    )
    proc = farm.start_worker(fake)
    farm.wait_for(lambda: len(farm.starts()) >= 5, what="five small frames running")
    submitted = time.time()
    big = farm.submit(
        {
            "name": "big",
            "priority": 100,
            "layers": [{"name": "train", "command": farm.probe("--sleep", "1"), "gpus": 4, "gpu_models": ["A100"]}],
        }
    )
    # While it waits, the host says what it holds and for whom.
    live = farm.wait_for(
        lambda: (host_live(farm, "resv-a").get("dispatch") or {}).get("reservation"),
        timeout=15,
        what="the reservation to be published",
    )
    assert live["job"] == "big" and live["job_id"] == big and "4" in live["needs"] and "A100" in live["needs"]
    farm.wait_for(
        lambda: any(e["env"]["CUE_JOB"] == "big" for e in farm.starts()), timeout=20, what="the 4-GPU frame to start"
    )
    stop(proc)
    said = proc.stderr.read()
    assert f"reserving GPUs for job {big} (big) layer train: needs 4" in said, said
    uuids = devices_of(farm, fake)
    t4 = uuids[4]
    big_start = next(e for e in farm.starts() if e["env"]["CUE_JOB"] == "big")
    # Started once the small frames running at submit time ended (2 s), not after the sweep.
    assert big_start["t"] - submitted < 2 + 3, big_start["t"] - submitted
    # A small frame that started after the big one was seen (a pass under way may still
    # claim: 0.5 s) and before it ran used the T4 only.
    between = [e for e in farm.starts() if e["env"]["CUE_JOB"] == "sweep" and submitted + 0.5 < e["t"] < big_start["t"]]
    assert all(uuids_of(e) == [t4] for e in between), [uuids_of(e) for e in between]
    assert sorted(uuids_of(big_start)) == sorted(uuids[i] for i in range(4))
    assert any(f["state"] == "WAITING" for f in farm.frames(small)), "the big frame did not wait for the sweep"


def test_a_reservation_that_cannot_be_met_lapses_after_its_timeout(farm):
    """A device held by a lease that never ends: the 2-GPU frame can never start, so after
    --reservation-timeout the 1-GPU frames behind it run anyway."""
    fake = farm.host("resv-b", [V100, V100])
    env = farm.env(CUECTL_FAKE_GPUS=str(fake))
    holder = subprocess.Popen(
        [*cuectl_cmd(), "run", "--gpus", "1", "--no-wait", "--", "sleep", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    farm.procs.append(holder)
    farm.wait_for(
        lambda: (
            "sleep" in farm.cuectl("gpu", "leases", fake=fake).stdout
            or json.loads(farm.cuectl("gpu", "leases", "--json", fake=fake).stdout)
        ),
        what="the lease",
    )
    big = farm.submit({"name": "pair", "priority": 50, "layers": [{"name": "p", "command": farm.probe(), "gpus": 2}]})
    small = farm.submit(
        {"name": "singles", "layers": [{"name": "s", "command": farm.probe(), "range": "1-3", "gpus": 1}]}
    )
    proc = farm.start_worker(fake, "--reservation-timeout", "1.5")
    farm.wait_for(
        lambda: (host_live(farm, "resv-b").get("dispatch") or {}).get("reservation"),
        timeout=15,
        what="the pair's reservation",
    )
    assert not farm.starts(), "nothing backfills while the reservation holds"
    farm.wait_for(
        lambda: {f["state"] for f in farm.frames(small)} == {"SUCCEEDED"},
        timeout=30,
        what="the singles to run once the reservation lapsed",
    )
    assert {f["state"] for f in farm.frames(big)} == {"WAITING"}
    stop(proc)


# -- 2. no window of unrunnable layers --------------------------------------------------------------------
def test_runnable_work_is_found_behind_any_number_of_unrunnable_layers(farm):
    from cuectl.sched.spec import spec_from_mapping
    from cuectl.sched.store import open_store

    store = open_store(str(farm.db))
    try:
        for i in range(260):  # more than any page the worker reads at once
            store.submit(
                spec_from_mapping(
                    {
                        "name": f"amd-{i}",
                        "priority": 10,
                        "layers": [{"name": "r", "command": ["true"], "gpus": 1, "gpu_vendor": "AMD"}],
                    }
                ),
                now=time.time(),
            )
    finally:
        store.close()
    cpu = farm.submit({"name": "cpu", "priority": 0, "layers": [{"name": "c", "command": farm.probe()}]})
    res = farm.run_worker(farm.host("window", [V100]), timeout=120)
    assert res.returncode == 0, res.stderr
    assert {f["state"] for f in farm.frames(cpu)} == {"SUCCEEDED"}


# -- 7. device selection ------------------------------------------------------------------------------------
def test_a_worker_uses_only_the_devices_it_is_given(farm):
    fake = farm.host("select", [V100, V100, V100])
    uuids = devices_of(farm, fake)
    job = farm.submit(
        {"name": "sel", "layers": [{"name": "g", "command": farm.probe("--sleep", "0.3"), "range": "1-6", "gpus": 1}]}
    )
    res = farm.run_worker(fake, "--exclude-devices", "0")
    assert res.returncode == 0, res.stderr
    used = {u for e in farm.starts() for u in uuids_of(e)}
    assert used == {uuids[1], uuids[2]}
    assert {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"}
    shown = json.loads(farm.cuectl("host", "show", "select", "--json").stdout)
    assert sorted(g["uuid"] for g in shown["gpus"]) == sorted([uuids[1], uuids[2]])
    farm.submit({"name": "sel2", "layers": [{"name": "g", "command": farm.probe(), "range": "1-3", "gpus": 1}]})
    res = farm.run_worker(fake, "--devices", uuids[2])
    assert res.returncode == 0, res.stderr
    assert {u for e in farm.starts()[6:] for u in uuids_of(e)} == {uuids[2]}


def test_a_device_that_does_not_exist_is_refused_before_anything_changes(farm, tmp_path: Path):
    fake = farm.host("select-bad", [V100])
    db = tmp_path / "never.db"
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), "worker", "--until-idle", "--devices", "7"],
        env=farm.env(CUECTL_FAKE_GPUS=str(fake)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.startswith("error: --devices: no device '7'") and res.stderr.count("\n") <= 2, res.stderr
    assert not db.exists()


# -- 8. GPU-aware NIMBY -------------------------------------------------------------------------------------
def test_a_device_another_program_uses_gets_no_frame_until_it_is_gone(farm):
    fake = farm.host("nimby", [V100, V100], state=True)
    uuids = devices_of(farm, fake)
    state = farm.tmp / "nimby-state"
    # The artist's 3D app holds 3 GiB of GPU 0 (no cuectl lease): a device the worker must leave alone.
    (state / "0.json").write_text(json.dumps({"utilization_pct": 35, "memory_used_bytes": 3 << 30}))
    farm.submit(
        {"name": "n", "layers": [{"name": "g", "command": farm.probe("--sleep", "0.2"), "range": "1-4", "gpus": 1}]}
    )
    proc = farm.start_worker(fake, "--nimby-memory", "1G")
    farm.wait_for(lambda: len(farm.starts()) == 4, what="the frames to run on GPU 1", timeout=30)
    assert {u for e in farm.starts() for u in uuids_of(e)} == {uuids[1]}
    live = farm.wait_for(lambda: (host_live(farm, "nimby").get("dispatch") or {}).get("devices"), what="dispatch")
    assert live[uuids[0]]["state"] == "nimby" and "another process" in live[uuids[0]]["holder"], live
    # The program exits: GPU 0 takes frames again.
    (state / "0.json").unlink()
    farm.submit(
        {"name": "n2", "layers": [{"name": "g", "command": farm.probe("--sleep", "1"), "range": "1-2", "gpus": 1}]}
    )
    farm.wait_for(lambda: len(farm.starts()) == 6, what="two more frames")
    assert {u for e in farm.starts()[4:] for u in uuids_of(e)} == {uuids[0], uuids[1]}
    stop(proc)


# -- 9. host schedule ---------------------------------------------------------------------------------------
def test_a_worker_outside_its_schedule_takes_nothing_and_says_why(farm):
    tomorrow = DAYS[(datetime.now() + timedelta(days=1)).weekday()]
    today = DAYS[datetime.now().weekday()]
    job = farm.submit({"name": "sched", "layers": [{"name": "c", "command": farm.probe()}]})
    proc = farm.start_worker(farm.host("sched", []), "--available", tomorrow)
    dispatch = farm.wait_for(lambda: host_live(farm, "sched").get("dispatch"), what="the dispatch doc")
    assert dispatch["accepting"] is False
    assert "outside the host's schedule" in dispatch["schedule"]["reason"]
    time.sleep(0.5)
    assert farm.starts() == [] and {f["state"] for f in farm.frames(job)} == {"WAITING"}
    stop(proc)
    res = farm.run_worker(farm.host("sched", []), "--available", f"{today}, {tomorrow}")
    assert res.returncode == 0, res.stderr
    assert {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"}
    bad = farm.cuectl("worker", "--until-idle", "--available", "Mon-Fry 19:00-08:00", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --available:"), bad.stderr


# -- 10, 11. retry back-off and failure reasons ---------------------------------------------------------------
def test_failed_frames_back_off_and_say_why_and_hopeless_ones_do_not_retry(farm):
    oom = (
        "import sys; print('step 12'); "
        "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total)',"
        " file=sys.stderr); sys.exit(1)"
    )
    job = farm.submit(
        {
            "name": "fails",
            "layers": [
                {"name": "oom", "command": [sys.executable, "-c", oom], "retries": 1, "retry_delay": "1.5s"},
                {"name": "missing", "command": ["sh", "-c", "exec /nonexistent/render-tool"], "retries": 3},
                {"name": "noexec", "command": ["/nonexistent/render-tool"], "retries": 3},
            ],
        }
    )
    res = farm.run_worker(None, timeout=60)
    assert res.returncode == 0, res.stderr
    frames = {f["layer"]: f for f in farm.frames(job)}
    assert frames["oom"]["state"] == "DEAD" and frames["oom"]["attempts"] == 2
    assert frames["oom"]["failure"].startswith("GPU out of memory: torch.OutOfMemoryError: CUDA out of memory")
    # The command is not there: DEAD after one attempt, retries left unspent.
    assert (frames["missing"]["state"], frames["missing"]["attempts"]) == ("DEAD", 1)
    assert "not found" in frames["missing"]["failure"]
    assert (frames["noexec"]["state"], frames["noexec"]["attempts"]) == ("DEAD", 1)
    shown = json.loads(farm.cuectl("frame", "show", str(frames["oom"]["id"]), "--json").stdout)
    history = shown["attempt_history"]
    assert [a["failure_kind"] for a in history] == ["gpu-oom", "gpu-oom"]
    # The second attempt waited out the back-off after the first ended.
    first_end, second_start = history[0]["ended_at"], history[1]["started_at"]
    gap = datetime.fromisoformat(second_start.replace("Z", "+00:00")) - datetime.fromisoformat(
        first_end.replace("Z", "+00:00")
    )
    assert gap.total_seconds() >= 1.4, gap


# -- 12. work too big for the host: --until-idle says so -------------------------------------------------------
def test_until_idle_says_when_waiting_work_needs_more_than_this_host_has(farm):
    small = farm.submit({"name": "fits", "layers": [{"name": "c", "command": farm.probe()}]})
    big = farm.submit({"name": "sim", "layers": [{"name": "s", "command": farm.probe(), "cores": 64}]})
    res = farm.run_worker(farm.host("tiny", []), "--cores", "2")
    assert res.returncode == 1, res.stderr
    assert f"job {big} (sim) layer s needs 64 cores; this host has 2 cores" in res.stderr
    assert {f["state"] for f in farm.frames(small)} == {"SUCCEEDED"}
    assert {f["state"] for f in farm.frames(big)} == {"WAITING"}


def test_frame_show_and_job_show_tell_the_failure_and_the_caps(farm):
    farm.submit({"name": "first", "layers": [{"name": "a", "command": ["true"]}]})  # admin commands need a store
    farm.cuectl("admin", "limit", "set", "licence", "2")
    job = farm.submit(
        {
            "name": "told",
            "project": "show-a",
            "max_gpus": 4,
            "layers": [
                {
                    "name": "gone",
                    "command": ["sh", "-c", "exec /nonexistent/tool"],
                    "limits": ["licence"],
                    "max_running": 1,
                    "retry_delay": "5s",
                }
            ],
        }
    )
    assert farm.run_worker(None).returncode == 0
    frame = farm.frames(job)[0]
    text = farm.cuectl("frame", "show", str(frame["id"])).stdout
    assert "command not found (exit 127)" in text
    shown = farm.cuectl("job", "show", str(job)).stdout
    assert "show-a" in shown and "max_gpus 4" in shown
    assert "licence" in shown and "5s" in shown
