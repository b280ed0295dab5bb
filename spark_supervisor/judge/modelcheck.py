"""The model on every node before the load: found now, not by a failed 15-minute load or stall timeouts.

``deployments.serve.model`` is a directory, or a Hugging Face repo id looked up in the hub cache
(``--download-dir``, else ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``;
``models--Org--Name/snapshots/<rev>/`` through ``refs/<revision>``, or the only snapshot). The probe
(``PROBE_PY``) runs in a short-lived container of the deployment's image with the node container's mounts
and environment, so it sees the paths vLLM will see, and prints what it found as one JSON line; ``judge``
decides here, pure: ``config.json``, the weights index readable, every shard it names present (a dangling
link into ``blobs/`` is missing), none empty, their sum at least the index's ``metadata.total_size``; or,
without an index, a ``model.safetensors`` (or other weight files).

``PREFETCH_PY`` fills a node that lacks the model, in a detached container of the image: a copy from a
directory the image sees (``[deployments.model] prefetch_from``) or a download from the hub, writing its
progress to a file that the supervisor reads while it runs.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from ..base import redaction
from ..config import Config, Deployment, deployment_secrets
from ..model import Kind, ModelReport
from ..specs.modelprobe import MARK

SHOWN = 3  # missing files named in a reason, then "and N more"


# ----------------------------------------------------------------------------------------------- parsing
class ProbeError(ValueError):
    """The probe's output is not what it prints: the check could not be made (unknown, not missing)."""


def parse(out: str) -> dict[str, Any]:
    """PROBE_PY's line (the last one marked). {"no_python": True} when the image has no Python."""
    lines = [ln[len(MARK):].strip() for ln in out.splitlines() if ln.startswith(MARK)]
    if not lines:
        raise ProbeError(f"no result in its output: {out.strip()[-200:]!r}")
    if lines[-1] == "no-python":
        return {"no_python": True}
    try:
        facts = json.loads(lines[-1])
    except ValueError as e:
        raise ProbeError(f"unreadable result ({e}): {lines[-1][:200]!r}") from None
    if not isinstance(facts, dict) or facts.get("source") not in ("local", "hub"):
        raise ProbeError(f"unexpected result: {lines[-1][:200]!r}")
    return facts


_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _size_problem(name: str, size: object) -> str:
    if not isinstance(size, int) or size == -1:
        return name
    if size == -2:
        return f"{name} (dangling link)"
    if size == -3:
        return f"{name} (a directory)"
    if size == 0:
        return f"{name} (0 bytes)"
    return ""


def _not_in_cache(node: str, model: str, check_key: str, facts: dict[str, Any]) -> ModelReport:
    """A hub model whose snapshot the probe did not find: which part of the cache is missing."""
    cache, snaps = facts.get("cache", "?"), facts.get("snapshots") or []
    repo = posixpath.basename(str(facts.get("repo", "")))
    if not snaps:
        missing = f"{model} is not in the hub cache {cache} (no {repo}/snapshots)"
    elif facts.get("ref"):
        missing = f"snapshot {facts['ref']} named by {repo}/refs is not in {repo}/snapshots"
    else:
        missing = f"{repo}/refs/main (and {len(snaps)} snapshots: which one?)"
    return ModelReport(node, model, check_key, path=str(facts.get("repo", "")), source="hub",
                       cache=str(cache), missing=(missing,))


