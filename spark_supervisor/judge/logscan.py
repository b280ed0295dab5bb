"""vLLM serve log -> how far the load got, and why it failed. Pure.

Works across vLLM versions: ANSI colour codes are stripped, lines are split on both ``\\r`` (tqdm
updates) and ``\\n``, and every pattern is an unanchored search (see docs on the serve log).

Users' words are never evidence: vLLM's request logging (the default before 0.11, or --enable-log-requests /
--enable-log-outputs) writes prompts, sampling parameters and the model's replies into the same log, and the
API server's access log writes each request's path. Those lines, known by the emitting logger's shape
(HEARSAY), are dropped before anything is read: a prompt saying "CUDA out of memory" is not the engine's.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..model.host import Transport
from ..model.reason import Kind

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SPLIT = re.compile(r"[\r\n]+")

# (milestone, regex) in load order; the furthest one seen is the load phase.
MILESTONES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(rx))
    for name, rx in (
        # 0.10-0.15 print "vLLM API server version X"; 0.32 an ASCII-art banner "... version X" first.
        ("api", r"vLLM (?:API )?server version ([^\s,]+)|\[api_utils\.py:\d+\].*\bversion (\d[^\s,]*)"),
        # A headless rank (mp across nodes) starts no engine of its own: its banner names the version.
        ("engine", r"Initializing a V1 LLM engine(?: \(v([^)\s]+)\))?|"
                   r"Launching vLLM \(v([^)\s]+)\) headless multiproc executor"),
        ("placement_group", r"Waiting for creating a placement group of specs for (\d+) seconds"),
        ("workers", r"vLLM is using nccl=="),
        ("load", r"Starting to load model (\S+?)\.\.\."),
        ("shards", r"(Loading (?:safetensors|pt|np_cache) checkpoint shards|Multi-thread loading shards|"
                   r"Loading safetensors using Runai Model Streamer)(?: \(eager\))?:\s*(\d+)% Completed \| "
                   r"(\d+)/(\d+)"),
        ("loaded", r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds"),
        ("kv_cache", r"KV cache size: ([\d,]+) tokens"),
        ("graphs", r"Capturing CUDA graphs \(([^,]+), (\w+)\):\s*(\d+)%"),
        ("graphs_done", r"Graph capturing finished in (\d+) secs"),
        ("engine_ready", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
        ("api_starting", r"Starting vLLM (?:API )?server(?: \d+)? on (\S+)"),
        ("ready", r"Application startup complete\."),
    )
)
_ORDER = {name: i for i, (name, _) in enumerate(MILESTONES)}


@dataclass(frozen=True)
class Failure:
    reason: Kind
    hint: str
    line: str = ""

    @property
    def deterministic(self) -> bool:
        return self.reason.deterministic

    def __str__(self) -> str:
        return f"{self.reason}: {self.line}" if self.line else self.reason


# Something else listens where a component must bind: Ray's GCS (its grpc server prints the port, and the
# words `Address already in use` even as advice, so its line is read first), uvicorn, torch, any bind().
PORT_PATTERNS = (r"Failed to start the grpc server\. The specified port is \d+", r"(?i)address already in use",
                 r"EADDRINUSE", r"(?i)\bport \d+ is (?:already )?in use", r"(?i)failed to bind",
                 r"\[Errno 98\]", r"(?i)could not bind")
PORT_HINT = ("another process holds the port on the node: stop it or give the deployment another port, "
             "then `spark-supervisor reset`")
_PORTS = tuple(re.compile(p) for p in PORT_PATTERNS)
_PORT_NUMBER = (re.compile(r"specified port is (\d+)"), re.compile(r"(?i)\bport[ =:]*(\d{1,5})\b"),
                re.compile(r"\(\s*'[^']*',\s*(\d{1,5})\)"), re.compile(r"[\w.\]*]:(\d{1,5})\b"))

# (reason, hint, patterns): first match wins, so the more specific come first. Whether a reason is
# deterministic its Kind says.
FAILURES: tuple[tuple[Kind, str, tuple[str, ...]], ...] = (
    (Kind.FREE_MEMORY_BELOW_UTILIZATION,
     "other processes or page cache hold memory: free it (drop caches) or lower --gpu-memory-utilization",
     (r"Free memory on device.*is less than desired GPU memory utilization",)),
    (Kind.NO_MEMORY_FOR_KV_CACHE, "lower --max-model-len or raise --gpu-memory-utilization",
     (r"No available memory for the cache blocks", r"KV cache is needed, which is larger than the available")),
    (Kind.OUT_OF_MEMORY, "the model does not fit: lower --gpu-memory-utilization or --max-model-len",
     (r"Failed to load model - not enough GPU memory", r"CUDA out of memory\. Tried to allocate",
      r"OutOfMemoryError", r"cudaErrorMemoryAllocation", r"NV_ERR_NO_MEMORY")),
    (Kind.BAD_ARGUMENTS, "fix deployments.serve (extra_args) in the config",
     (r"vllm serve: error: ", r"error: unrecognized arguments: ", r"error: argument --")),
    (Kind.MODEL_NOT_FOUND, "deployments.serve.model is neither a directory on the node (inside the container: "
     "mount it) nor a model id in the Hugging Face cache; download it first (`hf download <model>`)",
     (r"HFValidationError: Repo id must be", r"is not a local folder and is not a valid model identifier",
      r"RepositoryNotFoundError", r"does not appear to have a file named config\.json")),
    (Kind.HUB_UNREACHABLE, "the model is not on the node and the hub could not be reached (network not up "
     "yet?): download it first, or wait for the network",
     (r"LocalEntryNotFoundError", r"We couldn't connect to 'https://huggingface\.co'")),
    (Kind.UNSUPPORTED_CONFIGURATION, "this vLLM build cannot run this model's shape or dtype on this "
     "hardware: change the model, --dtype or the vLLM image",
     (r"Unsupported \w+ attention configuration",)),
    (Kind.CACHE_DIR_NOT_OURS, "deployments.serve.cache_dir/<deployment> holds files spark-supervisor did not "
     "create: point cache_dir at a directory of its own, or empty that one (nothing was deleted)",
     (r"^spark-serve: CacheDirNotOurs: ",)),
    (Kind.CACHE_DIR_GONE, "the compile cache directory was removed under the running container (its mount now "
     "names the deleted directory): the containers are made anew, which mounts it afresh",
     (r"^spark-serve: CacheDirGone: ",)),
    (Kind.COMMAND_NOT_FOUND, "the serve's command (or setsid, which runs it) is not in the image: fix "
     "deployments.serve.command or use an image that has it",
     (r"^(?:sh|setsid|spark-serve): (?:\d+: )?\S+: (?:not found|No such file or directory)",
      r"^setsid: failed to execute \S+: No such file or directory")),
    (Kind.MISSING_RAY_BACKEND, "pass --distributed-executor-backend ray for multi-node tensor parallelism",
     (r"World size \(\d+\) is larger than the number of available GPUs",)),
    (Kind.RAY_NOT_SUPPORTED, "this vLLM build cannot run its Ray executor on this platform: set "
     "deployments.serve.distributed_executor_backend = \"mp\", or use an image whose vLLM runs Ray on this GPU",
     (r"current platform \S+ does not support ray",)),
    (Kind.PLACEMENT_GROUP_TIMEOUT, "node IPs do not match VLLM_HOST_IP or GPUs are missing: check `ray status`",
     (r"Cannot provide a placement group .*within (\d+) seconds",)),
    (Kind.NO_NODE_CAN_FULFILL, "set VLLM_HOST_IP per node to its fabric IP; check GPUs per node",
     (r"No available node types can fulfill (?:resource requests?|placement group requests)",)),
    (Kind.GPU_ACCESS_LOST, "the container lost its GPU devices, as after a host `systemctl daemon-reload` without "
     "NVIDIA's CDI refresh (enable nvidia-cdi-refresh): a restart of the containers gives them back",
     (r"Failed to initialize NVML: Unknown Error", r"cudaGetDeviceCount\(\)\. .*Error 999: unknown error",
      r"CUDA driver initialization failed")),
    (Kind.NCCL_ERROR, "check NCCL_SOCKET_IFNAME / NCCL_IB_HCA on every node",
     (r"NCCL error: ", r"DistBackendError: NCCL error in:")),
    (Kind.ENGINE_READY_TIMEOUT, "raise VLLM_ENGINE_READY_TIMEOUT_S above the load time (e.g. 1800)",
     (r"Timed out waiting for engine core processes to start",)),
    (Kind.RAY_OOM_KILL, "set RAY_memory_monitor_refresh_ms=0 on every node",
     (r"killed due to memory pressure \(OOM\)", r"Task was killed due to the node running low on memory")),
    # vLLM's mp mode across nodes (torch's rendezvous at the head's master_addr:master_port).
    (Kind.MASTER_PORT_IN_USE, "something on the head already listens on deployments.serve.master_port: stop it "
     "or choose another port",
     (r"failed to listen on any local network address.*EADDRINUSE",)),
    (Kind.PORT_IN_USE, PORT_HINT, PORT_PATTERNS),
    (Kind.RANKS_NEVER_JOINED, "a headless rank did not reach rank 0: read that rank's serve log on its node, "
     "and check that the head's fabric IP answers on master_port",
     # (not "The client socket has failed to connect": torch prints that warning on every retry)
     (r"Timed out after \d+ seconds waiting for clients", r"client socket has timed out after")),
    (Kind.ENGINE_DIED, "a worker or node died; the whole stack is restarted",
     (r"RayWorkerProc rank=\S+ died unexpectedly", r"Engine core proc \S+ died unexpectedly",
      r"EngineCore encountered a fatal error", r"EngineCore encountered an issue")),
    (Kind.ENGINE_START_FAILED, "see the lines above it in the serve log",
     (r"Engine core initialization failed", r"EngineCore failed to start")),
)
_FAILURES = tuple((r, h, tuple(re.compile(p) for p in ps)) for r, h, ps in FAILURES)


# A tail of a serve that has run a while is mostly access lines: each pattern is first searched for once in the
# whole tail (its lines joined by newlines; ^ at each line's start), and only one found there is tried line by
# line. A match in a line is a match in the joined text, so a pattern not found there is in no line; one found
# across two lines is only tried line by line for nothing.
def _whole(pattern: re.Pattern[str]) -> re.Pattern[str]:
    return re.compile(pattern.pattern, pattern.flags | re.MULTILINE)


_ANY_FAILURE = tuple(_whole(p) for _, _, ps in _FAILURES for p in ps)
_MILESTONES_WHOLE = tuple((name, rx, _whole(rx)) for name, rx in MILESTONES)


def _present(joined: str) -> tuple[tuple[str, re.Pattern[str]], ...]:
    """The milestones found anywhere in the joined lines, in load order."""
    return tuple((name, rx) for name, rx, whole in _MILESTONES_WHOLE if whole.search(joined))


_TQDM_RATE = re.compile(r"\d+/\d+ \[[^<\]]*<[^,\]]*,\s*([\d.]+)(s/it|it/s)\]")
_STAMP = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)")

# What is left once the shards are in: KV-cache profiling, CUDA graph capture, warm-up. On a Spark with
# a 122B MoE about two minutes; an estimate, shown as part of the ETA, never used as a deadline.
AFTER_SHARDS_S = 120.0


@dataclass(frozen=True)
class LoadProgress:
    milestone: str = ""  # furthest milestone reached
    shards_done: int = 0
    shards_total: int = 0
    graphs_percent: int = 0
    version: str = ""
    ready: bool = False
    pg_wait_s: int = 0
    failure: Failure | None = None
    seconds_per_shard: float = 0.0  # tqdm's own rate
    kv_cache_tokens: int = 0  # "GPU KV cache size: N tokens" (CPU build: "CPU KV cache size")

    @property
    def eta_s(self) -> float | None:
        """Seconds to "ready", from tqdm's observed shard rate plus the after-shards estimate."""
        if self.ready:
            return 0.0
        if self.milestone == "shards" and self.seconds_per_shard and self.shards_total:
            return (self.shards_total - self.shards_done) * self.seconds_per_shard + AFTER_SHARDS_S
        if _ORDER.get(self.milestone, 0) > _ORDER["shards"]:
            return AFTER_SHARDS_S * (1 - (self.fraction - 0.9) / 0.1)
        return None

    @property
    def fraction(self) -> float:
        """Rough overall fraction: shards dominate a load, graph capture is the tail."""
        if self.ready:
            return 1.0
        if self.shards_total and _ORDER.get(self.milestone, 0) <= _ORDER["shards"]:
            return 0.9 * self.shards_done / self.shards_total
        if _ORDER.get(self.milestone, 0) > _ORDER["shards"]:
            return 0.9 + 0.1 * (_ORDER[self.milestone] - _ORDER["shards"]) / (len(MILESTONES) - _ORDER["shards"])
        return 0.0

    def summary(self) -> str:
        if self.ready:
            return "startup complete"
        eta = self.eta_s
        if self.milestone == "shards":
            return f"{self.shards_done}/{self.shards_total} shards" + (f", ETA {duration(eta)}" if eta else "")
        if self.milestone == "graphs":
            return f"capturing CUDA graphs {self.graphs_percent}%"
        if self.milestone == "placement_group":
            return f"waiting {self.pg_wait_s}s for a Ray placement group"
        return self.milestone.replace("_", " ") if self.milestone else "starting"


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m" if s >= 60 else f"{s}s"


