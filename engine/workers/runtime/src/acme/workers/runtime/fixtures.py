"""Pytest fixtures for a worker's tests and the engine's: the memory container, a tenant,
a loop factory, each over the `worker` fixture (the `Worker` under test), and the host's
own PostgreSQL and Redis fixtures (`pg_url`, `pg_storage`, `redis_url`, ...).

A tests folder's `conftest.py` binds the fixtures it uses from here to names of its own
and defines `worker` (a `Worker`, re-exported here for its annotation). Test code only
(it imports pytest and the host's `om/tests/conftest.py`, which the host's pytest
settings put on the path); nothing here runs in production.
"""

from __future__ import annotations

import importlib
from typing import Any
from uuid import uuid4

import pytest
from prometheus_client import CollectorRegistry

from acme.infra.container import Infra
from acme.om.context import OpContext, RequestContext
from acme.om.storage.impl.memory import MemoryStorageRoot
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.loop import WorkerLoop
from acme.workers.runtime.testing import APP, LoopFactory, make_settings
from acme.workers.runtime.worker import Worker

__all__ = [
    "Worker",
    "container",
    "make_loop",
    "pg_database",
    "pg_funnel",
    "pg_storage",
    "pg_url",
    "redis_url",
    "tenant",
]

# The host's PostgreSQL and Redis fixtures (om/tests/conftest.py: one migrated database per
# session, reached as the application role, so row-level security holds), re-exported for
# the tests folders under workers/. Loaded by name: to mypy, `conftest` is any conftest.
_host_fixtures = importlib.import_module("conftest")
pg_database = _host_fixtures.pg_database
pg_url = _host_fixtures.pg_url
pg_funnel = _host_fixtures.pg_funnel
pg_storage = _host_fixtures.pg_storage
redis_url = _host_fixtures.redis_url


@pytest.fixture
def container(worker: Worker) -> RuntimeContainer:
    """The worker's container over the memory twins."""
    return worker.container.for_tests(MemoryStorageRoot(), Infra.memory())


@pytest.fixture
async def tenant(container: RuntimeContainer) -> OpContext:
    """A live tenant, and the context its enqueuer (a random user) acts under."""
    rctx = RequestContext.new(APP)
    org = await container.managers.tenancy.create_org(rctx, "test tenant")
    return await container.managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=uuid4(), caused_by_request_id=None
    )


@pytest.fixture
def make_loop(worker: Worker, container: RuntimeContainer) -> LoopFactory:
    """Build the worker's `WorkerLoop` over `container` with the `FAST` settings and a fresh
    metrics registry; keywords override the loop's arguments (`settings=`, `handlers=`, ...)."""

    def build(**overrides: Any) -> WorkerLoop:
        arguments: dict[str, Any] = {
            "settings": make_settings(worker),
            "worker_id": f"test-{uuid4().hex[:8]}",
        }
        return worker.loop(container, **(arguments | overrides), registry=CollectorRegistry())

    return build