def judge(node: str, model: str, check_key: str, facts: dict[str, Any]) -> ModelReport:
    """What the probe found, judged: the files missing or implausible (none: complete)."""
    if facts.get("no_python"):
        return ModelReport(node, model, check_key, unchecked="no Python in the image to look with")
    source, path = facts["source"], str(facts.get("dir") or "")
    missing: list[str] = []
    files = nbytes = 0
    sizes: dict[str, int] = {}
    if source == "hub" and not path:
        return _not_in_cache(node, model, check_key, facts)
    kind = facts.get("kind")
    if kind == "none":
        missing.append(f"{path} (no such directory)" if source == "local" else f"{path} (not a directory)")
    elif kind == "file":  # one file (GGUF)
        p = _size_problem(posixpath.basename(path), facts.get("size"))
        missing += [p] if p else []
        files, nbytes = (0, 0) if p else (1, int(facts.get("size", 0)))
    else:
        listed: dict[str, Any] = facts.get("files") or {}
        if facts.get("list_error"):
            missing.append(f"{path} (unreadable: {facts['list_error']})")
        if not any(listed.get(c, -1) >= 0 for c in ("config.json", "params.json")):
            missing.append(_size_problem("config.json", listed.get("config.json", -1)))
        index = facts.get("index")
        if index is not None:
            if index.get("error") or not index.get("shards"):
                missing.append(f"{index.get('name')} (unreadable: {index.get('error') or 'no weight_map'})")
            else:
                sizes = {str(k): v for k, v in index["shards"].items() if isinstance(v, int)}
                for shard, size in index["shards"].items():
                    p = _size_problem(shard, size)
                    if p:
                        missing.append(p)
                    else:
                        files, nbytes = files + 1, nbytes + int(size)
                total = index.get("total_size")
                if (isinstance(total, int | float) and not missing and total > 0
                        and nbytes < 0.99 * total):  # headers make the files a little larger than the tensors
                    missing.append(f"shards hold {nbytes:,} bytes, less than the index's total_size {int(total):,} "
                                   "(truncated)")
        else:
            weights = {n: s for n, s in listed.items() if n.endswith(_WEIGHTS)}
            sizes = {n: s for n, s in weights.items() if isinstance(s, int)}
            good = {n: s for n, s in weights.items() if isinstance(s, int) and s > 0}
            if "model.safetensors" in weights and "model.safetensors" not in good:
                missing.append(_size_problem("model.safetensors", weights["model.safetensors"]))
            elif not good:
                missing += ([_size_problem(n, s) for n, s in sorted(weights.items())]
                            or ["model.safetensors (no weights index, no weight files)"])
            files, nbytes = len(good), sum(good.values())
    revision = posixpath.basename(path) if source == "hub" and "/snapshots/" in path else ""
    return ModelReport(node, model, check_key, path=path, source=source, cache=str(facts.get("cache", "")),
                       missing=tuple(m for m in missing if m), files=files, bytes=nbytes, revision=revision,
                       config_sha256=str(facts.get("config_sha256") or ""), sizes=tuple(sorted(sizes.items())),
                       blobs=tuple(sorted((str(k), str(v)) for k, v in (facts.get("blobs") or {}).items())),
                       disk_gb_s=_rate(facts.get("disk_gb_s")))


def _rate(v: object) -> float | None:
    """A GB/s figure the probe printed: a positive, plausible number, else not measured."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1000 else None


def parse_progress(out: str) -> dict[str, Any]:
    """The prefetch's progress file ({} while it has not written one yet)."""
    try:
        p = json.loads(out)
    except ValueError:
        return {}
    return p if isinstance(p, dict) else {}


# ------------------------------------------------------------------------------------------------ reasons
def host_path(dep: Deployment, path: str) -> str:
    """Where a path the container sees lives on the node: through the deployment's volumes ("" when on none:
    then it is inside the container, lost with it)."""
    best = ("", "")
    for src, dst, _ in dep.ray.mounts:
        dst = dst.rstrip("/") or "/"
        if (path == dst or path.startswith(dst.rstrip("/") + "/")) and len(dst) > len(best[1]):
            best = (src, dst)
    if not best[1]:
        return ""
    src, dst = best
    rest = path[len(dst):].lstrip("/") if dst != "/" else path.lstrip("/")
    where = src if src.startswith("/") else f"(volume {src})"
    return posixpath.join(where, rest) if rest else where