# A line of vLLM's logger: "[(<process> pid=N[, ip=A]) ]LEVEL MM-DD HH:MM:SS[.fff] [file.py:N] message".
_LOGGER = r"^(?:\([^()]*\) )?(?:DEBUG|INFO|WARNING|ERROR) \d\d-\d\d [\d:.]+ \[[\w.]+:\d+\] "
# Lines that carry what users sent or were sent: the request logger's (request_logger.py, logger.py before 0.11:
# its prompt, parameters and body; the model's output) and uvicorn's access log (each request's path).
HEARSAY = re.compile(
    _LOGGER + r"(?:Received request |Generated response |Request \S+ (?:details|JSON body)|Added request )"
    r"|^(?:\([^()]*\) )?INFO:\s+\S+ - \"")


def lines(text: str) -> list[str]:
    """The log's lines, colour codes stripped, users' words (HEARSAY) left out."""
    return [ln for ln in _SPLIT.split(_ANSI.sub("", text)) if ln.strip() and not HEARSAY.search(ln)]


_ROOT_CAUSE = re.compile(r"\b(?:\w+\.)*(\w*(?:Error|Exception)): (.+)")
_CHATTER = re.compile(r"\b(?:INFO|WARNING|DEBUG)\b")  # a warning that mentions an error is not one
_GENERIC = re.compile(r"EngineDeadError|EngineCore encountered|Engine core initialization failed|"
                      r"EngineCore failed to start|Worker failed with error")


