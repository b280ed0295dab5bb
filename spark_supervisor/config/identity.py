"""Who owns what: the labels the supervisor puts on its containers, their names and roles, and every
question asked of a container's identity. The one place these are answered; pure.

Four kinds of container, by their labels (config/labels.py names them):
- a deployment's node container (a Ray node, or the home of the mp serve): ``OWNER_LABEL`` = the deployment,
  named ``node_container_name``: ``owns(c, dep)``;
- a deployment's prefetch (``OWNER_LABEL`` and the role ``PREFETCH_ROLE``): labelled for the deployment
  (``labelled_for``, teardown removes it) but not one of its node containers;
- a short-lived helper (image and model checks, the page-cache drop): ``HELPER_LABEL``, ``is_helper``;
- anyone else's. One with any label of ours (another supervisor's too) is never stale (``is_stale``); one
  labelled for a deployment that is not configured is an orphan (``is_orphan``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

from ..model import Container, NodeObservation
from . import (
    HASH_LABEL,
    HELPER_LABEL,
    LABEL_PREFIX,
    NODE_LABEL,
    OWNER_LABEL,
    RAY_STATE_LABEL,
    ROLE_LABEL,
    Config,
    Deployment,
    Node,
)

PREFETCH_ROLE = "model-prefetch"  # ours (owner label) but not one of the deployment's node containers


# ---------------------------------------------------------------------------------------- names, labels
def node_container_name(dep: Deployment, node: Node) -> str:
    """Our one container per node of a deployment: a Ray node, or (mp) the home of the serve."""
    return f"{dep.name}-{'ray' if dep.uses_ray else 'vllm'}-{node.name}"


def prefetch_name(dep: Deployment, node: Node) -> str:
    return f"{dep.name}-model-{node.name}"


def node_labels(dep: Deployment, node: Node, *, head: bool, spec_hash: str, dashboard: bool) -> dict[str, str]:
    """A node container's labels: its deployment, spec, node and role (and on a Ray head how Ray is read)."""
    labels = {OWNER_LABEL: dep.name, HASH_LABEL: spec_hash, NODE_LABEL: node.name,
              ROLE_LABEL: f"ray-{'head' if head else 'worker'}" if dep.uses_ray else "serve"}
    if dep.uses_ray and head:
        labels[RAY_STATE_LABEL] = "dashboard" if dashboard else "gcs"
    return labels


# The deployment's owner label only where the planner knows the role (the prefetch): any other container
# owned by a deployment counts as one of its node containers.
def helper_labels(role: str, dep: Deployment | None = None, node: Node | None = None) -> dict[str, str]:
    labels = {ROLE_LABEL: role, HELPER_LABEL: role}
    if node is not None:
        labels[NODE_LABEL] = node.name
    if dep is not None:
        labels[OWNER_LABEL] = dep.name
    return labels


def prefetch_labels(dep: Deployment, node: Node) -> dict[str, str]:
    """A prefetch's: a helper of the deployment's (a teardown removes it), not one of its node containers."""
    return helper_labels(PREFETCH_ROLE, dep, node)


# ---------------------------------------------------------------------------------------- questions
def owner(c: Container) -> str | None:
    """The deployment a container is labelled for (None: none)."""
    return owner_of(c.labels)


def owner_of(labels: Mapping[str, str]) -> str | None:
    """The same from a container's labels, or from an engine event's attributes (which hold them)."""
    return labels.get(OWNER_LABEL)


def labelled_for(c: Container, dep: Deployment) -> bool:
    """Labelled for the deployment, whatever its role (its node containers and its prefetch)."""
    return owner(c) == dep.name


def named(containers: Iterable[Container], name: str) -> Container | None:
    """The container of that name in a node's listing (an engine's names are unique), or None."""
    return next((c for c in containers if c.name == name), None)


def owns(c: Container, dep: Deployment) -> bool:
    """One of the deployment's node containers: labelled for it, and not its prefetch."""
    return labelled_for(c, dep) and c.labels.get(ROLE_LABEL) != PREFETCH_ROLE


def owned(o: NodeObservation, dep: Deployment) -> list[Container]:
    """The deployment's node containers on one node (``owns``)."""
    return [c for c in o.containers if owns(c, dep)]


def spec_hash(c: Container) -> str | None:
    """The Ray spec hash a node container was created with (None: no label)."""
    return c.labels.get(HASH_LABEL)


def ray_via(head: Container) -> str:
    """How a Ray head's nodes are read: "gcs" (created without a dashboard) or "dashboard"."""
    return "gcs" if head.labels.get(RAY_STATE_LABEL) == "gcs" else "dashboard"


def owned_by_any(c: Container, cfg: Config) -> bool:
    """Labelled for a configured deployment (this one or another sharing the nodes)."""
    return owner(c) in cfg.owners


def is_helper(c: Container) -> bool:
    """One of the short-lived containers the supervisor runs (checks, prefetch, page-cache drop)."""
    return HELPER_LABEL in c.labels


def has_our_label(c: Container) -> bool:
    """Any label of ours: a deployment's, a helper's, this daemon's or another supervisor's."""
    return any(k.startswith(LABEL_PREFIX) for k in c.labels)


def is_stale(c: Container, cfg: Config) -> bool:
    """A container the stale rules name. One carrying any label of ours (a deployment's, a helper's, this
    daemon's or another supervisor's, a concurrent `check --preflight`'s) is never stale, whatever its name
    or image: only the owner rules (``is_orphan``, teardown) may remove it, by its deployment's name."""
    if has_our_label(c):
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
    o = owner(c)
    if o is None:
        return False
    return o not in cfg.owners or (o == dep.name and not member)


def torn_down(c: Container, dep: Deployment, node: Node) -> bool:
    """What a teardown of the deployment removes on a node: everything labelled for it (its prefetch too);
    an unlabelled container only by the deployment's own name there (never a container another deployment
    or supervisor owns, whatever it is called)."""
    o = owner(c)
    return o == dep.name if o is not None else c.name == node_container_name(dep, node)


def teardown_targets(containers: Iterable[Container], dep: Deployment, node: Node) -> list[str]:
    """The names a teardown of the deployment removes among a node's containers (``torn_down``)."""
    return [c.name for c in containers if torn_down(c, dep, node)]
