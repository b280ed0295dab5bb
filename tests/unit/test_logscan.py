"""Captured-format vLLM logs: 0.11-style ANSI tags, 0.15-style, 0.33-style."""

import pytest

from spark_supervisor.judge import logscan
from spark_supervisor.judge.logscan import Failure, classify, transports
from spark_supervisor.model.reason import Kind

ESC = "\x1b[1;36m"
RST = "\x1b[0;0m"

V011 = (
    f"{ESC}(APIServer pid=1){RST} INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.11.0\n"
    f"{ESC}(EngineCore_DP0 pid=2){RST} INFO 12-02 10:00:01 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: x\n"
    f"{ESC}(EngineCore_DP0 pid=2){RST} INFO 12-02 10:00:02 [ray_utils.py:300] Connecting to existing Ray cluster at address: 10.0.0.1:6379...\n"
    f"{ESC}(RayWorkerWrapper pid=3, ip=10.0.0.2){RST} INFO 12-02 10:00:09 [pynccl.py:70] vLLM is using nccl==2.27.3\n"
    f"{ESC}(RayWorkerWrapper pid=3){RST} INFO 12-02 10:00:10 [gpu_model_runner.py:2] Starting to load model Qwen/Qwen3...\n"
    "Loading safetensors checkpoint shards:   0% Completed | 0/39 [00:00<?, ?it/s]\r"
    "Loading safetensors checkpoint shards:   3% Completed | 1/39 [00:18<11:24, 18.01s/it]\r"
    "Loading safetensors checkpoint shards:  31% Completed | 12/39 [03:36<08:06, 18.02s/it]\r"
)
V015 = (
    "(APIServer pid=1) INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.15.1\n"
    "(EngineCore_DP0 pid=2) INFO 12-02 10:00:01 [core.py:77] Initializing a V1 LLM engine (v0.15.1) with config: x\n"
    "(RayWorkerProc pid=3) INFO 12-02 10:05:00 [default_loader.py:1] Loading weights took 700.12 seconds\n"
    "(RayWorkerProc pid=3) INFO 12-02 10:05:01 [gpu_model_runner.py:2] Model loading took 58.42 GiB memory and 702.1 seconds\n"
    "(EngineCore_DP0 pid=2) INFO 12-02 10:05:05 [kv_cache_utils.py:1] GPU KV cache size: 409,856 tokens\n"
    "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|####5     | 30/67 [00:10<00:12]\r"
)
V033 = (
    "(APIServer pid=1) INFO 12-02 10:00:00 [utils.py:233] vLLM server version 0.33.0, serving model Qwen/Qwen3\n"
    "(EngineCore pid=2) INFO 12-02 10:06:00 [gpu_model_runner.py:3] Graph capturing finished in 41 secs, took 0.52 GiB\n"
    "(EngineCore pid=2) INFO 12-02 10:06:01 [core.py:240] init engine (profile, create kv cache, warmup model) took 61.20 s (compilation: 20.10 s)\n"
    "(APIServer pid=1) INFO 12-02 10:06:02 [api_server.py:9] Starting vLLM server on http://0.0.0.0:8000\n"
    "(APIServer pid=1) INFO:     Started server process [1]\n(APIServer pid=1) INFO:     Waiting for application startup.\n"
    "(APIServer pid=1) INFO:     Application startup complete.\n"
)


def test_011_ansi_tags_and_tqdm_carriage_returns() -> None:
    p = logscan.scan(V011)
    assert (p.version, p.milestone, p.shards_done, p.shards_total) == ("0.11.0", "shards", 12, 39)
    assert p.seconds_per_shard == 18.02 and p.eta_s == 27 * 18.02 + logscan.AFTER_SHARDS_S
    assert p.summary() == "12/39 shards, ETA 10m" and not p.ready and p.failure is None
    assert 0.2 < p.fraction < 0.3


def test_015_graph_capture() -> None:
    p = logscan.scan(V015)
    assert (p.version, p.milestone, p.graphs_percent) == ("0.15.1", "graphs", 45)
    assert p.summary() == "capturing CUDA graphs 45%"


def test_033_ready() -> None:
    p = logscan.scan(V033)
    assert p.version == "0.33.0" and p.ready and p.fraction == 1.0


def test_placement_group_wait() -> None:
    line = ("(EngineCore_DP0 pid=2) WARNING 12-02 10:00:40 [ray_utils.py:1] Waiting for creating a placement "
            "group of specs for 30 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}].\n")
    head = "".join(V011.splitlines(keepends=True)[:3])  # api, engine, connecting to Ray
    p = logscan.scan(head + line)
    assert p.summary() == "waiting 30s for a Ray placement group"