CAUSE_LINES = 400  # how far above a generic engine death its cause may be (a Ray worker's traceback: ~100 lines)


def classify(text: str) -> Failure | None:
    """The failure the engine logged last before it ended, if any: the last line with a known signature that
    is not a generic engine death, else the last generic one (it follows its cause: vLLM prints the cause in the
    worker's traceback, several lines above "EngineCore encountered ..."). For a generic one the line shown is
    the root cause: the last ``SomethingError: ...`` line above it that is not itself generic."""
    all_lines = lines(text)
    return _classify(all_lines, "\n".join(all_lines))


def _classify(all_lines: list[str], joined: str) -> Failure | None:
    if not any(p.search(joined) for p in _ANY_FAILURE):
        return None
    generic: tuple[int, Kind, str] | None = None
    for i in range(len(all_lines) - 1, -1, -1):
        line = all_lines[i]
        hit = next(((reason, hint) for reason, hint, pats in _FAILURES if any(p.search(line) for p in pats)), None)
        if hit is None:
            continue
        if hit[0] not in (Kind.ENGINE_DIED, Kind.ENGINE_START_FAILED):
            if generic is None or generic[0] - i <= CAUSE_LINES:  # the death's own cause, in its traceback
                return Failure(hit[0], hit[1], line.strip()[-300:])
            break
        if generic is None:
            generic = (i, *hit)
    if generic is None:
        return None
    at, reason, hint = generic
    shown = next((ln for ln in reversed(all_lines[:at]) if _ROOT_CAUSE.search(ln) and not _GENERIC.search(ln)
                  and not _CHATTER.search(ln)), all_lines[at])
    return Failure(reason, hint, shown.strip()[-300:])


