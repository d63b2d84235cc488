"""Fixtures of the engine's tests: the probe worker (`testing.PROBE`), the engine's fixtures
over it and the host's PostgreSQL and Redis fixtures (both from `runtime.fixtures`)."""

from __future__ import annotations

import pytest

from acme.workers.runtime.fixtures import (
    container,
    make_loop,
    pg_database,
    pg_funnel,
    pg_storage,
    pg_url,
    redis_url,
    tenant,
)
from acme.workers.runtime.testing import PROBE
from acme.workers.runtime.worker import Worker

__all__ = [
    "container",
    "make_loop",
    "pg_database",
    "pg_funnel",
    "pg_storage",
    "pg_url",
    "redis_url",
    "tenant",
]


@pytest.fixture
def worker() -> Worker:
    """The worker under test: the probe."""
    return PROBE
