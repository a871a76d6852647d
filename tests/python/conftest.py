"""Fixtures for the Python client tests.

The client is generated from proto/ with grpcio-tools at session start into
tests/python/gen/ (gitignored). Each test module gets its own
ctrlplane-datacenter process, once on SQLite and once on PostgreSQL (when
CP_TEST_POSTGRES_URL is set; tests/run.sh always sets it, and under CI=true
its absence is an error rather than a skip).

Tokens are minted here with PyJWT from the secret the fixture starts the
server with: HS256, claims sub, tenant_id, roles, iat, exp.

A datacenter can only be created on a provider for which an agent has
joined (FAILED_PRECONDITION otherwise), so the fixture joins one agent for
each provider in AGENT_PROVIDERS through the generated AgentRegistryService
stub, the way an agent does: an admin mints a join token (CreateJoinToken),
the agent calls JoinAgent with it and no bearer token. Nothing listens at
those agents' endpoints: they are registry entries only.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import jwt
import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN = Path(__file__).resolve().parent / "gen"
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
BIN_DIR = Path(os.environ.get("CP_TEST_BIN_DIR", TARGET / "debug"))
ADMIN_ROLE = "system:admin"


def _generate_stubs() -> None:
    """Runs grpc_tools.protoc over every proto/ file into GEN."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    protos = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))
    assert protos, "no .proto files under proto/"
    shutil.rmtree(GEN, ignore_errors=True)
    GEN.mkdir(parents=True)
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT / 'proto'}",
        f"-I{include}",
        f"--python_out={GEN}",
        f"--pyi_out={GEN}",
        f"--grpc_python_out={GEN}",
        *protos,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed with {rc}: {' '.join(args)}")


_generate_stubs()
sys.path.insert(0, str(GEN))

from ctrlplane.agent.v1 import agent_pb2 as agent_pb  # noqa: E402
from ctrlplane.agent.v1 import agent_pb2_grpc as agent_grpc  # noqa: E402
from ctrlplane.datacenter.v1 import datacenter_pb2 as pb  # noqa: E402
from ctrlplane.datacenter.v1 import datacenter_pb2_grpc as pb_grpc  # noqa: E402

# Providers the tests create datacenters on; the fixture joins an agent for
# each before any test runs.
AGENT_PROVIDERS = ("process", "docker")
# Where the fixture's agents say they listen (nothing does: port 9 is
# "discard").
AGENT_ENDPOINT = "http://127.0.0.1:9"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health_serving(channel: grpc.Channel, timeout: float = 1.0) -> bool:
    """grpc.health.v1.Health/Check with service "", without health stubs:
    the empty request encodes to b"", SERVING (1) to b"\\x08\\x01"."""
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    try:
        return check(b"", timeout=timeout) == b"\x08\x01"
    except grpc.RpcError:
        return False


@dataclass
class Server:
    """A running ctrlplane-datacenter."""

    addr: str
    secret: str
    backend: str
    log_path: Path
    process: subprocess.Popen
    channels: list = field(default_factory=list)

    def token(
        self,
        subject: str = "pytest",
        tenant: str = "",
        roles: list[str] | None = None,
        ttl: int = 3600,
        secret: str | None = None,
    ) -> str:
        now = int(time.time())
        claims = {
            "sub": subject,
            "tenant_id": tenant,
            "roles": roles or [],
            "iat": now,
            "exp": now + ttl,
        }
        return jwt.encode(claims, secret or self.secret, algorithm="HS256")

    def admin_token(self) -> str:
        return self.token(subject="pytest-admin", roles=[ADMIN_ROLE])

    def channel(self) -> grpc.Channel:
        ch = grpc.insecure_channel(self.addr)
        self.channels.append(ch)
        return ch

    def stub(self) -> pb_grpc.DatacenterServiceStub:
        return pb_grpc.DatacenterServiceStub(self.channel())

    def client(self, token: str | None) -> "Client":
        return Client(self.stub(), token)

    def admin(self) -> "Client":
        return self.client(self.admin_token())

    def registry(self) -> agent_grpc.AgentRegistryServiceStub:
        """An AgentRegistryService stub (no token attached)."""
        return agent_grpc.AgentRegistryServiceStub(self.channel())

    def join_token(self, provider: str, max_uses: int = 0, ttl_seconds: int = 600) -> str:
        """CreateJoinToken as system:admin; returns the secret token."""
        from google.protobuf import duration_pb2

        resp = self.registry().CreateJoinToken(
            agent_pb.CreateJoinTokenRequest(
                provider_name=provider, max_uses=max_uses, ttl=duration_pb2.Duration(seconds=ttl_seconds)
            ),
            metadata=[("authorization", f"Bearer {self.admin_token()}")],
            timeout=30,
        )
        return resp.token

    def join_agent(
        self,
        provider: str,
        token: str | None = None,
        idempotency_key: str | None = None,
        endpoint: str = AGENT_ENDPOINT,
    ) -> agent_pb.JoinAgentResponse:
        """JoinAgent as an agent does: the join token, no bearer token. A
        token is minted for the provider when none is given."""
        return self.registry().JoinAgent(
            agent_pb.JoinAgentRequest(
                token=token if token is not None else self.join_token(provider),
                provider_name=provider,
                endpoint=endpoint,
                version="pytest",
                capabilities=["provision"],
                idempotency_key=idempotency_key if idempotency_key is not None else uuid.uuid4().hex,
            ),
            timeout=30,
        )

    def tenant(self, tenant: str | None = None) -> "Client":
        """A client for a fresh (or the given) tenant, without roles."""
        tenant = tenant or f"t-{uuid.uuid4().hex[:12]}"
        c = self.client(self.token(subject=f"user-{tenant}", tenant=tenant))
        c.tenant = tenant
        return c

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-lines:])
        except OSError:
            return "(no log)"


