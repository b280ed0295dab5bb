"""What the image check found on a node: the image's Ray and vLLM, and the model as the image sees it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelReport:
    """The model on one node as the deployment's image sees it (modelcheck): made with every image check,
    so once per start. ``missing`` empty: complete. ``unchecked``: it could not be looked at (not evidence)."""

    node: str
    model: str
    key: str  # modelprobe.key: a new image, mounts, env or model means a new check
    path: str = ""  # the directory it resolved to (a snapshot in the hub cache, or the local path)
    source: str = ""  # "local" or "hub"
    cache: str = ""  # the hub cache it looked in
    missing: tuple[str, ...] = ()  # files missing or implausible, each "name (why)"
    files: int = 0  # weight files found
    bytes: int = 0
    unchecked: str = ""
    prefetch: str = ""  # "running" while a prefetch fills the node
    prefetched: bool = False  # a prefetch ran for this start (it is not started twice)
    detail: str = ""  # the prefetch's outcome
    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    revision: str = ""  # the hub snapshot it resolved to (a commit), or "" (a local directory, or not found)
    config_sha256: str = ""  # of its config.json (or params.json) ("": not read)
    # What a copy between nodes is compared by (judge.modelcheck.differences; judge.modelcopy): each weight file
    # (the index's shards, else the weight files) and its size; each file that is a link into the hub cache's
    # blobs/ and the blob's name (for a file kept in Git LFS, the sha256 of its content).
    sizes: tuple[tuple[str, int], ...] = ()
    blobs: tuple[tuple[str, str], ...] = ()
    disk_gb_s: float | None = None  # the disk's sequential read under the largest weight file (None: not measured)

    @property
    def found(self) -> bool:
        """It resolved to a directory (a snapshot, or the local path) whose files were looked at."""
        return bool(self.path) and (self.source == "local" or "/snapshots/" in self.path)

    def summary(self) -> str:
        if self.prefetch == "running":
            total = f" of {_size(self.bytes_total)}" if self.bytes_total else ""
            files = f"{self.files_done}/{self.files_total} files, " if self.files_total else ""
            return f"prefetching into {self.path or '?'}: {files}{_size(self.bytes_done)}{total}"
        if self.unchecked:
            return f"not checked: {self.unchecked}"
        if self.missing:
            more = f" and {len(self.missing) - 3} more" if len(self.missing) > 3 else ""
            return f"MISSING{f' in {self.path}' if self.found else ''}: {', '.join(self.missing[:3])}{more}"
        return f"{self.path}: {self.files} weight file{'' if self.files == 1 else 's'}, {_size(self.bytes)}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class ImageReport:
    """What a node's copy of the deployment's image holds (commands.IMAGE_PROBE). Versions: "" when the
    command is there but its version could not be read; paths "" when the command is not there."""

    node: str
    image: str
    key: str  # the DeploymentView.image_key it was checked for: new mounts, env or serve command, a new check
    start: int = 0  # Status.starts when it was made: every start checks again (cheap: kept by image ID)
    ray_path: str = ""
    ray_version: str = ""
    ray_python: str = ""
    dashboard: bool = False
    dashboard_detail: str = ""
    vllm_path: str = ""
    vllm_version: str = ""
    vllm_python: str = ""
    model: ModelReport | None = None  # the model as the image sees it on this node (None: not checked)
    model_later: bool = False  # not checked yet: complete at its last check, checked again while Ray joins
    # What vLLM runs on, from its interpreter's package metadata ("": not installed as a package, or not read)
    torch_version: str = ""
    transformers_version: str = ""
    nccl_version: str = ""
    image_id: str = ""  # the image checked, by ID, as the engine inspected it for this check ("": not read)
    repo_digests: tuple[str, ...] = ()  # its repo digests (repo@sha256:...): none for an image never pushed or pulled

    def summary(self, uses_ray: bool = True) -> str:
        ray = (f"ray {self.ray_version or '?'} ({'with' if self.dashboard else 'without'} dashboard, "
               f"Python {self.ray_python or '?'})" if self.ray_path else "no ray")
        vllm = f"vllm {self.vllm_version or '?'}" if self.vllm_path else "no vllm"
        if self.vllm_path and self.vllm_python:
            vllm += f" (Python {self.vllm_python})"
        return f"{ray}, {vllm}" if uses_ray else vllm


@dataclass(frozen=True)
class Throughput:
    """One measurement of the served model's speed (perf): a fixed prompt, a fixed number of tokens generated
    in full, streamed. ``error``: it could not be measured (no figure here is evidence then)."""

    serve: str  # ServeObservation.identity it was measured on
    ttft_s: float = 0.0  # time to the first token of the one stream
    decode_tps: float = 0.0  # tokens per second of that stream after its first token
    tokens: int = 0  # tokens it generated
    aggregate_tps: float = 0.0  # tokens per second of ``streams`` concurrent streams together (0: not measured)
    streams: int = 0
    error: str = ""
