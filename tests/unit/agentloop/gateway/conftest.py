"""Fixtures of the gateway's unit tests."""

from __future__ import annotations

import pytest

from tests.unit.agentloop.gateway.helpers import stop_gateways


@pytest.fixture
async def stopped_gateways():
    """Stops the gateways a test started, after it, on its own event loop."""
    yield
    await stop_gateways()