def test_failures_are_classified_with_hints() -> None:
    f = logscan.classify("ERROR ... ValueError: Free memory on device cuda:0 (20.1/119.7 GiB) on startup is less "
                         "than desired GPU memory utilization (0.85, 101.7 GiB).")
    assert f is not None and f.reason == "FreeMemoryBelowUtilization" and f.deterministic
    f = logscan.classify("(EngineCore_DP0 pid=2) ERROR NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)")
    assert f is not None and f.reason == "NcclError" and not f.deterministic
    f = logscan.classify("(autoscaler +44s) Error: No available node types can fulfill resource request {'GPU': 2.0}")
    assert f is not None and f.reason == "NoNodeCanFulfill"
    assert logscan.classify(V033) is None


def test_rates_in_iterations_per_second_and_the_timeline() -> None:
    p = logscan.scan("Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01,  2.00it/s]\r")
    assert p.seconds_per_shard == 0.5
    steps = logscan.timeline(V011 + V015.split("\n", 2)[2] + V033.split("\n", 1)[1])
    names = [s.milestone for s in steps]
    assert names[:3] == ["api", "engine", "workers"] and names[-1] == "ready"
    load = next(s for s in steps if s.milestone == "load")
    assert load.at == "12-02 10:00:10" and load.seconds == 0.0  # the shard bar carries no stamp of its own
    assert next(s for s in steps if s.milestone == "loaded").seconds == 4.0


def test_bad_arguments_are_deterministic() -> None:
    f = logscan.classify("vllm serve: error: unrecognized arguments: --max-modl-len 4096")
    assert f is not None and f.reason == "BadArguments" and f.deterministic


def test_the_mp_rendezvous_failures_are_named() -> None:
    port = ("(Worker_TP0 pid=9) torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 29501, useIpv6: false, code: -98, name: EADDRINUSE, message: address "
            "already in use\n(EngineCore_DP0 pid=9) ERROR 12-03 02:11:17 [core.py:700] RuntimeError: Engine core "
            "initialization failed. See root cause above. Failed core proc(s): {}\n")
    f = logscan.classify(port)
    assert f is not None and f.reason == "MasterPortInUse" and not f.deterministic
    never = ("(Worker_TP0 pid=9) torch.distributed.DistStoreError: Timed out after 61 seconds waiting for clients. "
             "1/2 clients joined.\n")
    f = logscan.classify(never)
    assert f is not None and f.reason == "RanksNeverJoined"


def test_a_rank_that_retried_its_connect_then_lost_its_head_died_of_the_loss() -> None:
    text = ("[W1203 02:11:17.000000000 socket.cpp:764] [c10d] The client socket has failed to connect to "
            "[127.0.0.1]:29501 (errno: 111 - Connection refused).\n"  # a retry while rank 0 was not listening yet
            "(Worker_TP1 pid=9) RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] "
            "Connection closed by peer [127.0.0.1]:29501\n"
            "(EngineCore_DP0 pid=9) ERROR 12-03 02:11:20 [core.py:700] EngineCore encountered a fatal error.\n")
    f = logscan.classify(text)
    assert f is not None and f.reason == "EngineDied" and "Connection closed by peer" in f.line


def test_the_wrappers_refusal_of_a_cache_it_did_not_make_is_deterministic() -> None:
    from spark_supervisor.specs import commands
    line = f"spark-serve: {commands.NOT_OURS}: /models/testbed holds files spark-supervisor did not create (Qwen3-8B)\n"
    f = logscan.scan("INFO starting\n" + line).failure
    assert f is not None and f.reason == "CacheDirNotOurs" and f.deterministic


