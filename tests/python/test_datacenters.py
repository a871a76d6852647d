"""DatacenterService through the generated Python client: create, get,
update with a field mask, status transitions, delete, revisions."""

from __future__ import annotations

from google.protobuf import field_mask_pb2

from ctrlplane.datacenter.v1 import datacenter_pb2 as pb
from helpers import Code, bootstrap_spec, expect_code, field_violations, rpc_error, unknown_dc_id

S = pb.DatacenterStatus


def test_health_needs_no_token(server):
    from conftest import health_serving

    assert health_serving(server.channel(), timeout=5)


def test_create_derives_slug_and_starts_active(tenant):
    dc = tenant.create(
        "Berlin Rack 7",
        region="eu-central",
        zone="b",
        labels={"env": "prod"},
        metadata={"owner": "infra team"},
        location=pb.Location(latitude=52.5, longitude=13.4, country="DE", city="Berlin"),
        capacity=pb.Capacity(max_instances=10, max_cpu_millis=64000, max_memory_mb=131072),
        bootstrap_services=[bootstrap_spec()],
    )
    assert dc.id.startswith("dc_") and len(dc.id) == 3 + 26
    assert dc.slug == "berlin-rack-7"
    assert dc.tenant_id == tenant.tenant
    assert dc.status == S.DATACENTER_STATUS_ACTIVE
    assert dc.revision > 0
    assert dc.create_time.seconds > 0 and dc.update_time.seconds > 0
    assert dc.region == "eu-central" and dc.zone == "b"
    assert dict(dc.labels) == {"env": "prod"}
    assert dict(dc.metadata) == {"owner": "infra team"}
    assert dc.location.city == "Berlin" and dc.capacity.max_instances == 10
    assert [b.name for b in dc.bootstrap_services] == ["log-shipper"]
    assert dc.bootstrap_services[0].services[0].name == "vector"

    got = tenant.GetDatacenter(pb.GetDatacenterRequest(id=dc.id)).datacenter
    assert got == dc
    by_slug = tenant.GetDatacenterBySlug(pb.GetDatacenterBySlugRequest(slug="berlin-rack-7")).datacenter
    assert by_slug == dc


def test_create_ignores_output_only_fields(tenant):
    dc = tenant.create(
        "Output Only",
        id=unknown_dc_id(),
        slug="something-else",
        status=S.DATACENTER_STATUS_OFFLINE,
        revision=999_999,
    )
    assert dc.slug == "output-only"
    assert dc.status == S.DATACENTER_STATUS_ACTIVE
    assert dc.revision != 999_999


def test_slug_unique_per_tenant_also_on_rename(server, tenant):
    a = tenant.create("Alpha One")
    expect_code(Code.ALREADY_EXISTS, tenant.create, "Alpha One")
    expect_code(Code.ALREADY_EXISTS, tenant.create, "alpha one")  # same slug
    b = tenant.create("Beta One")
    err = expect_code(
        Code.ALREADY_EXISTS,
        tenant.UpdateDatacenter,
        pb.UpdateDatacenterRequest(
            datacenter=pb.Datacenter(id=b.id, name="Alpha One"),
            update_mask=field_mask_pb2.FieldMask(paths=["name"]),
        ),
    )
    assert "alpha-one" in err.details()
    # Another tenant may use the same name.
    other = server.tenant().create("Alpha One")
    assert other.slug == a.slug and other.id != a.id


def test_not_found_and_malformed_ids(tenant):
    expect_code(Code.NOT_FOUND, tenant.GetDatacenter, pb.GetDatacenterRequest(id=unknown_dc_id()))
    expect_code(Code.NOT_FOUND, tenant.GetDatacenterBySlug, pb.GetDatacenterBySlugRequest(slug="no-such-slug"))
    err = expect_code(Code.INVALID_ARGUMENT, tenant.GetDatacenter, pb.GetDatacenterRequest(id="not-a-typeid"))
    assert "id" in field_violations(err)
    err = expect_code(Code.INVALID_ARGUMENT, tenant.GetDatacenter, pb.GetDatacenterRequest(id=""))
    assert "id" in field_violations(err)


