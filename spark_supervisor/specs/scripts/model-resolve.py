
import hashlib, json, os, sys, time
MARK = "spark-model:"
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")

def hub_cache(download_dir):
    if download_dir:
        return download_dir
    for k in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(k):
            return os.environ[k]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(home, "hub")

def resolve(model, revision, download_dir):
    if model.startswith(("/", "./", "../", "~")) or os.path.exists(model):
        return {"source": "local", "dir": os.path.abspath(os.path.expanduser(model))}
    cache = hub_cache(download_dir)
    repo = os.path.join(cache, "models--" + model.replace("/", "--"))
    f = {"source": "hub", "cache": cache, "repo": repo, "dir": "", "ref": ""}
    snaps = os.path.join(repo, "snapshots")
    try:
        names = sorted(os.listdir(snaps))
    except OSError:
        names = []
    f["snapshots"] = names[:20]
    rev = revision or "main"
    try:
        with open(os.path.join(repo, "refs", rev)) as fh:
            f["ref"] = fh.read().strip()
    except OSError:
        pass
    for want in (f["ref"], rev):
        if want and want in names:
            f["dir"] = os.path.join(snaps, want)
            break
    else:
        if not f["ref"] and len(names) == 1:
            f["dir"] = os.path.join(snaps, names[0])
    return f
