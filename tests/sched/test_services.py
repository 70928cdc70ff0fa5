"""Services (OpenCue's named resource defaults; sched/services.py) in the store, on SQLite and
PostgreSQL (the ``store`` fixture): create/update/clear/delete for admins only, and at submit
each layer's unset resource fields taken from its service (or the ``default`` one), applied
inside the submit transaction. Also the OpenCue XML importer's <services>."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from storedriver import pg_roles  # tests/storedriver.py (tests/ is on sys.path)

from cuectl.errors import InvalidInput, NotFound, NotOwner
from cuectl.sched import services
from cuectl.sched.model import JobSpec, LayerSpec
from cuectl.sched.opencue_xml import parse_opencue_xml
from cuectl.sched.spec import spec_from_flags, spec_from_mapping
from cuectl.sched.store import Actor, open_store

NOW = 1_700_000_000.0
GIB = 1024**3
FIXTURES = Path(__file__).parents[1] / "fixtures" / "opencue"


def submit(store, *layers: dict, name: str = "j") -> dict:
    spec = spec_from_mapping({"name": name, "layers": list(layers)}, user="alice")
    return store.get_job(store.submit(spec, now=NOW))


def layer(name: str = "a", **kw) -> dict:
    return {"name": name, "command": ["true"], **kw}


def resources(data: dict) -> list[tuple]:
    return [
        (x["cores"], x["memory_bytes"], x["gpus"], x["gpu_memory_min_bytes"], x["tags"], x["timeout_s"])
        for x in data["layers"]
    ]


def test_set_list_update_clear_delete(store):
    assert store.list_services() == []
    row = store.set_service("render", {"cores": 4, "memory_bytes": 8 * GIB, "tags": ["linux"], "timeout_s": 7200})
    assert row == {
        "name": "render",
        "cores": 4.0,
        "memory_bytes": 8 * GIB,
        "gpus": None,
        "gpu_memory_min_bytes": None,
        "tags": ["linux"],
        "timeout_s": 7200.0,
        "gpu_capability_min": None,
        "gpu_driver_min": None,
        "gpu_cuda_min": None,
    }
    # An update changes only what it gives; None clears a field.
    row = store.set_service("render", {"cores": 8, "timeout_s": None})
    assert (row["cores"], row["memory_bytes"], row["tags"], row["timeout_s"]) == (8.0, 8 * GIB, ["linux"], None)
    store.set_service("cuda", {"gpus": 1, "gpu_memory_min_bytes": 24 * GIB})
    store.set_service("empty", {})
    assert [r["name"] for r in store.list_services()] == ["cuda", "empty", "render"]
    store.delete_service("empty")
    with pytest.raises(NotFound, match="no service 'empty'"):
        store.delete_service("empty")
    assert [r["name"] for r in store.list_services()] == ["cuda", "render"]


@pytest.mark.parametrize(
    "name,values,message",
    [
        ("bad name", {"cores": 1}, "NAME: invalid service name"),
        ("ok", {"cores": 0}, "--cores: must be more than 0"),
        ("ok", {"cores": 0.01}, "--cores: must be at least 0.1"),
        ("ok", {"gpus": -1}, "--gpus: must be 0 or more"),
        ("ok", {"memory_bytes": "lots"}, "--memory"),
        ("ok", {"tags": ["a b"]}, "--tags"),
        ("ok", {"timeout_s": 0}, "--timeout: must be more than 0"),
        ("ok", {"nice": 3}, "unknown service field 'nice'"),
    ],
)
def test_bad_values_are_refused_and_change_nothing(store, name, values, message):
    store.set_service("ok", {"cores": 2})
    with pytest.raises(InvalidInput, match=message):
        store.set_service(name, values)
    assert store.list_services() == [
        {
            "name": "ok",
            "cores": 2.0,
            "memory_bytes": None,
            "gpus": None,
            "gpu_memory_min_bytes": None,
            "tags": None,
            "timeout_s": None,
            "gpu_capability_min": None,
            "gpu_driver_min": None,
            "gpu_cuda_min": None,
        }
    ]


@pytest.mark.acts_as_user
def test_only_admins_change_services(store):
    pg_roles(store, "svc_bob")
    store.set_service("render", {"cores": 2})
    with store.acting_as(Actor("svc_bob", False)):
        for change in (
            lambda: store.set_service("render", {"cores": 64}),
            lambda: store.set_service("mine", {}),
            lambda: store.delete_service("render"),
        ):
            with pytest.raises(NotOwner, match="only an admin"):
                change()
        assert [r["cores"] for r in store.list_services()] == [2.0]  # reading is for everyone


def test_layer_takes_the_services_defaults_and_its_own_values_win(store):
    store.set_service("render", {"cores": 4, "memory_bytes": 8 * GIB, "tags": ["linux"], "timeout_s": 3600})
    store.set_service("cuda", {"gpus": 2, "gpu_memory_min_bytes": 24 * GIB, "cores": 2})
    job = submit(
        store,
        layer("plain", service="render"),
        layer("own", service="render", cores=1, memory="2G", tags=["mac"], timeout="5m"),
        layer("gpu", service="cuda"),
        layer("onegpu", service="cuda", gpus=1),
        layer("cpu", service="cuda", gpus=0),  # its own 0 GPUs win: no device memory either
        layer("none"),
    )
    assert resources(job) == [
        (4.0, 8 * GIB, 0, 0, ["linux"], 3600.0),
        (1.0, 2 * GIB, 0, 0, ["mac"], 300.0),
        (2.0, 0, 2, 24 * GIB, [], None),
        (2.0, 0, 1, 24 * GIB, [], None),
        (2.0, 0, 0, 0, [], None),
        (1.0, 0, 0, 0, [], None),  # no service, and no `default` one: cuectl's defaults
    ]


def test_default_service_serves_layers_without_one(store):
    store.set_service("default", {"memory_bytes": 4 * GIB, "cores": 2})
    store.set_service("big", {"memory_bytes": 64 * GIB})
    job = submit(store, layer("a"), layer("b", memory="1G"), layer("c", service="big"))
    assert [(x["cores"], x["memory_bytes"]) for x in job["layers"]] == [(2.0, 4 * GIB), (2.0, GIB), (1.0, 64 * GIB)]
    # A service changed later leaves submitted jobs as they were.
    store.set_service("default", {"memory_bytes": GIB})
    assert store.get_job(job["id"])["layers"][0]["memory_bytes"] == 4 * GIB


def test_unknown_service_submits_nothing(store):
    store.set_service("render", {"cores": 2})
    before = len(store.list_jobs())
    spec = spec_from_mapping(
        {"name": "j", "layers": [layer("a", service="render"), layer("b", service="rendr")]}, user="alice"
    )
    with pytest.raises(InvalidInput, match="layer b: service: no service 'rendr'"):
        store.submit(spec, now=NOW)
    assert len(store.list_jobs()) == before


def test_a_list_takes_the_first_that_exists_else_default(store):
    # OpenCue's rule (Cuebot's JobSpec): the first listed service the farm has, else default.
    store.set_service("katana", {"cores": 3})
    job = submit(store, layer("a", service=["shell", "katana", "prman"]), layer("b", service=["shell", "nuke"]))
    assert [x["cores"] for x in job["layers"]] == [3.0, 1.0]
    store.set_service("default", {"cores": 0.5})
    job = submit(store, layer("b", service=["shell", "nuke"]))
    assert job["layers"][0]["cores"] == 0.5


def test_flag_form_gpus_not_given_take_the_service(store):
    store.set_service("cuda", {"gpus": 1, "gpu_memory_min_bytes": 16 * GIB})
    spec = spec_from_flags(name="f", command=["true"], service="cuda", user="alice")
    assert spec.layers[0].explicit == frozenset()
    data = store.get_job(store.submit(spec, now=NOW))
    assert resources(data) == [(1.0, 0, 1, 16 * GIB, [], None)]
    spec = spec_from_flags(name="f", command=["true"], service="cuda", gpus=0, user="alice")
    assert resources(store.get_job(store.submit(spec, now=NOW))) == [(1.0, 0, 0, 0, [], None)]


def test_a_refused_submit_with_a_service_leaves_nothing(store):
    # The services are read in the submit's own transaction: a refused job leaves no rows.
    store.set_service("cuda", {"gpus": 2})
    spec = spec_from_mapping({"name": "j", "layers": [layer("a", service="cuda", limits=["nolimit"])]}, user="alice")
    with pytest.raises(InvalidInput, match="no limit"):
        store.submit(spec, now=NOW)
    assert store.list_jobs() == []


# -- the pure function ------------------------------------------------------------------------
def _row(name, **values):
    row = {"name": name, **{f: None for f in services.FIELDS}}
    row.update(services.to_columns(services.check_values(values)))
    return row


def test_apply_on_code_built_layers_keeps_what_differs_from_the_defaults():
    spec = JobSpec(
        name="j",
        user="u",
        layers=(LayerSpec(name="a", command=("true",), cores=3.0), LayerSpec(name="b", command=("true",), service="s")),
    )
    out = services.apply(spec, [_row("default", cores=2, memory_bytes=GIB), _row("s", tags=["x"], cores=5)])
    a, b = out.layers
    assert (a.cores, a.memory_bytes) == (3.0, GIB)  # cores differ from LayerSpec's default: its own
    assert (b.cores, b.memory_bytes, b.tags) == (5.0, 0, ("x",))


def test_service_gpu_memory_only_for_layers_with_gpus():
    spec = spec_from_mapping({"name": "j", "layers": [layer("a", service="s")]}, user="u")
    out = services.apply(spec, [_row("s", gpu_memory_min_bytes=8 * GIB)])
    assert (out.layers[0].gpus, out.layers[0].gpu_memory_min_bytes) == (0, 0)
    out = services.apply(spec, [_row("s", gpus=1, gpu_memory_min_bytes=8 * GIB)])
    assert (out.layers[0].gpus, out.layers[0].gpu_memory_min_bytes) == (1, 8 * GIB)


def test_parse_options():
    assert services.parse_options(
        {
            "cores": "2.5",
            "memory_bytes": "512",
            "gpus": "none",
            "tags": "a, b",
            "timeout_s": "1h",
            "gpu_memory_min_bytes": None,
        }
    ) == {"cores": 2.5, "memory_bytes": 512 * 1024**2, "gpus": None, "tags": ["a", "b"], "timeout_s": 3600.0}
    for raw, message in (
        ({"cores": "many"}, "--cores: expected a number"),
        ({"gpus": "1.5"}, "--gpus"),
        ({"tags": " , "}, "--tags"),
        ({"timeout_s": "soon"}, "--timeout"),
    ):
        with pytest.raises(InvalidInput, match=message):
            services.parse_options(raw)


# -- OpenCue XML -------------------------------------------------------------------------------
def test_opencue_services_become_the_layers_service_list(store):
    ((mapping, notes),) = parse_opencue_xml(
        (FIXTURES / "services.xml").read_text(), source="services.xml", submitter="testuser"
    )
    assert [x.get("service") for x in mapping["layers"]] == [
        ["shell", "katana", "unknown"],
        ["prman", "katana"],
        ["arnold"],
        ["cuda"],
    ]
    assert not any("<services>" in str(n) for n in notes)
    store.set_service("katana", {"cores": 6})
    store.set_service("cuda", {"gpus": 1})
    job = store.get_job(store.submit(spec_from_mapping(mapping, user="testuser"), now=NOW))
    assert [(x["name"], x["cores"], x["gpus"]) for x in job["layers"]] == [
        ("shell_layer", 6.0, 0),
        ("prman_layer", 6.0, 0),
        ("arnold_layer", 1.0, 0),
        ("cuda_layer", 1.0, 1),
    ]


# -- PostgreSQL with a role per user (roles.sql) ---------------------------------------------
def test_postgres_roles_read_services_and_only_admins_write(pg_url):
    psycopg = pytest.importorskip("psycopg")
    from cuectl.sched.store import roles_sql

    open_store(pg_url).close()
    suffix = uuid.uuid4().hex[:6]
    names = {who: f"s{who}_{suffix}" for who in ("alice", "boss")}

    def sql(statement):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(statement)

    sql(roles_sql())
    for who, role in names.items():
        sql(f"CREATE ROLE {role} LOGIN")
        sql(f"GRANT {'cuectl_admin' if who == 'boss' else 'cuectl_user'} TO {role}")
    try:
        boss = open_store(pg_url.replace("postgres@", f"{names['boss']}@", 1))
        alice = open_store(pg_url.replace("postgres@", f"{names['alice']}@", 1))
        boss.set_service("render", {"cores": 4})
        with pytest.raises(NotOwner):
            alice.set_service("render", {"cores": 64})
        # The grant itself, not only the client's check: the user's role cannot write the table.
        with psycopg.connect(pg_url.replace("postgres@", f"{names['alice']}@", 1), autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("UPDATE services SET cores = 64")
        spec = spec_from_mapping({"name": "j", "layers": [layer("a", service="render")]}, user=names["alice"])
        assert alice.get_job(alice.submit(spec, now=NOW))["layers"][0]["cores"] == 4.0
        boss.delete_service("render")
        boss.close()
        alice.close()
    finally:
        for role in names.values():
            sql(f"REASSIGN OWNED BY {role} TO postgres; DROP OWNED BY {role}")
            sql(f"DROP ROLE {role}")