def test_update_with_mask_changes_only_masked_fields(tenant):
    dc = tenant.create(
        "Mask Test",
        region="r1",
        zone="z1",
        labels={"a": "1"},
        metadata={"m": "x"},
        bootstrap_services=[bootstrap_spec("log-shipper"), bootstrap_spec("metrics", "node-exporter")],
    )

    # Fields outside the mask are left alone even when set in the request.
    resp = tenant.UpdateDatacenter(
        pb.UpdateDatacenterRequest(
            datacenter=pb.Datacenter(id=dc.id, name="Ignored", region="r2", zone="", labels={"b": "2"}),
            update_mask=field_mask_pb2.FieldMask(paths=["region", "labels"]),
        )
    ).datacenter
    assert resp.region == "r2"
    assert dict(resp.labels) == {"b": "2"}
    assert resp.name == "Mask Test" and resp.slug == "mask-test"
    assert resp.zone == "z1"
    assert dict(resp.metadata) == {"m": "x"}
    assert [b.name for b in resp.bootstrap_services] == ["log-shipper", "metrics"]
    assert resp.revision > dc.revision
    assert resp.create_time == dc.create_time

    # Replace the bootstrap services, then clear them with an explicit empty
    # list under the mask.
    resp2 = tenant.UpdateDatacenter(
        pb.UpdateDatacenterRequest(
            datacenter=pb.Datacenter(id=dc.id, bootstrap_services=[bootstrap_spec("cert-manager", "cm")]),
            update_mask=field_mask_pb2.FieldMask(paths=["bootstrap_services"]),
        )
    ).datacenter
    assert [b.name for b in resp2.bootstrap_services] == ["cert-manager"]
    assert dict(resp2.labels) == {"b": "2"}
    resp3 = tenant.UpdateDatacenter(
        pb.UpdateDatacenterRequest(
            datacenter=pb.Datacenter(id=dc.id),
            update_mask=field_mask_pb2.FieldMask(paths=["bootstrap_services"]),
        )
    ).datacenter
    assert list(resp3.bootstrap_services) == []
    assert resp3.revision > resp2.revision > resp.revision

    # Rename: the slug follows the name.
    renamed = tenant.UpdateDatacenter(
        pb.UpdateDatacenterRequest(
            datacenter=pb.Datacenter(id=dc.id, name="Mask Test Renamed"),
            update_mask=field_mask_pb2.FieldMask(paths=["name"]),
        )
    ).datacenter
    assert renamed.slug == "mask-test-renamed"
    assert tenant.GetDatacenter(pb.GetDatacenterRequest(id=dc.id)).datacenter == renamed


def test_update_rejects_empty_or_unknown_mask(tenant):
    dc = tenant.create("Mask Errors")
    expect_code(
        Code.INVALID_ARGUMENT,
        tenant.UpdateDatacenter,
        pb.UpdateDatacenterRequest(datacenter=pb.Datacenter(id=dc.id, region="x")),
    )
    for path in ["no_such_field", "status", "revision"]:
        err = expect_code(
            Code.INVALID_ARGUMENT,
            tenant.UpdateDatacenter,
            pb.UpdateDatacenterRequest(
                datacenter=pb.Datacenter(id=dc.id), update_mask=field_mask_pb2.FieldMask(paths=[path])
            ),
        )
        assert any(f.startswith("update_mask") for f in field_violations(err)), path
    # Masked fields are validated like on create.
    err = expect_code(
        Code.INVALID_ARGUMENT,
        tenant.UpdateDatacenter,
        pb.UpdateDatacenterRequest(
            datacenter=pb.Datacenter(id=dc.id, name="", labels={"-bad": "x"}),
            update_mask=field_mask_pb2.FieldMask(paths=["name", "labels"]),
        ),
    )
    fields = field_violations(err)
    assert "datacenter.name" in fields and "datacenter.labels[-bad]" in fields, fields
    assert tenant.GetDatacenter(pb.GetDatacenterRequest(id=dc.id)).datacenter.revision == dc.revision


def set_status(client, dc_id, status, reason=""):
    return client.SetDatacenterStatus(
        pb.SetDatacenterStatusRequest(id=dc_id, status=status, reason=reason)
    ).datacenter


# API.md: active -> maintenance|draining|offline; maintenance -> active|
# draining|offline; draining -> offline|active; offline -> active|maintenance.
ALLOWED = {
    S.DATACENTER_STATUS_ACTIVE: {S.DATACENTER_STATUS_MAINTENANCE, S.DATACENTER_STATUS_DRAINING, S.DATACENTER_STATUS_OFFLINE},
    S.DATACENTER_STATUS_MAINTENANCE: {S.DATACENTER_STATUS_ACTIVE, S.DATACENTER_STATUS_DRAINING, S.DATACENTER_STATUS_OFFLINE},
    S.DATACENTER_STATUS_DRAINING: {S.DATACENTER_STATUS_OFFLINE, S.DATACENTER_STATUS_ACTIVE},
    S.DATACENTER_STATUS_OFFLINE: {S.DATACENTER_STATUS_ACTIVE, S.DATACENTER_STATUS_MAINTENANCE},
}
PATH_TO = {  # a way to reach each status from ACTIVE
    S.DATACENTER_STATUS_ACTIVE: [],
    S.DATACENTER_STATUS_MAINTENANCE: [S.DATACENTER_STATUS_MAINTENANCE],
    S.DATACENTER_STATUS_DRAINING: [S.DATACENTER_STATUS_DRAINING],
    S.DATACENTER_STATUS_OFFLINE: [S.DATACENTER_STATUS_OFFLINE],
}