@dataclass(frozen=True)
class PortInUse:
    port: int | None  # None: the line does not say
    line: str


def port_in_use(text: str) -> PortInUse | None:
    """A bind that failed because the port was taken, in a container's or a serve's log: the port and the
    line that says so (the first such line: later ones are the consequences)."""
    for line in lines(text):
        hit = next((m for p in _PORTS if (m := p.search(line))), None)
        if hit is not None:  # Ray's line is long: the part that says it, not its tail
            port = next((int(m.group(1)) for rx in _PORT_NUMBER if (m := rx.search(line))), None)
            shown = line[max(0, hit.start() - 100):hit.start() + 200].strip()
            return PortInUse(port if port is not None and 0 < port < 65536 else None, shown)
    return None


@functools.lru_cache(maxsize=16)  # the planner and the daemon read the same tail (per deployment), often unchanged
def scan(text: str) -> LoadProgress:
    milestone, done, total, graphs, version, pg, rate, kv = "", 0, 0, 0, "", 0, 0.0, 0
    all_lines = lines(text)
    joined = "\n".join(all_lines)
    present = _present(joined)
    for line in all_lines if present else ():
        for name, rx in present:
            m = rx.search(line)
            if not m:
                continue
            if _ORDER[name] >= _ORDER.get(milestone, -1):
                milestone = name
            if name in ("api", "engine") and not version:
                version = next((g for g in m.groups() if g), "")
            elif name == "shards":
                done, total = int(m.group(3)), int(m.group(4))
                r = _TQDM_RATE.search(line)
                if r and float(r.group(1)) > 0:
                    rate = float(r.group(1)) if r.group(2) == "s/it" else 1 / float(r.group(1))
            elif name == "graphs":
                graphs = int(m.group(3))
            elif name == "kv_cache":
                kv = int(m.group(1).replace(",", ""))
            elif name == "placement_group":
                pg = int(m.group(1))
    return LoadProgress(milestone, done, total, graphs, version, milestone == "ready", pg, _classify(all_lines, joined),
                        rate, kv)


