"""Driving the daemon on the testbed from outside, as an operator would: shared by the tests and `make chaos`."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import tomllib
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import tomli_w

from . import testbed
from .release import release_env
from .testbed import until

ROOT = testbed.SRC
BIN = Path(sys.executable).parent
# The backend the shared tests, `make chaos` and `make test-mp` run the deployment with: "ray" (etc/testbed.toml)
# or "mp" (vLLM's own multi-node mode: a serve rank in a container on each node, no Ray).
BACKEND = os.environ.get("SPARK_TESTBED_BACKEND", "ray")
OWNED = {n: f"testbed-{'ray' if BACKEND == 'ray' else 'vllm'}-{n}" for n in testbed.NODES}
RANKS = {n: 1 if BACKEND == "mp" or n == "spark-1" else 0 for n in testbed.NODES}  # serves per node, serving


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def more_nodes(d: dict[str, Any], count: int) -> dict[str, Any]:
    """etc/testbed.toml's cluster grown to `count` nodes: spark-3.. like spark-2, each on its own engine
    reached over its own sshd and with its own host tree (testbed.up(count) starts them)."""
    worker = next(n for n in d["nodes"] if n["name"] == "spark-2")
    for name, ip in list(testbed.nodes(count).items())[len(d["nodes"]):]:
        text = json.dumps(worker).replace("spark-2", name).replace("127.0.0.3", ip)
        d["nodes"].append(json.loads(text.replace(f":{testbed.SSH_PORT}", f":{testbed.ssh_port(name)}")))
    env = d["deployments"][0]["serve"]["env"]
    env["STANDIN_GPU_STATES"] = ",".join(f"{testbed.DIR}/{n}/gpu.json" for n in testbed.nodes(count))
    env["STANDIN_HOST_ROOTS"] = ",".join(f"{testbed.DIR}/{n}/host" for n in testbed.nodes(count))
    return d


def single_node(d: dict[str, Any], name: str, node: str, port: int, **deployment: Any) -> dict[str, Any]:
    """A single-node deployment beside the testbed's (an embeddings model or a reranker in the runbook's
    stack): the same stand-in, vLLM's mp backend with TP 1 on `node`, its own port, fault switch and GPU.
    A name starting with "embed" or "rerank" is a pooling model probed as one (readiness.probe)."""
    dep = copy.deepcopy(d["deployments"][0])
    ip = testbed.ALL_NODES[node]
    dep.update(name=name, nodes=[node])
    dep["serve"].update(distributed_executor_backend="mp", tensor_parallel_size=1, port=port, served_model_name=name,
                        gpu_memory_utilization=0.2)
    dep["serve"]["env"] = {**dep["serve"]["env"], "STANDIN_FAULT_FILE": str(fault_file(name)),
                           "STANDIN_GPU_STATES": f"{testbed.DIR}/{node}/gpu.json",
                           "STANDIN_HOST_ROOTS": f"{testbed.DIR}/{node}/host"}
    dep["readiness"]["endpoint"] = f"http://{ip}:{port}"
    for kind in ("embeddings", "rerank"):
        if name.startswith(kind[:5]):
            dep["serve"]["extra_args"] = "--runner pooling --convert embed"
            dep["serve"].pop("reasoning_parser", None)
            dep["readiness"]["probe"] = kind
    return merge(dep, deployment)


def fault_file(deployment: str = "") -> Path:
    """The switch that makes a deployment's stand-in serve hang or fail (STANDIN_FAULT_FILE)."""
    return testbed.DIR / (f"serve-fault-{deployment}" if deployment else "serve-fault")


