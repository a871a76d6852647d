"""Tenant isolation: a tenant never learns of another tenant's datacenters
(NOT_FOUND), reads platform-shared ones but may not change them
(PERMISSION_DENIED); only system:admin acts across tenants and on shared
datacenters."""

from __future__ import annotations

from google.protobuf import field_mask_pb2

from ctrlplane.datacenter.v1 import datacenter_pb2 as pb
from helpers import Code, expect_code, list_all, rpc_error

S = pb.DatacenterStatus


def writes(client, dc_id):
    """Every write RPC against dc_id, as callables."""
    return {
        "update": lambda: client.UpdateDatacenter(
            pb.UpdateDatacenterRequest(
                datacenter=pb.Datacenter(id=dc_id, region="hijacked"),
                update_mask=field_mask_pb2.FieldMask(paths=["region"]),
            )
        ),
        "set-status": lambda: client.SetDatacenterStatus(
            pb.SetDatacenterStatusRequest(id=dc_id, status=S.DATACENTER_STATUS_OFFLINE)
        ),
        "delete": lambda: client.DeleteDatacenter(pb.DeleteDatacenterRequest(id=dc_id)),
    }


def test_other_tenants_datacenters_are_not_found(server):
    alice, bob = server.tenant(), server.tenant()
    dc = alice.create("Alice Only", labels={"owner": "alice"})
    expect_code(Code.NOT_FOUND, bob.GetDatacenter, pb.GetDatacenterRequest(id=dc.id))
    expect_code(Code.NOT_FOUND, bob.GetDatacenterBySlug, pb.GetDatacenterBySlugRequest(slug=dc.slug))
    for name, call in writes(bob, dc.id).items():
        err = rpc_error(call)
        assert err.code() == Code.NOT_FOUND, (name, err.code(), err.details())
    assert dc.id not in {d.id for d in list_all(bob)}
    assert bob.ListDatacenters(pb.ListDatacentersRequest(label_selector="owner=alice")).total_size == 0
    events = bob.ListDatacenterEvents(pb.ListDatacenterEventsRequest(datacenter_id=dc.id)).events
    assert list(events) == []
    # Unchanged for alice.
    assert alice.GetDatacenter(pb.GetDatacenterRequest(id=dc.id)).datacenter == dc


def test_tenant_cannot_list_another_tenant(server):
    alice, bob = server.tenant(), server.tenant()
    alice.create("Alice Listed")
    err = rpc_error(bob.ListDatacenters, pb.ListDatacentersRequest(tenant_id=alice.tenant))
    assert err.code() in (Code.PERMISSION_DENIED, Code.INVALID_ARGUMENT), err.code()
    # Naming one's own tenant is fine.
    assert bob.ListDatacenters(pb.ListDatacentersRequest(tenant_id=bob.tenant)).total_size >= 0


def test_tenant_cannot_create_for_another_tenant_or_shared(server):
    alice = server.tenant()
    for target in ["someone-else", ""]:
        try:
            dc = alice.create(f"Sneaky {target or 'shared'}", tenant_id=target)
        except Exception as err:  # grpc.RpcError
            assert err.code() in (Code.PERMISSION_DENIED, Code.INVALID_ARGUMENT), err.code()
        else:
            assert dc.tenant_id == alice.tenant, "tenant_id comes from the token"


def test_shared_datacenters_are_read_only_for_tenants(server):
    admin = server.admin()
    shared = admin.create("Shared Edge", tenant_id="", labels={"scope": "shared"})
    assert shared.tenant_id == ""
    alice = server.tenant()
    got = alice.GetDatacenter(pb.GetDatacenterRequest(id=shared.id)).datacenter
    assert got == shared
    assert shared.id in {d.id for d in list_all(alice)}
    by_slug = alice.GetDatacenterBySlug(pb.GetDatacenterBySlugRequest(slug="shared-edge")).datacenter
    assert by_slug.id == shared.id
    for name, call in writes(alice, shared.id).items():
        err = rpc_error(call)
        assert err.code() == Code.PERMISSION_DENIED, (name, err.code(), err.details())
    assert alice.GetDatacenter(pb.GetDatacenterRequest(id=shared.id)).datacenter == shared

    # A tenant's own slug wins over a shared one of the same slug.
    own = alice.create("Shared Edge")
    assert alice.GetDatacenterBySlug(pb.GetDatacenterBySlugRequest(slug="shared-edge")).datacenter.id == own.id

    # The admin may change it.
    updated = writes(admin, shared.id)["update"]().datacenter
    assert updated.region == "hijacked"


def test_admin_acts_across_tenants(server):
    admin = server.admin()
    alice = server.tenant()
    dc = alice.create("Alice Managed")
    assert admin.GetDatacenter(pb.GetDatacenterRequest(id=dc.id)).datacenter.id == dc.id
    by_slug = admin.GetDatacenterBySlug(pb.GetDatacenterBySlugRequest(slug=dc.slug, tenant_id=alice.tenant))
    assert by_slug.datacenter.id == dc.id
    moved = admin.SetDatacenterStatus(
        pb.SetDatacenterStatusRequest(id=dc.id, status=S.DATACENTER_STATUS_MAINTENANCE)
    ).datacenter
    assert moved.status == S.DATACENTER_STATUS_MAINTENANCE
    created = admin.create("Made By Admin", tenant_id=alice.tenant)
    assert created.tenant_id == alice.tenant
    assert alice.GetDatacenter(pb.GetDatacenterRequest(id=created.id)).datacenter.id == created.id
    listed = {d.id for d in list_all(admin, tenant_id=alice.tenant)}
    assert {dc.id, created.id} <= listed


def test_tenant_cannot_get_shared_by_slug_of_other_tenant(server):
    alice, bob = server.tenant(), server.tenant()
    alice.create("Slug Owner")
    err = rpc_error(
        bob.GetDatacenterBySlug, pb.GetDatacenterBySlugRequest(slug="slug-owner", tenant_id=alice.tenant)
    )
    assert err.code() in (Code.NOT_FOUND, Code.PERMISSION_DENIED), err.code()
