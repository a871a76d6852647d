"""Helpers shared by the Python client tests (stubs come from conftest)."""

from __future__ import annotations

import queue
import threading
import time
import uuid

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from ctrlplane.bootstrap.v1 import spec_pb2
from ctrlplane.datacenter.v1 import datacenter_pb2 as pb
from ctrlplane.provider.v1 import types_pb2

Code = grpc.StatusCode
TYPEID_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def rpc_error(fn, *args, **kwargs) -> grpc.RpcError:
    """Calls fn and returns the grpc.RpcError it raises (fails if none)."""
    try:
        result = fn(*args, **kwargs)
    except grpc.RpcError as err:
        return err
    pytest.fail(f"expected an RPC error, got a response: {result!r}")


def expect_code(code: grpc.StatusCode, fn, *args, **kwargs) -> grpc.RpcError:
    err = rpc_error(fn, *args, **kwargs)
    assert err.code() == code, f"expected {code.name}, got {err.code().name}: {err.details()}"
    return err


def status_details(err: grpc.RpcError) -> status_pb2.Status:
    """The google.rpc.Status of the grpc-status-details-bin trailer."""
    trailers = dict(err.trailing_metadata() or ())
    raw = trailers.get("grpc-status-details-bin")
    assert raw, f"no grpc-status-details-bin trailer on {err.code().name}: {err.details()}"
    status = status_pb2.Status.FromString(raw)
    assert status.code == err.code().value[0]
    return status


def field_violations(err: grpc.RpcError) -> dict[str, list[str]]:
    """field path -> descriptions, from the google.rpc.BadRequest detail."""
    assert err.code() == Code.INVALID_ARGUMENT, f"{err.code().name}: {err.details()}"
    out: dict[str, list[str]] = {}
    found = False
    for detail in status_details(err).details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            found = True
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            for v in bad.field_violations:
                out.setdefault(v.field, []).append(v.description)
    assert found, "INVALID_ARGUMENT without a google.rpc.BadRequest detail"
    return out


def unknown_dc_id() -> str:
    """A well-formed datacenter TypeID (dc_ + UUIDv7) that names nothing."""
    ms = int(time.time() * 1000)
    rand = uuid.uuid4().int & ((1 << 74) - 1)
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return "dc_" + "".join(TYPEID_ALPHABET[(value >> (5 * (25 - i))) & 31] for i in range(26))


def bootstrap_spec(name: str = "log-shipper", service: str = "vector") -> spec_pb2.BootstrapServiceSpec:
    return spec_pb2.BootstrapServiceSpec(
        name=name,
        kind=types_pb2.WORKLOAD_KIND_DEPLOYMENT,
        services=[types_pb2.ServiceSpec(name=service, image="timberio/vector:0.40")],
    )


def list_all(client, page_size: int = 1000, **filters) -> list[pb.Datacenter]:
    out: list[pb.Datacenter] = []
    token = ""
    for _ in range(10_000):
        resp = client.ListDatacenters(pb.ListDatacentersRequest(page_size=page_size, page_token=token, **filters))
        out.extend(resp.datacenters)
        token = resp.next_page_token
        if not token:
            return out
    pytest.fail("ListDatacenters never returned an empty next_page_token")


class Watch:
    """A WatchDatacenters stream read on a thread into a queue."""

    def __init__(self, client, since_revision: int, timeout: float = 120):
        self.call = client.WatchDatacenters(
            pb.WatchDatacentersRequest(since_revision=since_revision), timeout=timeout
        )
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for resp in self.call:
                self.queue.put(resp.event)
        except grpc.RpcError as err:
            self.queue.put(err)
        self.queue.put(None)

    def next(self, timeout: float = 15) -> pb.DatacenterEvent:
        try:
            item = self.queue.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no event on the watch stream within {timeout} s")
        if item is None:
            pytest.fail("the watch stream ended")
        if isinstance(item, grpc.RpcError):
            if item.code() == Code.CANCELLED:
                pytest.fail("the watch stream was cancelled")
            raise item
        return item

    def take(self, n: int, timeout: float = 15) -> list[pb.DatacenterEvent]:
        return [self.next(timeout) for _ in range(n)]

    def assert_quiet(self, wait: float = 0.5):
        try:
            item = self.queue.get(timeout=wait)
        except queue.Empty:
            return
        pytest.fail(f"unexpected item on the watch stream: {item!r}")

    def close(self):
        self.call.cancel()
        self.thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