class Client:
    """DatacenterService calls with the caller's token attached."""

    def __init__(self, stub: pb_grpc.DatacenterServiceStub, token: str | None):
        self.stub = stub
        self.token = token
        self.tenant = ""

    @property
    def metadata(self):
        return [("authorization", f"Bearer {self.token}")] if self.token else []

    def __getattr__(self, method: str):
        rpc = getattr(self.stub, method)

        def call(request, **kwargs):
            kwargs.setdefault("timeout", 30)
            return rpc(request, metadata=self.metadata, **kwargs)

        return call

    def create(self, name: str, provider: str = "process", **fields) -> pb.Datacenter:
        dc = pb.Datacenter(name=name, provider_name=provider, **fields)
        return self.CreateDatacenter(pb.CreateDatacenterRequest(datacenter=dc)).datacenter


def _create_database(base_url: str) -> str:
    """Creates a fresh database on the test cluster; returns its URL."""
    name = f"pytest_{uuid.uuid4().hex[:16]}"
    subprocess.run(
        ["psql", "-q", "-X", "-v", "ON_ERROR_STOP=1", base_url, "-c", f'CREATE DATABASE "{name}"'],
        check=True,
        capture_output=True,
        text=True,
    )
    head, _, _ = base_url.rpartition("/")
    return f"{head}/{name}"


def _backends() -> list[str]:
    return ["sqlite", "postgres"]


@pytest.fixture(scope="module", params=_backends())
def server(request, tmp_path_factory):
    """A ctrlplane-datacenter for this module, on SQLite or PostgreSQL."""
    backend = request.param
    binary = BIN_DIR / "ctrlplane-datacenter"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: run cargo build --workspace first")
    tmp = tmp_path_factory.mktemp(f"dc-{backend}")
    if backend == "sqlite":
        db_url = f"sqlite://{tmp / 'datacenter.db'}"
    else:
        base = os.environ.get("CP_TEST_POSTGRES_URL", "")
        if not base:
            if os.environ.get("CI"):
                pytest.fail("CP_TEST_POSTGRES_URL is not set (tests/run.sh starts PostgreSQL)")
            pytest.skip("CP_TEST_POSTGRES_URL is not set (run tests/run.sh for PostgreSQL)")
        db_url = _create_database(base)

    port = free_port()
    addr = f"127.0.0.1:{port}"
    secret = secrets.token_hex(32)
    log_path = tmp / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CP_")}
    env.update(
        CP_LISTEN_ADDR=addr,
        CP_DATABASE_URL=db_url,
        CP_DATA_DIR=str(tmp),
        CP_AUTH_SECRET=secret,
        CP_LOG=os.environ.get("CP_LOG", "info"),
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(binary)], env=env, stdout=log, stderr=subprocess.STDOUT)
    srv = Server(addr=addr, secret=secret, backend=backend, log_path=log_path, process=proc)

    probe = grpc.insecure_channel(addr)
    deadline = time.monotonic() + 30
    try:
        while not health_serving(probe):
            if proc.poll() is not None:
                pytest.fail(f"ctrlplane-datacenter exited with {proc.returncode}:\n{srv.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"ctrlplane-datacenter not SERVING after 30 s:\n{srv.log_tail()}")
            time.sleep(0.1)
    finally:
        probe.close()

    try:
        for provider in AGENT_PROVIDERS:
            srv.join_agent(provider)
    except grpc.RpcError as err:
        proc.kill()
        proc.wait()
        pytest.fail(f"joining a {provider} agent failed: {err.code().name}: {err.details()}\n{srv.log_tail()}")

    yield srv

    for ch in srv.channels:
        ch.close()
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Adds the server's log tail to a failed test's report."""
    outcome = yield
    report = outcome.get_result()
    # (funcargs holds every fixture the test used, directly or not.)
    srv = getattr(item, "funcargs", {}).get("server")
    if report.failed and isinstance(srv, Server):
        report.sections.append((f"ctrlplane-datacenter log ({srv.backend}, tail)", srv.log_tail()))


@pytest.fixture
def admin(server) -> Client:
    return server.admin()


@pytest.fixture
def tenant(server) -> Client:
    """A client for a fresh tenant."""
    return server.tenant()
