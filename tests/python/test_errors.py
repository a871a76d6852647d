"""Error contract: INVALID_ARGUMENT with google.rpc.BadRequest naming every
bad field (read from the grpc-status-details-bin trailer), and
UNAUTHENTICATED for missing, expired or forged tokens."""

from __future__ import annotations

import time

import jwt

from ctrlplane.bootstrap.v1 import spec_pb2
from ctrlplane.datacenter.v1 import datacenter_pb2 as pb
from ctrlplane.provider.v1 import types_pb2
from helpers import Code, bootstrap_spec, expect_code, field_violations, status_details


def test_invalid_create_names_every_bad_field(tenant):
    bad = pb.Datacenter(
        name="",
        provider_name="",
        labels={"bad key!": "x", "ok": "fine"},
        bootstrap_services=[
            spec_pb2.BootstrapServiceSpec(
                name="log-shipper",
                services=[types_pb2.ServiceSpec(name="Not_A_Label", image="x")],
            )
        ],
    )
    err = expect_code(Code.INVALID_ARGUMENT, tenant.CreateDatacenter, pb.CreateDatacenterRequest(datacenter=bad))
    fields = field_violations(err)
    for path in [
        "datacenter.name",
        "datacenter.provider_name",
        "datacenter.labels[bad key!]",
        "datacenter.bootstrap_services[0].services[0].name",
    ]:
        assert path in fields, f"{path} missing from {sorted(fields)}"
        assert all(d for d in fields[path]), "every violation has a description"
    assert not any(f.startswith("datacenter.labels[ok]") for f in fields)
    assert err.details().startswith("invalid request")
    assert "datacenter.name" in err.details()


def test_invalid_service_specs_are_all_reported(tenant):
    main = types_pb2.ServiceSpec(
        name="app",
        image="x",
        ports=[types_pb2.PortSpec(container=70000)],
        resources=types_pb2.ResourceSpec(cpu_millis=-1),
    )
    second_main = types_pb2.ServiceSpec(name="app", image="y")  # duplicate name, second main
    spec = spec_pb2.BootstrapServiceSpec(name="web", services=[main, second_main], depends_on=["web"])
    bad = pb.Datacenter(name="Specs", provider_name="process", bootstrap_services=[spec, bootstrap_spec("web")])
    err = expect_code(Code.INVALID_ARGUMENT, tenant.CreateDatacenter, pb.CreateDatacenterRequest(datacenter=bad))
    fields = field_violations(err)
    prefix = "datacenter.bootstrap_services[0]"
    assert f"{prefix}.services[0].ports[0].container" in fields, sorted(fields)
    assert f"{prefix}.services[0].resources.cpu_millis" in fields, sorted(fields)
    assert any(f.startswith(f"{prefix}.services[1]") or f == f"{prefix}.services" for f in fields), sorted(fields)
    assert f"{prefix}.depends_on[0]" in fields, sorted(fields)
    assert "datacenter.bootstrap_services[1].name" in fields, sorted(fields)  # duplicate "web"


def test_list_rejects_bad_arguments(tenant):
    for req, field in [
        (pb.ListDatacentersRequest(page_size=-1), "page_size"),
        (pb.ListDatacentersRequest(page_token="definitely-not-a-token"), "page_token"),
        (pb.ListDatacentersRequest(label_selector="novalue"), "label_selector"),
    ]:
        err = expect_code(Code.INVALID_ARGUMENT, tenant.ListDatacenters, req)
        assert field in field_violations(err), (field, field_violations(err))


def test_status_details_carry_the_code(tenant):
    err = expect_code(
        Code.INVALID_ARGUMENT,
        tenant.CreateDatacenter,
        pb.CreateDatacenterRequest(datacenter=pb.Datacenter(name="", provider_name="process")),
    )
    status = status_details(err)
    assert status.code == 3 and status.message == err.details()


def test_missing_token_is_unauthenticated(server):
    client = server.client(None)
    err = expect_code(Code.UNAUTHENTICATED, client.ListDatacenters, pb.ListDatacentersRequest())
    assert "authorization" in err.details().lower()
    expect_code(
        Code.UNAUTHENTICATED,
        client.CreateDatacenter,
        pb.CreateDatacenterRequest(datacenter=pb.Datacenter(name="x", provider_name="process")),
    )


def test_bad_tokens_are_unauthenticated(server):
    now = int(time.time())
    expired = server.token(ttl=-120)
    forged = server.token(roles=["system:admin"], secret="another-secret-that-is-long-enough-1234")
    no_sub = jwt.encode({"tenant_id": "t", "roles": [], "exp": now + 600, "iat": now}, server.secret, algorithm="HS256")
    hs512 = jwt.encode({"sub": "x", "roles": ["system:admin"], "exp": now + 600, "iat": now}, server.secret, algorithm="HS512")
    for name, token in [("expired", expired), ("forged", forged), ("no sub", no_sub), ("HS512", hs512), ("garbage", "abc.def.ghi")]:
        err = expect_code(Code.UNAUTHENTICATED, server.client(token).ListDatacenters, pb.ListDatacentersRequest())
        assert err.details(), name
    # Not a bearer token at all.
    stub = server.stub()
    err = expect_code(
        Code.UNAUTHENTICATED,
        stub.ListDatacenters,
        pb.ListDatacentersRequest(),
        metadata=[("authorization", f"Basic {server.admin_token()}")],
        timeout=10,
    )
    assert err.details()