def write_config(tmp_path: Path, patch: dict[str, Any] | None = None, *,
                 deployment: dict[str, Any] | None = None, nodes: int = 2,
                 more: list[tuple[Any, ...]] | None = None, base: dict[str, Any] | None = None) -> Path:
    """etc/testbed.toml with the changes asked for, written to <tmp_path>/config.toml. base: the parsed config to
    start from instead (a release's own etc/testbed.toml, `make bench-beside`)."""
    d = copy.deepcopy(base) if base is not None else tomllib.loads((ROOT / "etc" / "testbed.toml").read_text())
    if nodes > 2:
        d = more_nodes(d, nodes)
    d = merge(d, {"supervisor": {"state_dir": str(tmp_path / "state")}})
    if BACKEND == "mp":
        d["deployments"][0]["serve"]["distributed_executor_backend"] = "mp"
    d = merge(d, patch or {})
    if deployment:
        d["deployments"][0] = merge(d["deployments"][0], deployment)
    for extra in more or ():  # further deployments: (name, node, port, patch) made by single_node
        d["deployments"].append(single_node(d, *extra[:3], **(extra[3] if len(extra) > 3 else {})))
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(d))
    return path


def containers(node: str) -> dict[str, dict[str, Any]]:
    """name -> {id, state, labels} on one node's engine, read with the docker CLI (not our adapter)."""
    out = testbed.docker(node, "ps", "-a", "--format", "{{json .}}").stdout.decode()
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {r["Names"]: {"id": r["ID"], "state": r["State"], "labels": r["Labels"]} for r in rows}


def bin_env(bin_dir: Path = BIN) -> dict[str, str]:
    """The environment to run the spark-supervisor in ``bin_dir`` with: the dev venv's (BIN) gets this process's
    own; another venv (a release's, `make bench-beside`) gets it without PYTHONPATH, which would put a
    checkout's spark_supervisor before the venv's own."""
    if bin_dir == BIN:
        return dict(os.environ)
    return release_env()


