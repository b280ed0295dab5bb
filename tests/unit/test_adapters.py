"""Adapter building blocks that need no peer: the hard deadline every Docker call runs under."""

import threading

import pytest

from spark_supervisor.adapters import TransientError, within


def test_a_call_that_hangs_is_abandoned_at_its_deadline_and_the_heartbeat_keeps_beating() -> None:
    release = threading.Event()
    beats: list[int] = []
    with pytest.raises(TransientError) as e:
        within(lambda: release.wait(30), 2.5, "pull img on spark-1", heartbeat=lambda: beats.append(1),
               reason="DockerTimeout")
    release.set()
    assert e.value.reason == "DockerTimeout" and "no answer within 2s" in str(e.value)  # rounded, as shown
    assert len(beats) >= 2  # the watchdog was fed while waiting


def test_a_result_and_an_error_come_back_as_they_are() -> None:
    assert within(lambda: 42, 5, "x") == 42

    def boom() -> None:
        raise ValueError("no")
    with pytest.raises(ValueError, match="no"):
        within(boom, 5, "x")
