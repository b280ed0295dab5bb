"""The model check's and the prefetch's programs, run in the deployment's image (judge.modelcheck reads
what they print), their arguments, and the key a check's finding is kept under: what the check depends on."""

from __future__ import annotations

import hashlib
import json

from ..config import Config, Deployment, ray_hash
from . import script

MARK = "spark-model:"
PROGRESS = "/tmp/spark-model-prefetch.json"  # in the prefetch container
PREFETCH_KEEP_S = 900  # the prefetch container waits this long after its end for its result to be read
MAX_LISTED = 5000  # files of the model directory looked at (a model has tens)

# The Python that runs in the image (stdlib only), shared by the probe and the prefetch: where vLLM would
# find the model (huggingface_hub's own rules for the cache).
_RESOLVE = script.load("model-resolve.py")

# $1 model, $2 revision, $3 download dir. Sizes: >= 0 bytes, -1 absent, -2 a dangling link, -3 a directory.
PROBE_PY = _RESOLVE + script.load("model-probe.py").replace("MAX]", f"{MAX_LISTED}]")

# $1 model, $2 revision, $3 download dir, $4 the source directory ("" for the hub), $5 the deadline in
# seconds, $6 how long to wait for the result to be read, $7 the progress file. Copies only what is missing or of another size,
# each file through a ".spark-partial" name, so a half-copied file is never taken for a whole one.
PREFETCH_PY = _RESOLVE + script.load("model-prefetch.py")

# Runs one of the programs above with the image's Python: the interpreter of the serve command (a python
# itself, or the `#!` line of its script), else python3 or python on PATH. $1 the serve command, $2 the
# program, then its arguments.
RUN_PY = script.load("model-run-py.sh").replace("MARK", MARK)


def probe_args(dep: Deployment) -> list[str]:
    return [dep.serve.model, dep.serve.revision, dep.serve.download_dir]


def key(cfg: Config, dep: Deployment) -> str:
    """What a check depends on: the image, mounts and environment (ray_hash), the model and how vLLM finds it."""
    s = dep.serve
    spec = {"ray": ray_hash(cfg, dep), "model": s.model, "env": s.env, "command": s.command[0],
            "revision": s.revision, "download_dir": s.download_dir}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
