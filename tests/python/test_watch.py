"""WatchDatacenters: changes arrive in revision order with their types,
resuming after since_revision (from the change log) and then live."""

from __future__ import annotations

from google.protobuf import field_mask_pb2

from ctrlplane.datacenter.v1 import datacenter_pb2 as pb
from helpers import Watch

T = pb.DatacenterEventType
S = pb.DatacenterStatus


def three_changes(client, dc_id):
    client.UpdateDatacenter(
        pb.UpdateDatacenterRequest(
            datacenter=pb.Datacenter(id=dc_id, labels={"watched": "yes"}),
            update_mask=field_mask_pb2.FieldMask(paths=["labels"]),
        )
    )
    client.SetDatacenterStatus(
        pb.SetDatacenterStatusRequest(id=dc_id, status=S.DATACENTER_STATUS_MAINTENANCE, reason="patching")
    )
    return client.DeleteDatacenter(pb.DeleteDatacenterRequest(id=dc_id)).datacenter


def test_watch_from_a_known_revision_then_resume_in_the_middle(tenant):
    tenant.create("Not Watched")  # so that dc.revision - 1 >= 1 (0 means "from now on")
    dc = tenant.create("Watched")
    with Watch(tenant, since_revision=dc.revision) as watch:
        last = three_changes(tenant, dc.id)
        events = watch.take(3)
        watch.assert_quiet()

    assert [e.type for e in events] == [
        T.DATACENTER_EVENT_TYPE_UPDATED,
        T.DATACENTER_EVENT_TYPE_STATUS_CHANGED,
        T.DATACENTER_EVENT_TYPE_DELETED,
    ]
    revisions = [e.revision for e in events]
    assert dc.revision < revisions[0] < revisions[1] < revisions[2] == last.revision
    assert all(e.datacenter_id == dc.id and e.datacenter.id == dc.id for e in events)
    assert dict(events[0].datacenter.labels) == {"watched": "yes"}
    assert events[1].datacenter.status == S.DATACENTER_STATUS_MAINTENANCE
    assert events[2].datacenter.status == S.DATACENTER_STATUS_DELETING
    assert all(e.datacenter.revision == e.revision for e in events)

    # Resume after the first one: the other two again, same revisions.
    with Watch(tenant, since_revision=revisions[0]) as watch:
        again = watch.take(2)
        watch.assert_quiet()
    assert [(e.type, e.revision, e.id) for e in again] == [(e.type, e.revision, e.id) for e in events[1:]]

    # Resume just before the create: its whole history.
    with Watch(tenant, since_revision=dc.revision - 1) as watch:
        history = watch.take(4)
        watch.assert_quiet()
    assert [e.type for e in history] == [T.DATACENTER_EVENT_TYPE_CREATED] + [e.type for e in events]


def test_watch_from_zero_streams_only_new_changes(tenant):
    old = tenant.create("Before The Watch")
    with Watch(tenant, since_revision=0) as watch:
        watch.assert_quiet(1.0)
        new = tenant.create("After The Watch")
        event = watch.next()
    assert event.type == T.DATACENTER_EVENT_TYPE_CREATED
    assert event.datacenter.id == new.id and event.revision == new.revision > old.revision


def test_watch_is_tenant_scoped(server):
    alice, bob = server.tenant(), server.tenant()
    start = alice.create("Alice Start")
    with Watch(alice, since_revision=start.revision) as watch:
        bob.create("Bob Private")
        mine = alice.create("Alice Second")
        event = watch.next()
        watch.assert_quiet()
    assert event.datacenter.id == mine.id, "bob's change must not reach alice"


def test_many_changes_arrive_in_order(tenant):
    first = tenant.create("Burst 0")
    with Watch(tenant, since_revision=first.revision) as watch:
        created = [tenant.create(f"Burst {i}") for i in range(1, 41)]
        events = watch.take(40)
    assert [e.datacenter.id for e in events] == [dc.id for dc in created]
    assert [e.revision for e in events] == sorted(e.revision for e in events)
