"""Secret masking of layer env (issue 17 item 13): views.mask_env's name rule, and
`job show` text and --json, masked unless --show-secrets."""

from __future__ import annotations

import pytest

from cuectl.sched.views import MASK, mask_env

SECRET_NAMES = [
    "GITHUB_PAT",
    "gitlab_pat",
    "PAT",
    "MY_PAT_2",
    "HF_TOKEN",
    "api_token",
    "AWS_SECRET_ACCESS_KEY",
    "OPENAI_API_KEY",
    "ssh_key",
    "SECRET",
    "my_secret_value",
    "clientSecret",
    "DB_PASSWORD",
    "password",
    "MYSQL_ROOT_PASSWORD_FILE",
    "PGPASS",
    "AUTH_HEADER",
    "SESSION_ID",
    "CREDS",
    "AWS_CREDS",
    "DB_CRED",
    "CRED_FILE",
    "my-creds",
    "dbCreds",
    "awsCred",
    "GOOGLE_APPLICATION_CREDENTIALS",
]
PLAIN_NAMES = [
    "PATH",
    "LD_LIBRARY_PATH",
    "PATTERN",
    "SHOT",
    "MODE",
    "CUDA_VISIBLE_DEVICES",
    "SPATIAL_RES",
    "PYTHONPATH",
    "CREDIT",
    "CREDIT_LIMIT",
    "INCREDIBLE",
    "ACCREDITED",
    "SCREDS",
    "discredit",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_masked(name):
    assert mask_env({name: "hunter2"}) == {name: MASK}


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_plain_names_visible(name):
    assert mask_env({name: "v"}) == {name: "v"}


# Values that carry a credential whatever their name (issue 35 item 14): value -> as shown.
GH_TOKEN_VALUE = "ghp_" + "A1b2C3" * 6
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"
SECRET_VALUE_CASES = [
    ("postgresql://u:pw@db.example:5432/farm", "postgresql://u:***@db.example:5432/farm"),
    ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
    ("mongodb+srv://app:p@ss@cluster0.example/db", "mongodb+srv://app:***@cluster0.example/db"),
    ("jdbc:postgresql://u:pw@db/x", "jdbc:postgresql://u:***@db/x"),
    ("http://a:1@h1,http://b:2@h2", "http://a:***@h1,http://b:***@h2"),
    ("https://api.example/v1?access_token=abc123&page=2", "https://api.example/v1?access_token=***&page=2"),
    (
        "https://b.s3.example/o?X-Amz-Credential=AKIAX%2F1&X-Amz-Signature=ff00&X-Amz-Expires=60",
        "https://b.s3.example/o?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=60",
    ),
    ("https://acct.blob.example/c?sv=2022&sig=abcDEF%3D", "https://acct.blob.example/c?sv=2022&sig=***"),
    (PEM, "***"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbg==\n-----END OPENSSH PRIVATE KEY-----", "***"),
    (GH_TOKEN_VALUE, "***"),
    ("--token " + GH_TOKEN_VALUE + " --fast", "--token *** --fast"),
    ("github_pat_" + "11ABCDEFG0" * 4, "***"),
    ("AKIAIOSFODNN7EXAMPLE", "***"),
    ("xoxb-123456789012-abcdefghijkl", "***"),
    ("hf_" + "aBcDeFgHiJ" * 3 + "klmn", "***"),
    (
        "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "Bearer ***",
    ),
]
PLAIN_VALUES = [
    "/usr/bin:/bin",
    "010",
    "fast",
    "https://example.com/a?page=2&sort=name",
    "http://host:8080/a@b",
    "ssh://git@host:22/repo",
    "git@github.com:org/repo.git",
    "user@example.com",
    "a:b@c",
    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
    "AKIA-short",
    "ghp_short",
    "hf_hub",
    "https://h/x?monkey=1&author=me&sort_keys=1",
    "s3://bucket/key:with@odd/name",
]


@pytest.mark.parametrize("value, shown", SECRET_VALUE_CASES)
def test_credential_values_masked_whatever_the_name(value, shown):
    assert mask_env({"ANYTHING": value}) == {"ANYTHING": shown}
    assert mask_env({"ANYTHING": shown}) == {"ANYTHING": shown}  # masking twice (describe_job, then the API) is a no-op


@pytest.mark.parametrize("value", PLAIN_VALUES)
def test_ordinary_values_visible(value):
    assert mask_env({"ANYTHING": value, "N": 3}) == {"ANYTHING": value, "N": 3}


ENV = [
    "GITHUB_PAT=ghp_abc",
    "HF_TOKEN=hf_xyz",
    "OPENAI_API_KEY=sk-123",
    "APP_SECRET_X=s3",
    "DB_PASSWORD=pw",
    "PATH=/usr/bin",
    "SHOT=010",
]
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
    assert env == {
        "GITHUB_PAT": "***",
        "HF_TOKEN": "***",
        "OPENAI_API_KEY": "***",
        "APP_SECRET_X": "***",
        "DB_PASSWORD": "***",
        "PATH": "/usr/bin",
        "SHOT": "010",
    }
    env = cli("job", "show", job, "--json", "--show-secrets").json()["layers"][0]["env"]
    assert env["GITHUB_PAT"] == "ghp_abc" and env["DB_PASSWORD"] == "pw"


def test_job_show_masks_credential_values_and_creds(cli):
    """`job show` (text and --json) masks by value too; --show-secrets shows all."""
    job_id = cli(
        "submit",
        "--name",
        "by-value",
        "--export",
        "NONE",
        "--env",
        "DATABASE_URL=postgresql://u:pw9@db/x",
        "--env",
        "CREDS=c9",
        "--",
        "true",
    ).stdout.strip()
    out = cli("job", "show", job_id).stdout
    assert "main\tDATABASE_URL\tpostgresql://u:***@db/x" in out and "main\tCREDS\t***" in out, out
    assert "pw9" not in out and "c9" not in out
    env = cli("job", "show", job_id, "--json").json()["layers"][0]["env"]
    assert env == {"DATABASE_URL": "postgresql://u:***@db/x", "CREDS": "***"}
    env = cli("job", "show", job_id, "--json", "--show-secrets").json()["layers"][0]["env"]
    assert env == {"DATABASE_URL": "postgresql://u:pw9@db/x", "CREDS": "c9"}


def test_job_show_without_env_has_no_env_table(cli):
    job_id = cli("submit", "--name", "bare", "--export", "NONE", "--", "true").stdout.strip()
    out = cli("job", "show", job_id).stdout
    assert "VALUE" not in out


def test_job_show_env_value_with_newline_stays_one_row(cli):
    job_id = cli("submit", "--name", "nl", "--env", "NOTE=a\nb", "--", "true").stdout.strip()
    out = cli("job", "show", job_id).stdout
    assert "main\tNOTE\t'a\\nb'" in out, out