@dataclass(frozen=True)
class Step:
    milestone: str
    at: str  # the log's own "MM-DD HH:MM:SS" of the line (or the last stamped line before a tqdm bar)
    seconds: float | None  # until the next milestone


@functools.lru_cache(maxsize=16)  # the status document reads the same tail (per deployment) every tick
def timeline(text: str) -> list[Step]:
    """When each milestone was first reached, from the log's timestamps (no year in vLLM's format)."""
    from datetime import datetime
    first: dict[str, str] = {}
    stamp = ""
    all_lines = lines(text)
    present = _present("\n".join(all_lines))
    for line in all_lines if present else ():
        m = _STAMP.search(line)
        if m:
            stamp = m.group(1)
        for name, rx in present:
            if name not in first and rx.search(line):
                first[name] = stamp
    ordered = sorted(first.items(), key=lambda kv: _ORDER[kv[0]])
    out = []
    for i, (name, at) in enumerate(ordered):
        secs = None
        if i + 1 < len(ordered) and at and ordered[i + 1][1]:
            t0 = datetime.strptime(f"2000-{at}", "%Y-%m-%d %H:%M:%S")
            t1 = datetime.strptime(f"2000-{ordered[i + 1][1]}", "%Y-%m-%d %H:%M:%S")
            secs = (t1 - t0).total_seconds()
        out.append(Step(name, at, secs))
    return out


