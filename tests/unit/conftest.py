"""Every unit test ends with no probe's unforeseen error (adapters.UNEXPECTED): the guard that turns any exception
out of a probe into that probe's unknown must not hide a bug. A test that provokes one on purpose asks for the
``unexpected`` fixture and reads it."""

from __future__ import annotations

import collections
from collections.abc import Iterator

import pytest

from spark_supervisor.adapters import UNEXPECTED


@pytest.fixture
def unexpected() -> collections.Counter[str]:
    """The probes' unforeseen errors this test provoked (probe -> count), forgiven at its end."""
    return UNEXPECTED


@pytest.fixture(autouse=True)
def no_unexpected_probe_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    UNEXPECTED.clear()
    yield
    provoked = dict(UNEXPECTED)
    UNEXPECTED.clear()
    if "unexpected" not in request.fixturenames:
        assert not provoked, f"a probe raised an unforeseen exception (see the probe.unexpected log): {provoked}"
