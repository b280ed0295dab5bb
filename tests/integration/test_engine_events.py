"""Each engine's container events followed over its real transport (the head's local socket, the worker's
SSH through docker-py and paramiko): a container made or removed beside the daemon moves the stream's
generation, so the next steady sweep lists again and sees it; with nothing changed the sweep keeps its
listing. (An ended or refused stream, and the bound on a silent one: tests/unit/test_docker_events.py.)"""

from __future__ import annotations

import pytest

from spark_supervisor.adapters.docker import LISTINGS, DockerEngine
from spark_supervisor.config import OWNER_LABEL
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


@pytest.mark.parametrize("node", ENGINES)
def test_a_detached_exec_that_ends_in_a_container_of_ours_cues_the_daemon_and_one_it_waited_on_does_not(
        node: str, tb: dict[str, str]) -> None:
    """The real engine's exec_die, over its real transport: a serve's wrapper is a detached exec, and its end (the
    serve's) is a cue at once; the ID an exec_create answers is the one its end names (an exec this process waited
    on is no cue)."""
    name = f"spark-exec-events-{node}"
    testbed.docker(node, "rm", "-f", name, check=False)
    testbed.docker(node, "run", "-d", "--name", name, "--label", f"{OWNER_LABEL}=test", testbed.BUSYBOX, "sleep", "600")
    engine = DockerEngine(node, ENGINES[node], timeout=30, follow=True)
    cues: list[int] = []
    stop = LISTINGS.listen(lambda: cues.append(1))
    try:
        engine.containers(trusted=True)  # the first steady sweep starts following
        testbed.until(lambda: LISTINGS.generation(engine.url) >= 0, 60, f"{node}'s event stream open")
        assert engine.exec(name, ["true"]) == (0, "")
        engine.exec(name, ["sh", "-c", "exit 3"], detach=True)
        testbed.until(lambda: cues, 15, "the detached exec's end, as a cue")
        gen = LISTINGS.generation(engine.url)
        testbed.docker(node, "update", "--restart", "no", name)  # a change, told after both ends
        testbed.until(lambda: LISTINGS.generation(engine.url) != gen, 15, "the change after them taken in")
        assert cues == [1], "an exec this process waited on was taken for a cue"
    finally:
        stop()
        engine.close()
        testbed.docker(node, "rm", "-f", name, check=False)