def short(status) -> str:
    return S.Name(status).removeprefix("DATACENTER_STATUS_").lower()


def test_status_transition_table(tenant):
    n = 0
    for start, allowed in ALLOWED.items():
        for target in ALLOWED:
            if target == start:
                continue
            n += 1
            dc = tenant.create(f"Transition {n}")
            for step in PATH_TO[start]:
                dc = set_status(tenant, dc.id, step)
            assert dc.status == start
            if target in allowed:
                moved = set_status(tenant, dc.id, target, reason="test")
                assert moved.status == target
                assert moved.revision > dc.revision
            else:
                err = expect_code(Code.FAILED_PRECONDITION, set_status, tenant, dc.id, target)
                msg = err.details().lower()
                assert short(start) in msg and short(target) in msg, err.details()
                assert tenant.GetDatacenter(pb.GetDatacenterRequest(id=dc.id)).datacenter.status == start


def test_status_deleting_and_unspecified_are_not_settable(tenant):
    dc = tenant.create("No Deleting Via Status")
    # DELETING is reached through DeleteDatacenter only.
    err = rpc_error(set_status, tenant, dc.id, S.DATACENTER_STATUS_DELETING)
    assert err.code() in (Code.FAILED_PRECONDITION, Code.INVALID_ARGUMENT), err.code()
    expect_code(Code.INVALID_ARGUMENT, set_status, tenant, dc.id, S.DATACENTER_STATUS_UNSPECIFIED)
    assert tenant.GetDatacenter(pb.GetDatacenterRequest(id=dc.id)).datacenter.status == S.DATACENTER_STATUS_ACTIVE


def test_delete_moves_to_deleting_and_blocks_recreate(tenant):
    dc = tenant.create("Delete Me")
    deleted = tenant.DeleteDatacenter(pb.DeleteDatacenterRequest(id=dc.id)).datacenter
    assert deleted.id == dc.id
    assert deleted.status == S.DATACENTER_STATUS_DELETING
    assert deleted.revision > dc.revision
    got = tenant.GetDatacenter(pb.GetDatacenterRequest(id=dc.id)).datacenter
    assert got.status == S.DATACENTER_STATUS_DELETING

    # Re-creating the slug while the old one is being deleted: a clear error.
    err = rpc_error(tenant.create, "Delete Me")
    assert err.code() in (Code.ALREADY_EXISTS, Code.FAILED_PRECONDITION), err.code()
    assert "delet" in err.details().lower(), err.details()

    # A deleting datacenter cannot change status any more.
    expect_code(Code.FAILED_PRECONDITION, set_status, tenant, dc.id, S.DATACENTER_STATUS_ACTIVE)


def test_every_write_bumps_revision(tenant):
    dc = tenant.create("Revisions")
    revs = [dc.revision]
    revs.append(
        tenant.UpdateDatacenter(
            pb.UpdateDatacenterRequest(
                datacenter=pb.Datacenter(id=dc.id, region="x"),
                update_mask=field_mask_pb2.FieldMask(paths=["region"]),
            )
        ).datacenter.revision
    )
    revs.append(set_status(tenant, dc.id, S.DATACENTER_STATUS_MAINTENANCE).revision)
    revs.append(tenant.DeleteDatacenter(pb.DeleteDatacenterRequest(id=dc.id)).datacenter.revision)
    assert revs == sorted(set(revs)), revs
    # The revision is global: a write elsewhere moves it on too.
    other = tenant.create("Revisions 2")
    assert other.revision > revs[-1]


def test_events_are_recorded(tenant):
    dc = tenant.create("Events")
    set_status(tenant, dc.id, S.DATACENTER_STATUS_DRAINING, reason="rack swap")
    tenant.DeleteDatacenter(pb.DeleteDatacenterRequest(id=dc.id))
    events = tenant.ListDatacenterEvents(pb.ListDatacenterEventsRequest(datacenter_id=dc.id)).events
    T = pb.DatacenterEventType
    assert [e.type for e in events] == [
        T.DATACENTER_EVENT_TYPE_CREATED,
        T.DATACENTER_EVENT_TYPE_STATUS_CHANGED,
        T.DATACENTER_EVENT_TYPE_DELETED,
    ]
    assert [e.revision for e in events] == sorted(e.revision for e in events)
    assert all(e.id.startswith("evt_") and e.datacenter_id == dc.id for e in events)
    assert events[1].datacenter.status == S.DATACENTER_STATUS_DRAINING
    assert "rack swap" in events[1].message
    assert events[0].actor == f"user-{tenant.tenant}"
