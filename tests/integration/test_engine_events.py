"""Each engine's container events followed over its real transport (the head's local socket, the worker's
SSH through docker-py and paramiko): a container made or removed beside the daemon moves the stream's
generation, so the next steady sweep lists again and sees it; with nothing changed the sweep keeps its
listing. (An ended or refused stream, and the bound on a silent one: tests/unit/test_docker_events.py.)"""

from __future__ import annotations

import pytest

from spark_supervisor.adapters.docker import LISTINGS, DockerEngine
from spark_testbed import testbed

ENGINES = {"spark-1": f"unix://{testbed.sock('spark-1')}", "spark-2": "ssh://spark-2:2222"}


@pytest.mark.parametrize("node", ENGINES)
def test_a_container_made_and_removed_beside_the_daemon_is_in_the_next_steady_listing(
        node: str, tb: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LISTINGS, "TTL_S", 0.0)  # no sharing for a moment: a kept listing is the stream's doing
    name = f"spark-events-{node}"
    testbed.docker(node, "rm", "-f", name, check=False)
    engine = DockerEngine(node, ENGINES[node], timeout=30, follow=True)
    try:
        engine.containers(trusted=True)  # the first steady sweep starts following
        testbed.until(lambda: LISTINGS.generation(engine.url) >= 0, 60, f"{node}'s event stream open")
        kept = engine.containers(trusted=True)
        assert name not in {c.name for c in kept}
        assert engine.containers(trusted=True) is kept, "nothing changed, yet the steady sweep listed again"
        testbed.docker(node, "run", "-d", "--name", name, testbed.BUSYBOX, "sleep", "600")
        testbed.until(lambda: name in {c.name for c in engine.containers(trusted=True)}, 15,
                      "the container made beside it, in a steady sweep's listing")
        testbed.docker(node, "rm", "-f", name)
        testbed.until(lambda: name not in {c.name for c in engine.containers(trusted=True)}, 15,
                      "its removal, in a steady sweep's listing")
    finally:
        engine.close()
        testbed.docker(node, "rm", "-f", name, check=False)
    assert engine.url not in LISTINGS.followers
