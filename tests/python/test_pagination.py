"""ListDatacenters: cursor pagination over 250 datacenters, total_size,
default and maximum page sizes, filters, and tokens that survive concurrent
inserts. The module has its own server, so a fresh tenant sees exactly what
it created here."""

from __future__ import annotations

import grpc
import pytest

from ctrlplane.datacenter.v1 import datacenter_pb2 as pb
from helpers import Code, expect_code, field_violations, list_all

S = pb.DatacenterStatus
N = 250


@pytest.fixture(scope="module")
def populated(server):
    """A tenant with N datacenters (ids in creation order)."""
    client = server.tenant()
    ids = []
    for i in range(N):
        dc = client.create(
            f"Page DC {i:03d}",
            provider="docker" if i % 5 == 0 else "process",
            region=f"region-{i % 3}",
            labels={"parity": "even" if i % 2 == 0 else "odd", "tier": str(i % 4)},
        )
        ids.append(dc.id)
    return client, ids


def pages(client, page_size, **filters):
    """Yields every ListDatacentersResponse of a listing."""
    token = ""
    for _ in range(1000):
        resp = client.ListDatacenters(pb.ListDatacentersRequest(page_size=page_size, page_token=token, **filters))
        yield resp
        token = resp.next_page_token
        if not token:
            return
    pytest.fail("pagination did not end")


def test_page_through_250_with_page_size_40(populated):
    client, ids = populated
    seen = []
    responses = list(pages(client, 40))
    assert [len(r.datacenters) for r in responses] == [40] * 6 + [10]
    for r in responses:
        assert r.total_size == N
        seen.extend(dc.id for dc in r.datacenters)
        if r.next_page_token:
            token = r.next_page_token
            # Opaque: no id, name or bare offset shows through.
            assert not token.isdigit()
            assert not any(part in token for part in (r.datacenters[-1].id, "Page DC", "page-dc"))
    assert responses[-1].next_page_token == ""
    assert len(seen) == len(set(seen)) == N, "every id exactly once"
    assert seen == ids, "creation order"


def test_default_and_maximum_page_size(populated):
    client, ids = populated
    first = client.ListDatacenters(pb.ListDatacentersRequest())
    assert len(first.datacenters) == 50 and first.total_size == N and first.next_page_token
    everything = client.ListDatacenters(pb.ListDatacentersRequest(page_size=1000))
    assert [dc.id for dc in everything.datacenters] == ids and everything.next_page_token == ""
    # Past the maximum: rejected, or clamped to 1000.
    try:
        big = client.ListDatacenters(pb.ListDatacentersRequest(page_size=5000))
    except grpc.RpcError as err:
        assert err.code() == Code.INVALID_ARGUMENT, err.code()
    else:
        assert len(big.datacenters) == N


def test_token_survives_concurrent_inserts(server):
    client = server.tenant()
    ids = [client.create(f"Early DC {i}").id for i in range(60)]
    gen = pages(client, 25)
    seen = [dc.id for dc in next(gen).datacenters]
    added = [client.create(f"Late DC {i}").id for i in range(5)]
    for resp in gen:
        seen += [dc.id for dc in resp.datacenters]
    assert len(seen) == len(set(seen)), "no duplicates"
    assert seen == ids + added, "every id exactly once, in creation order"


def test_filters_and_total_size(populated):
    client, ids = populated

    def check(expected_idx, **filters):
        got = list_all(client, page_size=33, **filters)
        first = client.ListDatacenters(pb.ListDatacentersRequest(page_size=7, **filters))
        assert [dc.id for dc in got] == [ids[i] for i in expected_idx], filters
        assert first.total_size == len(expected_idx), filters

    check([i for i in range(N) if i % 3 == 1], region="region-1")
    check([i for i in range(N) if i % 5 == 0], provider_name="docker")
    check([i for i in range(N) if i % 2 == 0], label_selector="parity=even")
    check([i for i in range(N) if i % 2 == 0 and i % 4 == 2], label_selector="parity=even,tier=2")
    check([i for i in range(N) if i % 3 == 2 and i % 5 == 0], region="region-2", provider_name="docker")
    check([], label_selector="parity=none")

    maintenance = [3, 77, 200]
    for i in maintenance:
        client.SetDatacenterStatus(pb.SetDatacenterStatusRequest(id=ids[i], status=S.DATACENTER_STATUS_MAINTENANCE))
    check(maintenance, status=S.DATACENTER_STATUS_MAINTENANCE)
    check([i for i in range(N) if i not in maintenance], status=S.DATACENTER_STATUS_ACTIVE)


def test_token_with_other_filters_is_rejected(populated):
    client, _ = populated
    first = client.ListDatacenters(pb.ListDatacentersRequest(page_size=10, region="region-0"))
    assert first.next_page_token
    err = expect_code(
        Code.INVALID_ARGUMENT,
        client.ListDatacenters,
        pb.ListDatacentersRequest(page_size=10, region="region-1", page_token=first.next_page_token),
    )
    assert "page_token" in field_violations(err)


def test_admin_lists_across_tenants(server, populated):
    client, ids = populated
    admin = server.admin()
    mine = list_all(admin, tenant_id=client.tenant)
    assert [dc.id for dc in mine] == ids
    everything = admin.ListDatacenters(pb.ListDatacentersRequest(page_size=1))
    assert everything.total_size >= len(mine)
