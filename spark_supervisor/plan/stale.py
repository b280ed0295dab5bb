"""What the hygiene step removes or stops: stale containers and units, and orphans. Pure."""

from __future__ import annotations

import fnmatch

from ..config import LABEL_PREFIX, OWNER_LABEL, Config, Deployment
from ..model import Container, NodeObservation

_ACTIVE = {"active", "activating", "reloading", "deactivating"}


def is_stale(c: Container, cfg: Config) -> bool:
    """A container the stale rules name. One carrying any label of ours (a deployment's, a helper's, this
    daemon's or another supervisor's, a concurrent `check --preflight`'s) is never stale, whatever its name
    or image: only the owner rules (``is_orphan``, teardown) may remove it, by its deployment's name."""
    if any(k.startswith(LABEL_PREFIX) for k in c.labels):
        return False
    st = cfg.stale
    if c.name in st.containers or any(fnmatch.fnmatch(c.image, p) for p in st.image_patterns):
        return True
    for want in st.container_labels:
        key, _, value = want.partition("=")
        if key in c.labels and (not value or c.labels[key] == value):
            return True
    return False


def is_orphan(c: Container, cfg: Config, dep: Deployment, member: bool) -> bool:
    """The one owner rule: a container labelled as ours belongs to the deployment its label names. It is an
    orphan only when that deployment is not configured, or is this one on a node it no longer uses; another
    configured deployment's container is never ours to remove, whatever its state."""
    owner = c.labels.get(OWNER_LABEL)
    if owner is None:
        return False
    return owner not in cfg.owners or (owner == dep.name and not member)


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
