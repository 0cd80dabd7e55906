"""The version `loom serve` registers its NATS service with (loom/serve.py)."""

from __future__ import annotations

import pytest
from nats.micro.service import SEMVER_REGEX

from loom.serve import service_version
from loom.versions import NOT_INSTALLED


@pytest.mark.parametrize(("installed", "registered"), [
    pytest.param("0.1.0", "0.1.0", id="installed-package"),
    pytest.param(NOT_INSTALLED, "0.0.0", id="checkout-on-pythonpath"),
])
def test_a_service_registers_a_semantic_version(installed: str, registered: str) -> None:
    assert service_version(installed) == registered
    assert SEMVER_REGEX.match(registered)  # what nats-py checks before it registers
