"""One retry vocabulary: tenacity's stop and wait strategies, for single adapter operations and for the
spacing of repairs. Recovering a whole phase is the loop's job, never a nested retry's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import tenacity

from . import TransientError

if TYPE_CHECKING:
    from ..config import Retry

F = TypeVar("F", bound=Callable[..., Any])


def transient(stop_after_attempt: int, stop_after_delay: float, wait_initial: float,
              wait_max: float) -> Callable[[F], F]:
    """Retry one adapter operation on TransientError only (refused, reset, timed out), bounded by
    attempts and time, with jittered exponential waits. Anything else is an answer, not a hiccup."""
    return tenacity.retry(  # type: ignore[return-value]
        retry=tenacity.retry_if_exception_type(TransientError),
        stop=tenacity.stop_after_attempt(stop_after_attempt) | tenacity.stop_after_delay(stop_after_delay),
        wait=tenacity.wait_random_exponential(multiplier=wait_initial, max=wait_max),
        reraise=True)


def from_config(r: Retry) -> Callable[[F], F]:
    """The policy named in the config's [retry] table."""
    return transient(r.stop_after_attempt, r.stop_after_delay, r.wait_initial, r.wait_max)


def backoff_delay(failures: int, base: float, cap: float, rnd: float) -> float:
    """The n-th consecutive failure waits up to base * 2^(n-1), capped (tenacity's wait_exponential,
    which also caps the exponent's overflow), times a jitter in [0.5, 1) from ``rnd`` in [0, 1)."""
    state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = max(1, failures)
    ceiling = tenacity.wait_exponential(multiplier=base, max=cap)(state)
    return float(ceiling) * (0.5 + 0.5 * rnd)
