"""Fixtures of the gateway's unit tests."""

from __future__ import annotations

import pytest

from tests.unit.agentloop.gateway.helpers import stop_gateways


@pytest.fixture(autouse=True)
async def stopped_gateways():
    """Stops the gateways a test started, after it, on its own event loop (every test here:
    a gateway left in ``CONTEXTS`` would be stopped by a later module, after its own loop
    has closed)."""
    yield
    await stop_gateways()