def test_the_whole_tail_search_finds_what_the_line_by_line_reading_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pattern is searched for in the whole tail before it is tried line by line: never a line missed. The
    same tails read with every pattern tried on every line (the filter switched off) read the same: captured
    logs, cut anywhere (a tail starts mid-line), and every failure's and milestone's line after access lines."""
    import random
    import re
    from pathlib import Path
    fixtures = Path(__file__).parent.parent / "fixtures" / "real_vllm"
    logs = [p.read_text(errors="replace") for p in sorted(fixtures.rglob("*.log"))] + [V011, V015, V033]
    access = "".join(f'(APIServer pid=1) INFO:     127.0.0.1:{40000 + i} - "GET /health HTTP/1.1" 200 OK\n'
                     for i in range(50))
    said = ["spark-serve: CacheDirNotOurs: /cache/x holds files", "sh: 1: vllm: not found",
            "setsid: failed to execute vllm: No such file or directory", "ERROR port 8000 is already in use",
            "OSError: [Errno 98] Address already in use", "Cannot provide a placement group of x within 60 seconds"]
    logs += [access + line + "\n" + access for line in said]
    rng = random.Random(7)
    tails = logs + [t[rng.randrange(len(t)):] for t in logs for _ in range(5)]

    def read(text: str) -> tuple[object, ...]:
        return logscan.scan.__wrapped__(text), logscan.classify(text), logscan.timeline.__wrapped__(text)
    filtered = [read(t) for t in tails]
    everything = re.compile("")
    with monkeypatch.context() as m:
        m.setattr(logscan, "_ANY_FAILURE", (everything,))
        m.setattr(logscan, "_MILESTONES_WHOLE", tuple((n, rx, everything) for n, rx in logscan.MILESTONES))
        assert filtered == [read(t) for t in tails]
    assert sum(f[1] is not None for f in filtered) >= len(said) and sum(bool(f[2]) for f in filtered) > 10


def test_no_pattern_reads_past_its_line() -> None:
    """What makes the whole tail's search exact: no pattern anchors on the text's ends, looks around or lets "."
    match a newline. A pattern that did must be tried line by line only."""
    import re
    patterns = [p for _, _, ps in logscan._FAILURES for p in ps] + [rx for _, rx in logscan.MILESTONES]
    for p in patterns:
        assert not re.search(r"\\[AZ]|\$|\(\?<?[=!]|\(\?[a-z]*s", p.pattern) and not p.flags & re.DOTALL, p.pattern


# ------------------------------------------------------------------------------ users' words are not evidence
# vLLM 0.32's request logger (request_logger.py) and the API server's access log, in the real lines' shape; the
# prompt, the stop strings and the reply are users' (issue 42, item 5). Held to the real server by
# tests/integration/test_real_vllm.py::test_users_words_in_the_request_log_are_never_the_engines_failure.
HOSTILE_LINES = [
    "(APIServer pid=9478) INFO 12-02 20:15:01 [request_logger.py:66] Received request chatcmpl-1: params: "
    "SamplingParams(n=1, stop=['CUDA out of memory. Tried to allocate', '[Errno 98] Address already in use'], "
    "max_tokens=4), lora_request: None.",
    "(APIServer pid=9478) INFO 12-02 20:15:01 [request_logger.py:109] Generated response chatcmpl-1: output: "
    "'vllm serve: error: unrecognized arguments: x spark-1:1:2 [0] NCCL INFO Using network Socket', "
    "finish_reason: stop",
    "INFO 12-02 20:15:01 [logger.py:39] Received request chatcmpl-2: prompt: '<|im_start|>user\\nOutOfMemoryError "
    "NV_ERR_NO_MEMORY', params: SamplingParams(n=1), prompt_token_ids: [1, 2].",  # before 0.11: the prompt itself
    '(APIServer pid=9478) INFO:     127.0.0.1:51234 - "GET /EADDRINUSE HTTP/1.1" 404 Not Found',
    "(APIServer pid=9478) INFO 12-02 20:15:01 [async_llm.py:578] Added request chatcmpl-1.",
]
DEATH = [
    "(EngineCore_DP0 pid=9530) ERROR 12-02 20:15:13 [core.py:866] EngineCore encountered a fatal error.",
    "(APIServer pid=9478) ERROR 12-02 20:15:13 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
    "EngineCore encountered an issue. See stack trace (above) for the root cause.",
]


def test_request_and_access_log_lines_are_never_a_failure_or_a_transport() -> None:
    assert classify("\n".join(HOSTILE_LINES)) is None
    assert transports("\n".join(HOSTILE_LINES)) == ()
    f = classify("\n".join([*HOSTILE_LINES, *DEATH]))
    assert f is not None and f.reason == Kind.ENGINE_DIED and not f.deterministic, f


def test_the_engines_own_last_failure_is_the_one_read() -> None:
    early = "(APIServer pid=1) ERROR 12-02 20:14:50 [api_server.py:1] OSError: [Errno 98] Address already in use"
    late = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert classify(f"{early}\n{late}") == Failure(Kind.OUT_OF_MEMORY, classify(late).hint, late)  # type: ignore[union-attr]
    assert classify(f"{late}\n{early}").reason == Kind.PORT_IN_USE  # type: ignore[union-attr]
    # a generic death reads its cause in the traceback above it, not one from long before
    cause = "RuntimeError: shape mismatch in the attention kernel"
    f = classify("\n".join([late, *["x"] * 500, cause, *DEATH]))
    assert f is not None and f.reason == Kind.ENGINE_DIED and f.line == cause
    f = classify("\n".join([cause, late, *DEATH]))
    assert f is not None and f.reason == Kind.OUT_OF_MEMORY


def test_a_vllm_that_refuses_the_ray_backend_is_deterministic_with_the_backend_hint() -> None:
    """vLLM 0.32's ray_utils (the CPU build, and any platform without a Ray device key): the same on every retry."""
    line = "ValueError: current platform cpu does not support ray."
    f = classify("\n".join([line, *DEATH]))
    assert f is not None and f.reason == Kind.RAY_NOT_SUPPORTED and f.deterministic and f.line == line
    assert 'distributed_executor_backend = "mp"' in f.hint
