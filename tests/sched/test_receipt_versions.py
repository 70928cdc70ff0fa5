"""Receipt versions (sched/identity.py): a version-2 receipt's digest covers every value a
command token expands into (the job's name too), a version-1 receipt (no "v") still proves
a layer whose command uses no `#JOB#` token, and an unknown version proves nothing. Runs as
any user: the receipts are this process's own (tests/worker/test_token_proof.py has the
root worker and real users)."""

from __future__ import annotations

import json
import os
import pwd

import pytest

from cuectl.errors import Unproven
from cuectl.sched import identity

ME = pwd.getpwuid(os.getuid()).pw_name
LAYER = {"layer": "w", "env": {"A": "1"}, "frame_range": "1-3", "chunk": 1, "cwd": "/tmp"}


def receipt(tmp_path, body: dict) -> str:
    name = f"{body['job']}-{os.urandom(4).hex()}.json"
    (tmp_path / name).write_text(json.dumps(body))
    return name


def check(tmp_path, name: str, command, job_name: str = "render", **extra) -> None:
    identity.check_layer(
        user=ME,
        job_id=7,
        command=command,
        submitted_by=None,
        receipt=name,
        spool=tmp_path,
        job_name=job_name,
        **LAYER,
        **extra,
    )


def test_a_version_2_receipt_covers_the_job_name_show_and_shot(tmp_path):
    command = ["sh", "-c", "echo #JOB#"]
    digests = {
        "w": identity.layer_digest(job_id=7, user=ME, command=command, job_name="render", show="s", shot="010", **LAYER)
    }
    name = identity.write_receipt(tmp_path, job_id=7, user=ME, digests=digests)
    assert json.loads((tmp_path / name).read_text())["v"] == identity.RECEIPT_VERSION == 2
    check(tmp_path, name, command, show="s", shot="010")
    for changed in ({"job_name": "$(id > /tmp/pwned)"}, {"show": "x"}, {"shot": None}):
        with pytest.raises(Unproven, match="is not what .* job's name, show or shot"):
            check(tmp_path, name, command, **{"show": "s", "shot": "010", **changed})


def test_a_version_1_receipt_proves_a_command_without_the_name_token(tmp_path):
    plain = ["sh", "-c", "render --frame #IFRAME# --layer #LAYER# #FRAME# #FRAMESPEC#"]
    named = "render --job #JOB#"
    digests = {"w": identity.layer_digest(job_id=7, user=ME, command=plain, version=1, **LAYER)}
    name = receipt(tmp_path, {"job": 7, "user": ME, "layers": digests})
    check(tmp_path, name, plain)
    check(tmp_path, name, plain, job_name="renamed by anyone")  # no token expands it: nothing to prove
    with pytest.raises(Unproven, match="is not what"):
        check(tmp_path, name, ["sh", "-c", "other"])
    old = receipt(
        tmp_path,
        {
            "job": 7,
            "user": ME,
            "layers": {"w": identity.layer_digest(job_id=7, user=ME, command=named, version=1, **LAYER)},
        },
    )
    with pytest.raises(Unproven, match="older cuectl .* the #JOB# token.*: resubmit the job"):
        check(tmp_path, old, named)


@pytest.mark.parametrize("version", [3, 0, "2", None, 1.5])
def test_a_receipt_of_an_unknown_version_proves_nothing(tmp_path, version):
    command = ["true"]
    digests = {"w": identity.layer_digest(job_id=7, user=ME, command=command, job_name="render", **LAYER)}
    name = receipt(tmp_path, {"v": version, "job": 7, "user": ME, "layers": digests})
    with pytest.raises(Unproven, match="newer than this cuectl" if version == 3 else "not a cuectl receipt"):
        check(tmp_path, name, command)


def test_the_digests_of_the_two_versions_differ_and_version_2_needs_the_name():
    one = identity.layer_digest(job_id=7, user=ME, command=["true"], version=1, **LAYER)
    two = identity.layer_digest(job_id=7, user=ME, command=["true"], job_name="render", **LAYER)
    assert one != two
    with pytest.raises(ValueError):
        identity.layer_digest(job_id=7, user=ME, command=["true"], **LAYER)
