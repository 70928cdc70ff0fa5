"""Secret masking of layer env (issue 17 item 13): views.mask_env's name rule, and
`job show` text and --json, masked unless --show-secrets."""

from __future__ import annotations

import pytest

from cuectl.sched.views import MASK, mask_env

SECRET_NAMES = ["GITHUB_PAT", "gitlab_pat", "PAT", "MY_PAT_2", "HF_TOKEN", "api_token", "AWS_SECRET_ACCESS_KEY",
                "OPENAI_API_KEY", "ssh_key", "SECRET", "my_secret_value", "clientSecret", "DB_PASSWORD",
                "password", "MYSQL_ROOT_PASSWORD_FILE", "PGPASS", "AUTH_HEADER", "SESSION_ID"]
PLAIN_NAMES = ["PATH", "LD_LIBRARY_PATH", "PATTERN", "SHOT", "MODE", "CUDA_VISIBLE_DEVICES", "SPATIAL_RES",
               "PYTHONPATH"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_masked(name):
    assert mask_env({name: "hunter2"}) == {name: MASK}


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_plain_names_visible(name):
    assert mask_env({name: "v"}) == {name: "v"}


ENV = ["GITHUB_PAT=ghp_abc", "HF_TOKEN=hf_xyz", "OPENAI_API_KEY=sk-123", "APP_SECRET_X=s3", "DB_PASSWORD=pw",
       "PATH=/usr/bin", "SHOT=010"]
SECRET_VALUES = ["ghp_abc", "hf_xyz", "sk-123", "s3", "pw"]


@pytest.fixture
def job(cli):
    args = [a for kv in ENV for a in ("--env", kv)]
    res = cli("submit", "--name", "masked", "--export", "NONE", *args, "--", "true")  # only what --env sets
    assert res.exit_code == 0, res
    return res.stdout.strip()


def test_job_show_text_masks_env(cli, job):
    res = cli("job", "show", job)
    assert res.exit_code == 0, res
    out = res.stdout
    assert "ENV" in out and "VALUE" in out
    for value in SECRET_VALUES:
        assert value not in out
    for name in ("GITHUB_PAT", "HF_TOKEN", "OPENAI_API_KEY", "APP_SECRET_X", "DB_PASSWORD"):
        assert f"main\t{name}\t***" in out, out
    assert "main\tPATH\t/usr/bin" in out and "main\tSHOT\t010" in out


def test_job_show_text_show_secrets(cli, job):
    out = cli("job", "show", job, "--show-secrets").stdout
    for value in SECRET_VALUES:
        assert value in out
    assert "***" not in out


def test_job_show_json_consistent(cli, job):
    env = cli("job", "show", job, "--json").json()["layers"][0]["env"]
    assert env == {"GITHUB_PAT": "***", "HF_TOKEN": "***", "OPENAI_API_KEY": "***", "APP_SECRET_X": "***",
                   "DB_PASSWORD": "***", "PATH": "/usr/bin", "SHOT": "010"}
    env = cli("job", "show", job, "--json", "--show-secrets").json()["layers"][0]["env"]
    assert env["GITHUB_PAT"] == "ghp_abc" and env["DB_PASSWORD"] == "pw"


def test_job_show_without_env_has_no_env_table(cli):
    job_id = cli("submit", "--name", "bare", "--export", "NONE", "--", "true").stdout.strip()
    out = cli("job", "show", job_id).stdout
    assert "VALUE" not in out


def test_job_show_env_value_with_newline_stays_one_row(cli):
    job_id = cli("submit", "--name", "nl", "--env", "NOTE=a\nb", "--", "true").stdout.strip()
    out = cli("job", "show", job_id).stdout
    assert "main\tNOTE\t'a\\nb'" in out, out
