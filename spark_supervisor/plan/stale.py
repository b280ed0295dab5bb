"""What the hygiene step stops: stale units. (Stale containers and orphans: identity.is_stale, is_orphan.) Pure."""

from __future__ import annotations

from ..config import Config
from ..model import NodeObservation

_ACTIVE = {"active", "activating", "reloading", "deactivating"}


def stale_units(o: NodeObservation, cfg: Config) -> tuple[str, ...]:
    """Configured stale units that run, or would come back at boot when disabling is asked for."""
    st, found = cfg.stale, {u.name.removesuffix(".service"): u for u in o.units or ()}
    out = []
    for name in st.units:
        u = found.get(name.removesuffix(".service"))
        if u is None or u.loaded == "not-found":
            continue
        if (u.active in _ACTIVE or (st.mask and u.enabled != "masked")
                or (st.disable and u.enabled in ("enabled", "enabled-runtime"))):
            out.append(name)
    return tuple(out)
