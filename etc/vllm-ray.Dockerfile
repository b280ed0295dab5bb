# A vLLM image with Ray in it, for deployments on the Ray backend (the default): vLLM's own images after 0.19.1
# and NVIDIA's NGC vLLM image ship without Ray. NVIDIA's two-Spark playbook makes the same patch
# (NVIDIA/dgx-spark-playbooks nvidia/vllm/README.md, "Run on two Sparks": pip install 'ray[default]' into the
# NGC container before `ray start`); here it is done once, at build time, instead of at every container start.
#
# Build it on one Spark and load it on the other (both nodes must hold the same image ID; the daemon never pulls
# an image it cannot find there, image_pull = "never"):
#   docker build -t spark-vllm-ray:latest - < etc/vllm-ray.Dockerfile
#   docker save spark-vllm-ray:latest | ssh spark-2 docker load
# Another vLLM image: --build-arg BASE=<image>; its `python3` must be the interpreter vLLM runs in, with pip
# (`vllm serve --distributed-executor-backend ray` imports Ray there). A mirror or a local wheel directory
# instead of PyPI: --build-arg PIP_ARGS="--index-url <mirror>" or "--no-index --find-links <dir in BASE>".

# NVIDIA's vLLM container for DGX Spark (arm64, CUDA 13, GB10), the base of NVIDIA's playbook.
ARG BASE=nvcr.io/nvidia/vllm:26.05-py3
FROM ${BASE}

# 2.60.0: the Ray the daemon's own Ray code (dashboard REST API, GCS node table) is tested against, and the one
# installed in the testbed. vLLM's Ray executor asks for ray >= 2.48 (vLLM's requirements/cuda.txt while Ray
# was a dependency); a newer Ray works as long as every node runs the same one (the image check compares them).
# [default] brings the dashboard, which the daemon reads Ray's node table from (without it: the GCS, slower).
ARG RAY_VERSION=2.60.0
ARG PIP_ARGS=""

# PIP_ARGS is split into words on purpose (several pip options in one build argument).
RUN python3 -m pip install --no-cache-dir ${PIP_ARGS} "ray[default]==${RAY_VERSION}" \
 && python3 -c "import ray; print('ray', ray.__version__, 'in', ray.__file__)" \
 && ray --version
