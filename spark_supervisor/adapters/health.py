"""vLLM's /health, asked by two clients: the tick's (httpx, adapters/vllm.py) and the quick watch's between
ticks (http.client, adapters/quick.py). What they saw is read here, once, so that the two agree: the quick
watch wakes the loop when its reading differs from the tick's, and a reading that differed only by client
would wake it every second."""

from __future__ import annotations

import errno
import socket

import httpx

from ..model import EndpointObservation, EndpointState

# The errors of a connect that found no listener or no route: httpcore raises httpx.ConnectError for each
# (any OSError while connecting but a timeout); http.client raises them as they are.
CONNECT_ERRNOS = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN,
                            errno.ENETDOWN, errno.EADDRNOTAVAIL})


def refused(e: BaseException) -> bool:
    """No connection could be made (nothing listens there, or it cannot be reached); a timeout is not one."""
    if isinstance(e, httpx.HTTPError):
        return isinstance(e, httpx.ConnectError)
    if isinstance(e, TimeoutError):
        return False
    return isinstance(e, socket.gaierror) or (isinstance(e, OSError) and e.errno in CONNECT_ERRNOS)


def observed(status: int | None = None, failure: BaseException | None = None) -> EndpointObservation:
    """One GET /health: the HTTP status it answered, or the exception that ended it."""
    if failure is None:
        return EndpointObservation(EndpointState.UP, "", status)
    if refused(failure):
        return EndpointObservation(EndpointState.REFUSED)
    return EndpointObservation(EndpointState.ERROR, f"/health: {type(failure).__name__}")