class Supervisor:
    """`spark-supervisor run` as a child process with a real sd_notify socket. bin_dir: the directory of the
    spark-supervisor to run (default: the dev venv's)."""

    STARTED: list[Supervisor] = []  # every daemon this process started (the suite reads their unforeseen errors)

    def __init__(self, config: Path, tmp_path: Path, name: str = "daemon", bin_dir: Path = BIN):
        Supervisor.STARTED.append(self)
        self.unexpected_seen = 0  # bytes of the log already read for probe.unexpected
        self.config, self.tmp = config, tmp_path
        self.state_dir = Path(tomllib.loads(config.read_text())["supervisor"]["state_dir"])
        self.log_path = tmp_path / f"{name}.log"
        self.notifications: list[str] = []
        self.addr = f"@spark-test-{uuid.uuid4().hex[:12]}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.addr[1:])
        self.sock.settimeout(0.2)
        self._reading = True
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._logf = open(self.log_path, "wb")
        self.bin_dir = bin_dir
        self.proc = subprocess.Popen([str(bin_dir / "spark-supervisor"), "run", "--config", str(config)],
                                     stdout=self._logf, stderr=subprocess.STDOUT,
                                     env={**bin_env(bin_dir), "NOTIFY_SOCKET": self.addr})

    def _read(self) -> None:
        while self._reading:
            try:
                self.notifications.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.state_dir / "status.json").read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if name is None or e.get("event") == name:
                out.append(e)
        return out

    def wait(self, cond: Callable[[dict[str, Any]], object], timeout: float, what: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.tail()}")
            st = self.status()
            return st if st is not None and cond(st) else None
        try:
            return until(check, timeout, what, every=0.2)  # type: ignore[return-value]
        except TimeoutError as e:
            raise AssertionError(f"{e}; last status: {json.dumps(self.status())[:1500]}\n{self.tail()}") from None

    def wait_phase(self, phase: str, timeout: float = 120) -> dict[str, Any]:
        return self.wait(lambda s: s["phase"] == phase, timeout, f"phase {phase}")

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self._reading = False
            self._reader.join(timeout=2)
            self.sock.close()
            self._logf.close()
        return code

    def new_unexpected(self) -> list[dict[str, Any]]:
        """The probe.unexpected events (a probe raised what no adapter foresees) logged since the last call."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.unexpected_seen)
                data = f.read()
        except OSError:
            return []
        data = data[:data.rfind(b"\n") + 1]  # a line still being written is read next time
        self.unexpected_seen += len(data)
        out = []
        for line in data.splitlines():
            if b"probe.unexpected" in line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    out.append({"event": "probe.unexpected", "error": line.decode(errors="replace")[:300]})
        return out

    def repairs(self, since: float = 0.0) -> list[dict[str, Any]]:
        """repair.started events logged at or after wall time `since`."""
        return [e for e in self.events("repair.started") if event_time(e) >= since]


def event_time(e: dict[str, Any]) -> float:
    return datetime.fromisoformat(e["timestamp"]).timestamp()


def container_processes(node: str, container: str) -> list[psutil.Process]:
    """Every process of a node's container, from the host's /proc under the container's shim (which parents
    both its init and what `docker exec` started), so that no exec is needed and it holds while either
    containerd or the container is hung."""
    shim = psutil.Process(testbed.container_pid(node, container)).parent()
    if shim is None or not shim.name().startswith("containerd-shim"):
        raise RuntimeError(f"the parent of {container}'s init is not its containerd shim: {shim}")
    children: list[psutil.Process] = shim.children(recursive=True)
    return children


def is_serve(argv: list[str]) -> bool:
    """A serve process (the python process, not its sh wrapper): the stand-in, the real server's API process,
    or `vllm serve` through the testbed's launcher (the real mp pair; a rank's main process)."""
    return len(argv) >= 3 and "python" in os.path.basename(argv[0]) and (
        (argv[1].endswith("/spark-testbed-vllm") and argv[2] == "serve")  # the stand-in
        or argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # the real server's API process
        or (argv[1].endswith("/vllm_launcher.py") and argv[2] == "serve"))  # the real `vllm serve`


def serve_pids(node: str = "spark-1", container: str = "") -> list[int]:
    """The host PIDs of the serve processes in a node's container."""
    out = []
    for p in container_processes(node, container or OWNED[node]):
        try:
            if is_serve(p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def serve_processes(node: str = "spark-1", container: str = "") -> int:
    """How many serve processes run in a node's container."""
    return len(serve_pids(node, container))


def container_violations(expect: dict[str, dict[str, int]], nodes: Iterable[str] | None = None) -> list[str]:
    """Where the containers differ from ``expect`` (node -> {container: its serve processes}), on each of
    ``nodes`` (default: expect's): exactly expect's containers there, running, each with its serve processes;
    none on a node expect does not name."""
    out = []
    for node in expect if nodes is None else nodes:
        now, mine = containers(node), expect.get(node, {})
        if {name: c["state"] for name, c in now.items()} != dict.fromkeys(mine, "running"):
            out.append(f"{node}: containers {({name: c['state'] for name, c in now.items()})}, "
                       f"expected {f'only {sorted(mine)} running' if mine else 'none'}")
            continue
        for name, serves in mine.items():
            if (n := serve_processes(node, name)) != serves:
                out.append(f"{node}: {n} serve processes in {name}, expected {serves}")
    return out


def invariant_violations(owned: dict[str, dict[str, str]] | None = None) -> list[str]:
    """What must never be true after a repair: foreign or duplicate containers, two serves or none.
    owned: node -> {container: deployment} (default: the testbed's one deployment; STACK_OWNED)."""
    owned = owned or {n: {c: "testbed"} for n, c in OWNED.items()}
    return container_violations({node: {c: RANKS[node] if dep == "testbed" else 1 for c, dep in mine.items()}
                                 for node, mine in owned.items()})


# The runbook's stack on three nodes (tests/integration/test_stack.py, `make chaos`): the LLM (the testbed's
# deployment) on spark-1 and spark-2, an embeddings model on spark-3 that starts once the LLM answers, and a
# reranker beside the LLM's worker on spark-2 that READY does not wait for.
STACK_MORE: list[tuple[Any, ...]] = [("embed", "spark-3", 8001, {"after": ["testbed"]}),
                                     ("rerank", "spark-2", 8002, {"required": False})]
STACK_OWNED = {"spark-1": {OWNED["spark-1"]: "testbed"},
               "spark-2": {OWNED["spark-2"]: "testbed", "rerank-vllm-spark-2": "rerank"},
               "spark-3": {"embed-vllm-spark-3": "embed"}}


def stack_config(tmp_path: Path, patch: dict[str, Any] | None = None, *, real_embed: bool = False,
                 base: dict[str, Any] | None = None) -> Path:
    """The stack's config (the testbed must be up on three nodes: testbed.up(3)). real_embed: the embeddings
    deployment is the real vLLM server (the CPU build, the tiny model as a pooling model), not the stand-in.
    base: as write_config's."""
    path = write_config(tmp_path, patch, deployment={"nodes": ["spark-1", "spark-2"]}, nodes=3, more=STACK_MORE,
                        base=base)
    if real_embed:
        from .realdeploy import real_deployment
        d = tomllib.loads(path.read_text())
        real = real_deployment("embed", ip=testbed.ALL_NODES["spark-3"], port=8001, pooling=True,
                               serve={"served_model_name": "embed"})
        d["deployments"][1] = {**real, "nodes": ["spark-3"], "after": ["testbed"]}
        path.write_text(tomli_w.dumps(d))
    return path


def owned_ids() -> dict[str, str]:
    """node -> the ID of our Ray container there."""
    return {n: containers(n)[c]["id"] for n, c in OWNED.items()}


def verify_serving(d: Supervisor) -> dict[str, Any]:
    """SERVING with exactly our containers, running, on each node, and exactly one serve process."""
    st = d.status()
    assert st is not None and st["phase"] == "SERVING", f"not SERVING: {json.dumps(st)[:800]}"
    for node, name in OWNED.items():
        now = containers(node)
        assert set(now) == {name}, f"{node}: containers {sorted(now)}, expected only {name}"
        assert now[name]["state"] == "running", f"{node}: {name} is {now[name]['state']}"
        n = serve_processes(node)
        assert n == RANKS[node], f"{node}: {n} serve processes, expected {RANKS[node]}"
    return st


class Streams:
    """``n`` long streamed completions held open against the serve (users), until closed: the load the heartbeat
    watches (tests/integration/test_serving_well.py, `make bench`). Closing ends them at once, even a stream
    the engine holds (its socket is shut under the reader). ``again``: each user sends a new request as soon as
    its last ended or a serve is back, as agent fleets do: an engine's slots kept busy (test_busy_engine.py)."""

    def __init__(self, d: Supervisor, n: int, max_tokens: int = 60000, *, again: bool = False) -> None:
        st = d.status()
        assert st is not None
        self.url, self.model = st["deployment"]["endpoint"], st["deployment"]["served_model_name"]
        self.stop, self.tokens, self.again = threading.Event(), [0] * n, again
        self.clients = [httpx.Client(timeout=httpx.Timeout(10, read=600)) for _ in range(n)]
        self.threads = [threading.Thread(target=self._user, args=(i, max_tokens), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _user(self, i: int, max_tokens: int) -> None:
        self._one(i, max_tokens)
        while self.again and not self.stop.wait(0.2):  # a pause between two requests, not a synchronisation
            self._one(i, max_tokens)

    def _one(self, i: int, max_tokens: int) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "Count to a million."}],
                "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        try:
            with self.clients[i].stream("POST", f"{self.url}/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if self.stop.is_set():
                        return
                    self.tokens[i] += line.startswith("data: {")
        except (httpx.HTTPError, OSError, RuntimeError):
            return  # the serve went (a repair), or the stream was closed: the user's request ends with it

    def close(self) -> None:
        self.stop.set()
        for c in self.clients:
            c.close()
        for t in self.threads:
            t.join(30)