# NCCL's INFO lines (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET; docs/wire-formats.md §8.1): "<host>:<pid>:<tid>
# [<dev>] NCCL INFO <text>", a Ray worker's with vLLM's "(RayWorkerWrapper pid=N, ip=A) " before it.
_NCCL = re.compile(r"^\s*(?:\((?:\w+) pid=\d+(?:, ip=([\d.]+))?\)\s*)?([\w.-]+):(\d+):\d+ \[\d+\] NCCL INFO (.*)")
_NCCL_IP = re.compile(r"(?:Bootstrap : Using|OOB) [\w.-]+:([\d.]+)<")
_NCCL_NET = re.compile(r"^(NET/(IB|Socket) : Using .*)")
_NCCL_USING = re.compile(r"^Using network (IB|Socket)\b")
# "comm 0x… rank 0 nranks 2 … Init COMPLETE" (2.1x), "ncclCommInitRank comm 0x… rank 0 nranks 2 …" (2.18+)
_NCCL_RANK = re.compile(r"^(?:\w+ )?comm \S+ rank (\d{1,6}) n[Rr]anks (\d{1,6})")
_NCCL_LINE_MAX = 2048  # NCCL's lines are short; a long line (a logged prompt) is not searched whole
_NCCL_CHANNEL = re.compile(r"^Channel \S+ : .* via NET/(IB|Socket)/")


@functools.lru_cache(maxsize=16)
def transports(text: str) -> tuple[Transport, ...]:
    """Which network each NCCL process in the log uses between nodes (its "Using network" line, else its
    channels' "via NET/..."), with its rank (the first communicator of more than one rank) and address."""
    procs: dict[tuple[str, str], dict[str, str]] = {}
    for line in lines(text):
        m = _NCCL.search(line[:_NCCL_LINE_MAX]) if "NCCL INFO" in line else None
        if not m:
            continue
        p = procs.setdefault((m.group(2), m.group(3)), {"host": m.group(2)})
        said = m.group(4).strip()
        if m.group(1):  # vLLM's own word for the worker's node: the fabric IP Ray knows it by
            p["prefix_ip"] = m.group(1)
        if (ip := _NCCL_IP.search(said)) is not None:
            p["ip"] = ip.group(1)
        if (net := _NCCL_NET.search(said)) is not None:
            p.setdefault("detail", net.group(1).strip()[:200])
        if (using := _NCCL_USING.search(said)) is not None:
            p["net"], p["line"] = using.group(1), line.strip()[-300:]
        elif (ch := _NCCL_CHANNEL.search(said)) is not None and "net" not in p:
            p.setdefault("channel", ch.group(1))
            p.setdefault("channel_line", line.strip()[-300:])
        if (rank := _NCCL_RANK.search(said)) is not None and "rank" not in p and int(rank.group(2)) > 1:
            p["rank"] = rank.group(1)
    out = []
    for p in procs.values():
        chosen = p.get("net") or p.get("channel")
        if chosen:
            out.append(Transport(int(p["rank"]) if "rank" in p else None, p.get("prefix_ip") or p.get("ip", ""), chosen,
                                 p.get("detail", ""), p.get("line") or p.get("channel_line", ""), p["host"]))
    return tuple(out)
