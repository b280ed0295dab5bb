"""The non-root operator at its edges (issue 44, item 3): the node's privilege prefix on exactly the commands
that need root, its known_hosts and key on both SSH paths, the sudoers rule, and the access checks' judgements
(only positive evidence is a problem). The real user, sshd and sudo: tests/integration/test_nonroot.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import paramiko
import pytest

from spark_supervisor.adapters.dockerssh import host_key_error
from spark_supervisor.adapters.shell import SshKeys, ssh_argv
from spark_supervisor.config import ConfigError, parse
from spark_supervisor.judge import access
from spark_supervisor.judge.access import Answer
from spark_supervisor.model import Kind
from spark_supervisor.specs import commands, privilege
from tests.helpers import TEST_IMAGE

NEEDED = [["systemctl", "stop", "vllm-proxy.service"], ["systemctl", "disable", "vllm-proxy.service"],
          ["sysctl", "-w", "vm.drop_caches=3"]]


def config(**worker: Any) -> dict[str, Any]:
    return {"nodes": [{"name": "spark-1", "role": "head", "fabric_ip": "10.0.0.1"},
                      {"name": "spark-2", "role": "worker", "fabric_ip": "10.0.0.2", "ssh": "spark@spark-2",
                       "docker": "ssh://spark@spark-2", **worker}],
            "stale": {"units": ["vllm-proxy"], "disable": True},
            "deployments": [{"ray": {"image": TEST_IMAGE}, "serve": {"model": "m/m", "tensor_parallel_size": 2}}]}


# ------------------------------------------------------------------------------------------- commands
def test_only_root_commands_take_the_prefix() -> None:
    sudo = ["sudo", "-n"]
    assert commands.systemctl("stop", ["vllm-proxy"], sudo) == ["sudo", "-n", "systemctl", "stop", "vllm-proxy.service"]
    assert commands.systemctl("disable", ["a"]) == ["systemctl", "disable", "a.service"]
    assert commands.systemctl("mask", ["a.socket"], sudo) == ["sudo", "-n", "systemctl", "mask", "a.socket"]
    assert commands.drop_caches() == [commands.DROP_CACHES]  # as root: unchanged
    # Through the prefix: sync as the user, then only the write, with no shell for the sudoers rule to name.
    assert commands.drop_caches(sudo) == [["sync"], ["sudo", "-n", "sysctl", "-w", "vm.drop_caches=3"]]


def test_the_root_commands_follow_the_config() -> None:
    cfg = parse(config(), "t")
    assert privilege.root_commands(cfg, cfg.nodes[1]) == NEEDED
    assert privilege.root_commands(cfg, cfg.nodes[0]) == NEEDED[:2]  # the head drops its cache in a container
    own = parse(config(drop_caches=["/usr/local/bin/drop"]), "t")
    assert privilege.root_commands(own, own.nodes[1]) == NEEDED[:2]  # the operator's own command, as written
    masked = parse({**config(), "stale": {"units": ["a", "b"], "mask": True}, "memory": {"page_cache": "never"}}, "t")
    assert privilege.root_commands(masked, masked.nodes[1]) == [
        ["systemctl", "stop", "a.service"], ["systemctl", "mask", "a.service"],
        ["systemctl", "stop", "b.service"], ["systemctl", "mask", "b.service"]]


def test_the_sudoers_rule_names_each_command_whole_and_visudo_takes_it(tmp_path: Path) -> None:
    rule = privilege.sudoers_rule("spark", NEEDED)
    assert "/usr/bin/systemctl disable vllm-proxy.service" in rule
    assert "/usr/sbin/sysctl -w vm.drop_caches\\=3" in rule  # '=' escaped, as sudoers(5) asks
    assert rule.endswith("spark ALL=(root) NOPASSWD: SPARK_SUPERVISOR\n")
    if not shutil.which("visudo"):
        pytest.skip("visudo is not installed")
    (tmp_path / "rule").write_text(rule)
    r = subprocess.run(["visudo", "-cf", str(tmp_path / "rule")], capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------------------------------- ssh paths
def test_known_hosts_and_key_go_to_ssh_and_strict_refuses_unknown_hosts_whatever_the_config() -> None:
    keys = SshKeys("/etc/spark/known_hosts", "/etc/spark/id_ed25519")
    argv = ssh_argv("spark@spark-2", ["true"], connect_timeout=5, keys=keys, strict=True)
    opts = argv[1:argv.index("spark@spark-2")]
    assert "UserKnownHostsFile=/etc/spark/known_hosts" in opts and "StrictHostKeyChecking=yes" in opts
    assert opts[opts.index("-i") + 1] == "/etc/spark/id_ed25519" and "IdentitiesOnly=yes" in opts
    plain = ssh_argv("spark@spark-2", ["true"], connect_timeout=5)
    assert not any(o.startswith(("UserKnownHostsFile", "StrictHostKeyChecking")) for o in plain) and "-i" not in plain


def test_paramikos_host_key_refusals_are_named() -> None:
    unknown = host_key_error(paramiko.SSHException("Server '[127.0.0.1]:2222' not found in known_hosts"))
    assert unknown is not None and unknown.reason == Kind.HOST_KEY_UNKNOWN
    key = paramiko.RSAKey.generate(1024)
    changed = host_key_error(paramiko.BadHostKeyException("spark-2", key, key))
    assert changed is not None and changed.reason == Kind.HOST_KEY_CHANGED
    assert host_key_error(paramiko.SSHException("Error reading SSH protocol banner")) is None


# ------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(("worker", "words"), [
    ({"become": ["sudo"]}, "nodes[1].become: ['sudo']: sudo without -n asks for a password"),
    ({"become": ["sudo -n"]}, "nodes[1].become: \"sudo -n\" is one argument with spaces"),
    ({"become": ["sudo", ""]}, "nodes[1].become: ['sudo', ''] has an empty argument"),
    ({"known_hosts": "known_hosts"}, "nodes[1].known_hosts: \"known_hosts\" is a relative path"),
    ({"identity_file": "/a b/id"}, "nodes[1].identity_file: \"/a b/id\" contains whitespace"),
    ({"ssh": "", "docker": "local", "known_hosts": "/k"}, "nodes[1].known_hosts: is used only to reach a node over SSH"),
])
def test_a_bad_privilege_or_ssh_key_setting_names_its_key(worker: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse(config(**worker), "t")
    assert words in str(e.value)


def test_good_settings_load() -> None:
    cfg = parse(config(become=["/usr/bin/sudo", "-n"], known_hosts="/etc/spark/kh", identity_file="/etc/spark/id"), "t")
    assert cfg.nodes[1].become == ["/usr/bin/sudo", "-n"] and SshKeys.of(cfg.nodes[1]) == SshKeys("/etc/spark/kh",
                                                                                                   "/etc/spark/id")
    assert parse(config(), "t").nodes[1].become == []


# ------------------------------------------------------------------------------------------- judgements
def test_ssh_host_key_answers() -> None:
    def judge(rc: int, err: str) -> access.Finding:
        return access.host_key_ssh("spark-2", "10.0.0.2", 22, "/root/.ssh/known_hosts", rc, err)
    assert judge(0, "").ok and judge(1, "").ok  # past the host key
    f = judge(255, "No ED25519 host key is known for 10.0.0.2 and you have requested strict checking.\r\n"
                   "Host key verification failed.\r\n")
    assert f.reason is not None and f.reason.kind == Kind.HOST_KEY_UNKNOWN
    assert "ssh-keyscan -H 10.0.0.2 >> /root/.ssh/known_hosts" in f.hint
    f = judge(255, "@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @\nHost key verification failed.\n")
    assert f.reason is not None and f.reason.kind == Kind.HOST_KEY_CHANGED and "ssh-keygen -R" in f.hint
    f = judge(255, "ssh: connect to host 10.0.0.2 port 22: Connection refused\n")
    assert f.reason is None and "Connection refused" in f.unknown  # unreachable: not a host-key verdict


def test_docker_host_key_answers() -> None:
    def judge(kind: str, detail: str = "") -> access.Finding:
        return access.host_key_docker("spark-2", "10.0.0.2", 2222, "/k", kind, detail)
    assert judge("").ok
    assert (r := judge(Kind.HOST_KEY_UNKNOWN, "not found in known_hosts").reason) and r.kind == Kind.HOST_KEY_UNKNOWN
    assert "ssh-keyscan -H -p 2222 10.0.0.2 >> /k" in judge(Kind.HOST_KEY_UNKNOWN).hint
    assert judge("DockerUnreachable", "timed out").unknown.startswith("DockerUnreachable")


def test_sudo_is_asked_with_list_and_other_prefixes_are_not() -> None:
    assert access.sudo_probe(["sudo", "-n"], NEEDED[0]) == ["sudo", "-n", "-l", *NEEDED[0]]
    assert access.sudo_probe(["/usr/bin/sudo"], NEEDED[0]) == ["/usr/bin/sudo", "-n", "-l", *NEEDED[0]]
    assert access.sudo_probe(["doas"], NEEDED[0]) is None and access.sudo_probe([], NEEDED[0]) is None


def test_privilege_answers() -> None:
    rule = privilege.sudoers_rule("spark", NEEDED)
    sudo = ["sudo", "-n"]

    def judge(uid: int | None, become: list[str], answers: list[Answer | None],
              needed: list[list[str]] = NEEDED) -> access.Finding:
        return access.privilege("spark-2", "spark", uid, become, needed, answers, rule)
    assert judge(0, [], []).ok and judge(1000, [], [], needed=[]).ok  # root; or nothing needs root
    f = judge(1000, [], [])
    assert f.reason is not None and f.reason.kind == Kind.NO_PRIVILEGE and "not root and nodes.become is not set" in str(f)
    assert rule in f.hint
    assert judge(1000, sudo, [Answer(0)] * 3).ok
    f = judge(1000, sudo, [Answer(0), Answer(1, "Sorry, user spark may not run sudo on spark-2."), Answer(0)])
    assert f.reason is not None and "`sudo -n systemctl disable vllm-proxy.service`" in f.reason.detail
    assert rule in f.hint
    f = judge(1000, sudo, [Answer(127, "sh: 1: sudo: not found")] * 3)
    assert f.reason is not None and "sudo is not installed" in f.reason.detail
    # No evidence, no verdict: a probe that could not run, a prefix that cannot be asked, an odd answer.
    assert judge(None, sudo, []).unknown and judge(1000, sudo, [None, None, None]).unknown
    assert judge(1000, ["doas"], []).unknown and judge(1000, sudo, [Answer(2, "?")] * 3).unknown
