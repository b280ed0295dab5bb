"""Bad configs, one mistake each: every one is a ConfigError line `<file>: <key>: <problem>`, never a traceback."""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from spark_supervisor import config
from spark_supervisor.cli import main
from tests.helpers import CONFIG_SRC as SRC
from tests.helpers import cfg, data
from tests.helpers import config_problems as problems

ROOT = Path(__file__).resolve().parents[2]
KEY = "s3cr3t-Key.value_42"


def node(i: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda d: d["nodes"][i]


def sup(d: dict[str, Any]) -> dict[str, Any]:
    return d["supervisor"]  # type: ignore[no-any-return]


def healing(d: dict[str, Any]) -> dict[str, Any]:
    return d.setdefault("healing", {})  # type: ignore[no-any-return]


def stale(d: dict[str, Any]) -> dict[str, Any]:
    return d["stale"]  # type: ignore[no-any-return]


def ray(d: dict[str, Any]) -> dict[str, Any]:
    return d["deployments"][0].setdefault("ray", {})  # type: ignore[no-any-return]


def serve(d: dict[str, Any]) -> dict[str, Any]:
    return d["deployments"][0]["serve"]  # type: ignore[no-any-return]


def ready(d: dict[str, Any]) -> dict[str, Any]:
    return d["deployments"][0].setdefault("readiness", {})  # type: ignore[no-any-return]


def top(d: dict[str, Any]) -> dict[str, Any]:
    return d


R = "deployments[0].ray"
S = "deployments[0].serve"
Q = "deployments[0].readiness"

# (id, table getter, patch, key in the message, distinctive part of the message[, env])
CASES: list[tuple[Any, ...]] = [
    # 2. non-finite numbers
    ("nan", sup, {"interval": math.nan}, "supervisor.interval", "nan and inf are not allowed"),
    ("inf", healing, {"deep_probe_interval": math.inf}, "healing.deep_probe_interval", "nan and inf are not allowed"),
    ("neg-inf-utilization", serve, {"gpu_memory_utilization": -math.inf}, f"{S}.gpu_memory_utilization",
     "nan and inf are not allowed"),
    # 3. ports
    ("ray-port-0", ray, {"port": 0}, f"{R}.port", "port 0 is out of range 1..65535"),
    ("serve-port-70000", serve, {"port": 70000}, f"{S}.port", "out of range 1..65535"),
    ("metrics-port-99999", top, {"metrics": {"listen": "127.0.0.1:99999"}}, "metrics.listen", "out of range"),
    ("dashboard-clashes-ray", ray, {"dashboard_port": 6379}, f"{R}.dashboard_port",
     f"port 6379 is also {R}.port"),
    ("metrics-clashes-serve", top, {"metrics": {"listen": "127.0.0.1:8000"}}, "metrics.listen",
     f"port 8000 is also {S}.port"),
    # 4. addresses
    ("ipv6-fabric", node(1), {"fabric_ip": "fd00::13"}, "nodes[1].fabric_ip",
     "IPv6 is not supported: use this node's own IPv4 address on the fabric"),
    ("unspecified-fabric", node(1), {"fabric_ip": "0.0.0.0"}, "nodes[1].fabric_ip", "is not a node's address"),
    ("multicast-fabric", node(1), {"fabric_ip": "224.0.0.1"}, "nodes[1].fabric_ip", "multicast, broadcast or reserved"),
    ("broadcast-fabric", node(1), {"fabric_ip": "255.255.255.255"}, "nodes[1].fabric_ip", "broadcast"),
    ("serve-host-name", serve, {"host": "localhost"}, f"{S}.host", "not an IP address"),
    ("serve-host-ipv6", serve, {"host": "::"}, f"{S}.host", "IPv6 is not supported"),
    # 5. model names
    ("blank-model", serve, {"model": "   "}, f"{S}.model", "empty: give the model to serve"),
    ("served-name-space", serve, {"served_model_name": "Qwen 3.5"}, f"{S}.served_model_name",
     "contains whitespace or control characters"),
    # 6. TP x PP must use exactly the GPUs
    ("tp-smaller", serve, {"tensor_parallel_size": 1}, f"{S}.tensor_parallel_size",
     "TP x PP = 1 is smaller than the 2 GPUs configured on its nodes"),
    ("tp-pp-larger", serve, {"pipeline_parallel_size": 2}, f"{S}.tensor_parallel_size",
     "TP x PP = 4 is larger than the 2 GPUs configured on its nodes"),
    # 7. units
    ("unit-self", stale, {"units": ["spark-supervisor"]}, "stale.units[0]",
     "would stop a unit the host or the supervisor needs"),
    ("unit-docker-socket", stale, {"units": ["vllm-proxy", "docker.socket"]}, "stale.units[1]",
     "would stop a unit the host or the supervisor needs"),
    ("unit-systemd", stale, {"units": ["systemd-networkd"]}, "stale.units[0]", "the host or the supervisor needs"),
    ("unit-sshd", stale, {"units": ["sshd.service"]}, "stale.units[0]", "the host or the supervisor needs"),
    ("unit-networkmanager", stale, {"units": ["NetworkManager"]}, "stale.units[0]", "the host or the supervisor"),
    ("unit-dash", stale, {"units": ["-oops"]}, "stale.units[0]", "is not a systemd unit name"),
    ("unit-glob", stale, {"units": ["vllm-*"]}, "stale.units[0]", "is not a systemd unit name"),
    ("unit-target", stale, {"units": ["multi-user.target"]}, "stale.units[0]",
     "only .service, .socket, .timer and .path units"),
    # 8. image patterns
    ("pattern-star", stale, {"image_patterns": ["*"]}, "stale.image_patterns[0]", "is too broad"),
    ("pattern-star-colon-star", stale, {"image_patterns": ["vllm/*", "*:*"]}, "stale.image_patterns[1]",
     "is too broad"),
    ("pattern-star-slash-star", stale, {"image_patterns": ["*/*"]}, "stale.image_patterns[0]", "is too broad"),
    ("pattern-question-star", stale, {"image_patterns": ["?*"]}, "stale.image_patterns[0]", "is too broad"),
    ("pattern-empty", stale, {"image_patterns": [""]}, "stale.image_patterns[0]", "an empty pattern"),
    # 9. labels
    ("label-own", stale, {"container_labels": ["spark-supervisor.owner=qwen"]}, "stale.container_labels[0]",
     "the supervisor's own label namespace"),
    ("label-own-hash", stale, {"container_labels": ["spark-supervisor.spec-hash"]}, "stale.container_labels[0]",
     "own label namespace"),
    ("label-empty", stale, {"container_labels": ["=old"]}, "stale.container_labels[0]", "empty label key"),
    # 10. container names
    ("container-own", stale, {"containers": ["vllm_node", "qwen-ray-spark-2"]}, "stale.containers[1]",
     "is the supervisor's own Ray container on spark-2"),
    ("container-invalid", stale, {"containers": ["old node!"]}, "stale.containers[0]",
     "is not a Docker container name"),
    ("container-slash", stale, {"containers": ["/vllm_node"]}, "stale.containers[0]", "without the leading '/'"),
    # 11. ssh and docker
    ("ssh-option", node(1), {"ssh": "-oProxyCommand=touch /tmp/pwned"}, "nodes[1].ssh",
     "begins with '-': ssh would read it as an option"),
    ("ssh-space", node(1), {"ssh": "root@spark 2"}, "nodes[1].ssh", "contains whitespace"),
    ("docker-ssh-option", node(1), {"docker": "ssh://-oProxyCommand=x"}, "nodes[1].docker",
     "begins with '-': ssh would read it as an option"),
    ("docker-ssh-user-option", node(1), {"docker": "ssh://-l@spark-2"}, "nodes[1].docker", "begins with '-'"),
    ("docker-tcp", node(1), {"docker": "tcp://192.168.200.13:2375"}, "nodes[1].docker",
     "unauthenticated root access to that host: use ssh://"),
    ("docker-unix-relative", node(0), {"docker": "unix://docker.sock"}, "nodes[0].docker",
     "needs an absolute socket path"),
    # 12. environment
    ("env-name-digit", node(0), {"env": {"1BAD": "x"}}, "nodes[0].env.1BAD",
     "is not a valid environment variable name"),
    ("env-name-dash", ray, {"env": {"A-B": "x"}}, f"{R}.env.A-B", "is not a valid environment variable name"),
    ("env-name-space", serve, {"env": {"A B": "x"}}, f'{S}.env."A B"', "is not a valid environment variable name"),
    ("env-value-nul", serve, {"env": {"A": "x\x00y"}}, f"{S}.env.A", "contains the control character U+0000"),
    ("env-fabric-ray", ray, {"env": {"VLLM_HOST_IP": "192.168.200.12"}}, f"{R}.env.VLLM_HOST_IP",
     "is per node (set from nodes[].fabric_ip / fabric_interface)"),
    ("env-fabric-head", ray, {"head_env": {"NCCL_SOCKET_IFNAME": "enp1s0f1np1"}},
     f"{R}.head_env.NCCL_SOCKET_IFNAME", "copied to every node"),
    ("env-fabric-serve", serve, {"env": {"RAY_NODE_IP_ADDRESS": "192.168.200.12"}},
     f"{S}.env.RAY_NODE_IP_ADDRESS", "is per node"),
    ("env-api-key-serve", serve, {"env": {"VLLM_API_KEY": "x"}}, f"{S}.env.VLLM_API_KEY",
     "set by the supervisor from readiness.api_key_file or readiness.api_key_env"),
    ("env-api-key-node", node(1), {"env": {"VLLM_API_KEY": "x"}}, "nodes[1].env.VLLM_API_KEY",
     "readiness.api_key_file"),
    # 13. interface names
    ("ifname-long", node(0), {"fabric_interface": "enp1s0f1np1-fabric"}, "nodes[0].fabric_interface",
     "is not a Linux interface name (at most 15 characters"),
    ("ifname-slash", node(0), {"fabric_interface": "enp1/s0"}, "nodes[0].fabric_interface", "no '/', ':'"),
    ("ifname-dotdot", node(0), {"fabric_interface": ".."}, "nodes[0].fabric_interface", "not a Linux interface"),
    # 14. volumes
    ("volume-no-colon", ray, {"volumes": ["a-string-without-colon"]}, f"{R}.volumes[0]", "is not src:dst[:mode]"),
    ("volume-relative-src", ray, {"volumes": ["./cache:/cache"]}, f"{R}.volumes[0]",
     "neither an absolute path nor a volume name"),
    ("volume-relative-dst", ray, {"volumes": ["/cache:cache"]}, f"{R}.volumes[0]", "is not an absolute path"),
    ("volume-root-dst", ray, {"volumes": ["/srv:/"]}, f"{R}.volumes[0]", "would replace the container's root"),
    ("volume-mode", ray, {"volumes": ["/srv:/srv:rx"]}, f"{R}.volumes[0]", "is not ro, rw, z, Z"),
    ("volume-source-twice", ray, {"volumes": ["/srv:/a", "/srv:/b"]}, f"{R}.volumes[1]",
     "is mounted again differently"),
    ("volume-destination-twice", ray, {"volumes": ["/srv:/data", "/opt:/data/"]}, f"{R}.volumes[1]",
     "one mount per destination"),
    # 15. docker sizes and ulimits
    ("shm-size-words", ray, {"shm_size": "10 GB"}, f"{R}.shm_size", "is not a Docker size"),
    ("shm-size-zero", ray, {"shm_size": "0"}, f"{R}.shm_size", "is not a Docker size"),
    ("ulimit-name", ray, {"ulimits": {"memlok": -1}}, f"{R}.ulimits.memlok", "unknown ulimit"),
    ("ulimit-value", ray, {"ulimits": {"nofile": -2}}, f"{R}.ulimits.nofile", "is not a ulimit value"),
    # 16. the API key
    ("api-key-plain", ready, {"api_key": "hunter2"}, f"{Q}.api_key",
     "removed: a key written in the config ends up on command lines"),
    ("api-key-file-relative", ready, {"api_key_file": "key.txt"}, f"{Q}.api_key_file", "is a relative path"),
    ("api-key-file-missing", ready, {"api_key_file": "/nonexistent/api-key"}, f"{Q}.api_key_file",
     "cannot read /nonexistent/api-key: No such file or directory"),
    ("api-key-file-device", ready, {"api_key_file": "/dev/null"}, f"{Q}.api_key_file", "is not a regular file"),
    ("api-key-file-directory", ready, {"api_key_file": "/"}, f"{Q}.api_key_file", "is a directory"),
    ("api-key-env-unset", ready, {"api_key_env": "SPARK_KEY"}, f"{Q}.api_key_env",
     "environment variable SPARK_KEY is not set"),
    ("api-key-env-empty", ready, {"api_key_env": "SPARK_KEY"}, f"{Q}.api_key_env",
     "environment variable SPARK_KEY is empty", {"SPARK_KEY": "  "}),
    ("api-key-env-bad-name", ready, {"api_key_env": "SPARK-KEY"}, f"{Q}.api_key_env",
     "is not a valid environment variable name"),
    ("api-key-both", ready, {"api_key_file": "/dev/null", "api_key_env": "K"}, f"{Q}.api_key_env",
     "set either api_key_file or api_key_env, not both"),
    # 17. paths
    ("state-dir-relative", sup, {"state_dir": "state"}, "supervisor.state_dir", "is a relative path"),
    ("state-dir-root", sup, {"state_dir": "/"}, "supervisor.state_dir", "must not be '/'"),
    ("log-dir-relative", serve, {"log_dir": "logs"}, f"{S}.log_dir", "is a relative path"),
    # 18. timings
    ("backoff-inverted", sup, {"backoff_base": 60, "backoff_max": 30}, "supervisor.backoff_max",
     "is less than backoff_base 60"),
    ("deep-probe-overlap", healing, {"deep_probe_interval": 30, "deep_probe_timeout": 30},
     "healing.deep_probe_timeout", "is not less than deep_probe_interval"),
    ("sanity-tokens-huge", ready, {"sanity_max_tokens": 100000}, f"{Q}.sanity_max_tokens",
     "less than or equal to 4096"),
    ("io-timeout-ms", sup, {"io_timeout": 20000}, "supervisor.io_timeout", "more than the 600 s limit: a typo?"),
    ("retry-wait-inverted", top, {"retry": {"wait_initial": 5, "wait_max": 1}}, "retry.wait_max",
     "is less than wait_initial 5"),
    ("retry-attempts-0", top, {"retry": {"stop_after_attempt": 0}}, "retry.stop_after_attempt",
     "greater than or equal to 1"),
    ("unknown-patience-0", healing, {"unknown_patience": 0}, "healing.unknown_patience", "greater than 0"),
    ("pull-timeout-negative", ray, {"pull_timeout": -1}, f"{R}.pull_timeout", "greater than 0"),
    # 19. argv lists
    ("ray-command-empty", ray, {"command": []}, f"{R}.command", "an empty command"),
    ("serve-command-empty", serve, {"command": []}, f"{S}.command", "an empty command"),
    ("nvidia-smi-empty", node(1), {"nvidia_smi": []}, "nodes[1].nvidia_smi", "an empty command"),
    ("meminfo-blank-program", node(0), {"meminfo": ["", "/proc/meminfo"]}, "nodes[0].meminfo",
     "the program name (first element) is empty"),
    ("ip-empty", node(0), {"ip": []}, "nodes[0].ip", "an empty command"),
    ("argv-nul", node(0), {"oob": ["pct", "exec\x00"]}, "nodes[0].oob[1]", "control character U+0000"),
    # 20. flags the supervisor sets itself
    ("serve-port-flag", serve, {"extra_args": "--max-model-len 65536 --port 9000"}, f"{S}.extra_args[2]",
     "--port is set by the supervisor: set deployments.serve.port instead"),
    ("serve-tp-flag-eq", serve, {"extra_args": ["--tensor-parallel-size=2"]}, f"{S}.extra_args[0]",
     "set deployments.serve.tensor_parallel_size instead"),
    ("serve-tp-short", serve, {"extra_args": "-tp 2"}, f"{S}.extra_args[0]",
     "-tp is set by the supervisor"),
    ("serve-api-key-flag", serve, {"extra_args": "--api-key=abc"}, f"{S}.extra_args[0]",
     "set deployments.readiness.api_key_file or api_key_env instead"),
    ("ray-num-gpus-flag", ray, {"extra_args": "--num-gpus=2"}, f"{R}.extra_args[0]",
     "--num-gpus is set by the supervisor: set nodes[].gpus instead"),
    ("ray-address-flag", ray, {"extra_args": ["--address", "10.0.0.1:6379"]}, f"{R}.extra_args[0]",
     "--address is set by the supervisor"),
    # 21. control characters anywhere
    ("prompt-escape", ready, {"sanity_prompt": "\x1b[31mready"}, f"{Q}.sanity_prompt",
     "contains the control character U+001B"),
    ("model-newline", serve, {"model": "Qwen/Qwen3\nx"}, f"{S}.model", "contains the control character U+000A"),
    ("env-brings-newline", serve, {"served_model_name": "${NAME}"}, f"{S}.served_model_name",
     "contains the control character U+000A", {"NAME": "a\nb"}),
    # 22. endpoint
    ("endpoint-scheme", ready, {"endpoint": "ftp://192.168.200.12:8000"}, f"{Q}.endpoint",
     "expected an http:// or https:// URL with a host"),
    ("endpoint-no-host", ready, {"endpoint": "http://"}, f"{Q}.endpoint", "with a host"),
    ("endpoint-empty-label", ready, {"endpoint": "http://a..b:8000"}, f"{Q}.endpoint", "'a..b' is not a host name"),
    ("endpoint-long-label", ready, {"endpoint": f"http://{'x' * 64}.lan:8000"}, f"{Q}.endpoint", "over 63 characters"),
    # and the operator's commonest mistake
    ("typo", sup, {"intervall": 3}, "supervisor.intervall", "unknown key (did you mean 'interval'?)"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_mistake_is_one_line_naming_file_and_key(case: tuple[Any, ...]) -> None:
    _, table, patch, key, fragment, *env = case
    d = data()
    table(d).update(patch)
    found = problems(d, env[0] if env else None)
    assert any(p.startswith(f"{SRC}: {key}: ") and fragment in p for p in found), found
    assert len(found) == 1, found  # one mistake, one line
    assert all("\n" not in p for p in found)


def test_the_table_is_large_and_its_ids_are_unique() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) >= 35 and len(set(ids)) == len(ids)


# ------------------------------------------------------------------------------------------- files
def load_problems(path: Path | str) -> list[str]:
    with pytest.raises(config.ConfigError) as e:
        config.load(path, env={})
    return e.value.problems


@pytest.mark.parametrize("content, fragment", [
    ("name = 'café'\n".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 11)"),
    (bytes(range(256)) * 8, "not UTF-8 text"),
    (b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 64, "not valid TOML"),
    (b"", "the config is empty"),
    (b"# only a comment\n\n", "the config is empty"),
    (b"a = " + b"[" * 50000, "not valid TOML"),
    (b"# " + b"x" * (2 << 20), "cannot read: is larger than"),
], ids=["latin-1", "binary", "elf-like", "empty", "comments-only", "deeply-nested", "huge"])
def test_files_that_are_not_configs(tmp_path: Path, content: bytes, fragment: str) -> None:
    p = tmp_path / "c.toml"
    p.write_bytes(content)
    found = load_problems(p)
    assert len(found) == 1 and found[0].startswith(f"{p}: ") and fragment in found[0], found


def test_a_directory_a_missing_file_and_a_device(tmp_path: Path) -> None:
    assert load_problems(tmp_path) == [f"{tmp_path}: cannot read: is a directory: give the path of a file"]
    assert load_problems(tmp_path / "nope.toml") == [f"{tmp_path / 'nope.toml'}: cannot read: No such file or directory"]
    assert "cannot read: is not a regular file (it leads to /dev/zero)" in load_problems("/dev/zero")[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[supervisor]\n")
    p.chmod(0)
    assert load_problems(p) == [f"{p}: cannot read: Permission denied"]


def test_a_file_name_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    p = tmp_path / "a\nb.toml"
    p.write_bytes(b"\xff")
    (line,) = load_problems(p)
    assert "\n" not in line and line.startswith(json.dumps(str(p)))


def test_a_utf8_bom_is_tolerated(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_bytes(b"\xef\xbb\xbf" + (ROOT / "etc" / "spark-supervisor.toml").read_bytes())
    assert config.load(p).head.fabric_ip == "192.168.200.12"


def test_check_on_a_binary_file_exits_2_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "c.toml"
    p.write_bytes(bytes(range(256)))
    with pytest.raises(SystemExit) as e:
        main(["check", "--config", str(p)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{p}: not UTF-8 text") and "Traceback" not in err


def test_random_bytes_raise_only_config_errors(tmp_path: Path) -> None:
    rng = random.Random(20261202)
    story = (ROOT / "etc" / "spark-supervisor.toml").read_bytes()
    p = tmp_path / "fuzz.toml"
    for i in range(48):
        if i % 3 == 0:
            blob = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 600)))
        elif i % 3 == 1:
            blob = bytes(rng.choice(b"[]{}=\"'.,#\n \\x0123456789abcnaif+-:") for _ in range(rng.randrange(0, 300)))
        else:  # the story config with a few bytes changed
            b = bytearray(story)
            for _ in range(rng.randrange(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            blob = bytes(b)
        p.write_bytes(blob)
        try:
            config.load(p, env={})
        except config.ConfigError as e:
            assert e.problems and all(line.startswith(f"{p}: ") and "\n" not in line for line in e.problems)
            assert not any("please report it" in line for line in e.problems), (blob, e.problems)


ODD_VALUES: list[Any] = [math.nan, math.inf, -1, 0, 10**30, "", " ", "\x00", "-x", [], {}, [[]], True, "x" * 5000,
                         {"a": 1}, ["a", 1], 1.5]


def _tables(d: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path] if isinstance(d, dict) else []
    for k, v in (d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else []):
        out += _tables(v, (*path, k))
    return out


def test_odd_values_anywhere_raise_only_config_errors() -> None:
    rng = random.Random(7)
    fields: dict[str, type[BaseModel]] = {"supervisor": config.Supervisor, "healing": config.Healing, "retry": config.Retry,
              "metrics": config.Metrics, "stale": config.Stale}
    for _ in range(300):
        d = data()
        d["deployments"][0].setdefault("ray", {})
        d["deployments"][0].setdefault("readiness", {})
        where = rng.choice(_tables(d))
        t: Any = d
        for k in where:
            t = t[k]
        model = fields.get(where[0]) if len(where) == 1 else None
        names = list(model.model_fields) if model else list(t) or ["x"]
        t[rng.choice(names)] = rng.choice(ODD_VALUES)
        try:
            config.parse(d, SRC, env={})
        except config.ConfigError as e:
            assert not any("please report it" in line for line in e.problems), (where, e.problems)


# ------------------------------------------------------------------------------------------- the key
def with_key_file(tmp_path: Path, content: str, name: str = "api-key") -> dict[str, Any]:
    f = tmp_path / name
    f.write_text(content)
    f.chmod(0o600)
    d = data()
    d["deployments"][0]["readiness"] = {"api_key_file": str(f)}
    return d


def test_the_key_from_a_file_is_stripped_and_never_shown(tmp_path: Path) -> None:
    c = config.parse(with_key_file(tmp_path, f"  {KEY}\n"), SRC, env={})
    dep = c.deployment
    assert dep.api_key.get_secret_value() == KEY and KEY not in str(dep.api_key)
    for text in (repr(c), str(c), repr(dep), str(dep.readiness), json.dumps(c.model_dump()), c.model_dump_json(),
                 config.serve_hash(c, dep), config.ray_hash(c, dep)):
        assert KEY not in text


def test_an_empty_key_file(tmp_path: Path) -> None:
    found = problems(with_key_file(tmp_path, " \n"))
    assert found == [f"{SRC}: deployments[0].readiness.api_key_file: {tmp_path / 'api-key'} is empty: put the API key "
                     "in it"]


def test_the_key_never_appears_in_problems(tmp_path: Path) -> None:
    d = with_key_file(tmp_path, KEY)
    d["supervisor"]["interval"] = "fast"
    assert not any(KEY in line for line in problems(d))
    for bad in (f"{KEY} {KEY}", f"{KEY}\n{KEY}", f"{KEY}\u00e9"):  # a space, two lines, non-ASCII
        found = problems(with_key_file(tmp_path, bad))
        assert len(found) == 1 and "must be one line of printable ASCII" in found[0]
        assert KEY not in found[0]
    found = problems(data(deployments=[{"name": "qwen", "readiness": {"api_key": KEY},
                                        "serve": data()["deployments"][0]["serve"]}]))
    assert len(found) == 1 and KEY not in found[0] and "api_key_file" in found[0]


def test_a_new_key_is_a_change_and_relaunches_the_serve(tmp_path: Path) -> None:
    a = config.parse(with_key_file(tmp_path, KEY, "a"), SRC, env={})
    same = config.parse(with_key_file(tmp_path, KEY, "a"), SRC, env={})
    b = config.parse(with_key_file(tmp_path, KEY + "2", "a"), SRC, env={})
    none = config.parse(data(), SRC, env={})
    assert a == same and a != b and a != none
    assert config.serve_hash(a, a.deployment) == config.serve_hash(same, same.deployment)
    assert config.serve_hash(a, a.deployment) != config.serve_hash(b, b.deployment)
    assert config.serve_hash(none, none.deployment) not in {config.serve_hash(a, a.deployment)}
    assert config.ray_hash(a, a.deployment) == config.ray_hash(b, b.deployment)  # Ray stays
    with pytest.raises(Exception, match="frozen"):
        a.deployment.readiness.api_key_file = "/x"


def test_the_key_from_an_environment_variable() -> None:
    d = data()
    d["deployments"][0]["readiness"] = {"api_key_env": "SPARK_VLLM_KEY"}
    c = config.parse(d, SRC, env={"SPARK_VLLM_KEY": f" {KEY} "})
    assert c.deployment.api_key.get_secret_value() == KEY and KEY not in repr(c) + str(c.deployment.api_key)
    assert config.parse(data(), SRC, env={}).deployment.api_key.get_secret_value() == ""


# ------------------------------------------------------------------------------------------- what stays fine
@pytest.mark.parametrize("table, patch", [
    (node(0), {"fabric_ip": "127.0.0.2"}),  # the testbed's loopback "fabric"
    (node(0), {"fabric_ip": "169.254.10.1"}),  # link-local, as on a direct QSFP cable
    (serve, {"host": "0.0.0.0"}),
    (node(0), {"docker": "tcp://127.0.0.1:2375"}),
    (node(1), {"docker": "ssh://root@spark-2:2222"}),
    (stale, {"units": ["vllm-cluster.service", "vllm-proxy.socket", "old-stack@1.service"]}),
    (stale, {"image_patterns": ["vllm/vllm-openai*", "nvcr.io/nvidia/vllm*", "*vllm*"]}),
    (stale, {"container_labels": ["com.docker.compose.project=vllm"]}),
    (ray, {"volumes": ["/models:/models:ro,z", "hf-cache:/root/.cache/huggingface"]}),
    (ray, {"volumes": ["/usr:/usr:ro", "/usr:/usr:ro"]}),  # the testbed on a system Python
    (ray, {"shm_size": "10.24g", "ulimits": {"memlock": -1, "nofile": 1048576}}),
    (serve, {"extra_args": "--max-model-len 65536 --chat-template '/a b.jinja'"}),
    (serve, {"env": {"VLLM_ENGINE_READY_TIMEOUT_S": "1800", "TAB": "a\tb"}}),
    (node(1), {"env": {"NCCL_SOCKET_IFNAME": "enp1s0f1np1,enp1s0f0np0"}}),  # a per-node override
    (ready, {"stall_timeout": 2000, "deadline": 1200}),
    (top, {"metrics": {"listen": "127.0.0.1:9464"}, "retry": {"stop_after_attempt": 5, "wait_max": 1}}),
], ids=["loopback", "link-local", "bind-all", "tcp-loopback", "ssh-port", "unit-types", "narrow-patterns",
        "foreign-label", "volume-modes", "same-volume-twice", "docker-sizes", "extra-args", "tab", "node-env-override",
        "stall-after-deadline", "new-sections"])
def test_reasonable_configs_still_load(table: Callable[[dict[str, Any]], dict[str, Any]],
                                       patch: dict[str, Any]) -> None:
    d = data()
    table(d).update(patch)
    config.parse(d, SRC, env={})


def test_new_keys_have_their_defaults() -> None:
    c = config.parse(data(), SRC, env={})
    assert c.healing.unknown_patience == 60
    assert (c.retry.stop_after_attempt, c.retry.stop_after_delay, c.retry.wait_initial, c.retry.wait_max) == (3, 10, 0.2, 2)
    assert c.deployment.ray.pull_timeout == 1800


def test_a_learned_limits_floor_below_a_minute_is_refused_with_its_key() -> None:
    """Issue 42 (LOW): a floor of 1 s would take one slow tick for a stall."""
    d = data()
    d["deployments"][0]["readiness"] = {"deadline_floor": 1, "stall_floor": 59}
    found = problems(d)
    assert any("deployments[0].readiness.deadline_floor" in p for p in found), found
    assert any("deployments[0].readiness.stall_floor" in p for p in found), found
    d["deployments"][0]["readiness"] = {"deadline_floor": 60, "stall_floor": 60}
    kept = cfg(d).deployment.readiness
    assert (kept.deadline_floor, kept.stall_floor) == (60, 60)