def _listed(items: tuple[str, ...]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def describe(cfg: Config, dep: Deployment, reports: dict[str, ModelReport]) -> str:
    """ModelMissing's detail: the nodes, their missing files (a few), and what to run to fix it."""
    bad = [m for m in reports.values() if m.missing]
    good = [m for m in reports.values() if not m.missing and not m.unchecked and m.path]
    parts = [f"{m.node}: {_listed(m.missing)}" + (f" in {m.path}" if m.found else "") for m in bad]
    text = f"{dep.serve.model} incomplete: " + "; ".join(parts)
    failed = [f"{m.node}: {m.detail}" for m in bad if m.prefetched and m.detail]
    if failed:
        text += f"; the prefetch did not complete it ({'; '.join(failed)})"
    # a prefetch's error may quote what it was given
    return redaction.text(f"{text}. Hint: {hint(dep, bad, good)}", deployment_secrets(cfg, dep))


def hint(dep: Deployment, bad: list[ModelReport], good: list[ModelReport]) -> str:
    nodes = ", ".join(m.node for m in bad)
    later = ", then `spark-supervisor reset`"
    if not dep.model.prefetch:
        later += " (or set [deployments.model] prefetch = true to have it fetched)"
    if bad and bad[0].source == "hub":
        cache = bad[0].cache
        on_host = host_path(dep, cache) if cache else ""
        rev = f" --revision {dep.serve.revision}" if dep.serve.revision else ""
        where = (f" --cache-dir {on_host}" if on_host else
                 f" --cache-dir {cache} inside {dep.ray.image} (it is on no volume: mount it in deployments.ray.volumes)"
                 if cache else "")
        copy = f", or on {good[0].node} {_copy_model(dep, bad)}" if good else ""
        return (f"on {nodes} run `hf download {dep.serve.model}{rev}{where}` (huggingface-cli download on older "
                f"huggingface_hub){copy}{later}")
    path = bad[0].path if bad else dep.serve.model
    on_host = host_path(dep, path) or path
    if good:
        src = good[0]
        src_host = host_path(dep, src.path) or src.path
        return (f"copy it from {src.node}: on {nodes} run `rsync -a {src.node}:{src_host}/ {on_host}/` (or on "
                f"{src.node} {_copy_model(dep, bad)}, which follows links){later}")
    return f"put the model at {on_host} on {nodes}{later}"


def _copy_model(dep: Deployment, bad: list[ModelReport]) -> str:
    return " and ".join(f"`spark-supervisor copy-model {dep.name} --to {m.node}`" for m in bad)


def problem(cfg: Config, dep: Deployment, reports: dict[str, ModelReport]) -> tuple[str, str] | None:
    """(reason kind, detail) when a node lacks the model, or a member's copy is not the head's, else None."""
    if any(m.missing for m in reports.values()):
        return (Kind.MODEL_MISSING, describe(cfg, dep, reports))
    members = [n.name for n in cfg.members(dep)]
    head = reports.get(members[0]) if members else None
    if head is None:
        return None
    found = {n: d for n in members[1:] if (r := reports.get(n)) is not None and (d := differences(head, r))}
    if not found:
        return None
    parts = [f"{n}: {_listed(tuple(d))}" for n, d in found.items()]
    copy = _copy_model(dep, [r for n, r in reports.items() if n in found])
    return (Kind.MODEL_COPY_DIFFERS, f"{'; '.join(parts)} ({dep.serve.model}, as {head.node} has it in {head.path}). "
            f"Hint: on {head.node} run {copy} (it sends only the files that differ and checks each one's size "
            "and sha256), then `spark-supervisor reset`")


def size_text(n: int) -> str:
    """A size as an operator reads it (binary units, one decimal)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _two_sizes(got: int, want: int) -> tuple[str, str]:
    """Both sizes, exact when rounding would show them equal (a shard a few bytes short)."""
    a, b = size_text(got), size_text(want)
    return (a, b) if a != b else (f"{got:,} B", f"{want:,} B")


def differences(head: ModelReport, other: ModelReport) -> list[str]:
    """How a member's model differs from the head's, each "name what, head what": a weight file of another size (a
    truncated copy) or absent, a file whose hub blob (an LFS file's sha256) is another. Only between two complete reports: a missing file is ModelMissing's to name. Sizes and blob names
    only, as the check reads them on every start: the content is hashed by `copy-model`, not here."""
    if not (head.found and other.found) or head.missing or other.missing or head.unchecked or other.unchecked:
        return []
    # Another snapshot name alone is not a difference: a prefetch from a plain directory names its own.
    out: list[str] = []
    mine, theirs = dict(other.sizes), dict(head.sizes)
    for name, want in theirs.items():
        got = mine.get(name)
        if got is None:
            out.append(f"{name} absent, head {size_text(want)}")
        elif got != want:
            a, b = _two_sizes(got, want)
            out.append(f"{name} {a}, head {b}")
    # A weight file only the member has (a training_args.bin, an older shard) is not what vLLM loads when the head's
    # index does not name it, and copy-model leaves it in place: not a difference, or the fix would never clear it.
    blobs = dict(head.blobs)
    out += [f"{name} blob {blob[:12]}…, head {blobs[name][:12]}… (another content, same size)"
            for name, blob in other.blobs if name in blobs and blob != blobs[name]
            and mine.get(name) == theirs.get(name)]
    return out
