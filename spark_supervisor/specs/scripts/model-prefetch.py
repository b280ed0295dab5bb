
model, revision, download_dir, source, timeout, keep, PROGRESS = sys.argv[1:8]
deadline = time.monotonic() + float(timeout)
state = {"state": "running", "source": source or "hub", "target": "", "files_done": 0, "files_total": 0,
         "bytes_done": 0, "bytes_total": 0, "current": "", "error": ""}
last = [0.0]

def save(force=False):
    if not force and time.monotonic() - last[0] < 1:
        return
    last[0] = time.monotonic()
    tmp = PROGRESS + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, PROGRESS)

def late():
    if time.monotonic() > deadline:
        raise TimeoutError(f"not done after {float(timeout):.0f}s")

def room(path, need):
    """Refused before the first byte: a copy that fills the node's disk would hurt what runs there."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    st = os.statvfs(path or "/")
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise OSError(f"no room in {path}: {need:,} bytes to fetch, {free:,} free")

def have(path, size):
    return os.path.isfile(path) and os.stat(path).st_size == size

def copy_tree(src, dst):
    items = []
    for root, dirs, files in os.walk(src, followlinks=True):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        for n in sorted(files):
            if not n.startswith(".") and not n.endswith(".spark-partial"):
                p = os.path.join(root, n)
                items.append((os.path.relpath(p, src), os.stat(p).st_size))
    state["files_total"], state["bytes_total"] = len(items), sum(s for _, s in items)
    save(True)
    room(dst, sum(n for rel, n in items if not have(os.path.join(dst, rel), n)))
    for rel, n in items:
        out = os.path.join(dst, rel)
        if have(out, n):
            state["files_done"] += 1
            state["bytes_done"] += n
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        state["current"] = rel
        save(True)  # at each file: its reading may be slow to start (a network filesystem)
        part = out + ".spark-partial"
        with open(os.path.join(src, rel), "rb") as r, open(part, "wb") as w:
            while True:
                late()
                b = r.read(8 << 20)
                if not b:
                    break
                w.write(b)
                state["bytes_done"] += len(b)
                save()
        if os.path.lexists(out):
            os.unlink(out)  # a dangling link into blobs/ or a short file
        os.replace(part, out)
        state["files_done"] += 1
        save()

def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for n in files:
            try:
                total += os.lstat(os.path.join(root, n)).st_size
            except OSError:
                pass
    return total

try:
    f = resolve(model, revision, download_dir)
    if source:
        if not os.path.isdir(source):
            raise FileNotFoundError(f"{source} is not a directory in the image (mount it with deployments.ray.volumes)")
        if f["source"] == "local":
            dst = f["dir"]
        else:
            dst = f["dir"]
            if not dst:
                listing = sorted(os.path.relpath(os.path.join(r, n), source) for r, _, ns in os.walk(source) for n in ns)
                commit = hashlib.sha1(("\n".join([source, *listing])).encode()).hexdigest()
                dst = os.path.join(f["repo"], "snapshots", revision or commit)
                os.makedirs(os.path.join(f["repo"], "refs"), exist_ok=True)
                with open(os.path.join(f["repo"], "refs", revision or "main"), "w") as fh:
                    fh.write(revision or commit)
        state["target"] = dst
        copy_tree(source, dst)
    else:
        import threading
        from huggingface_hub import HfApi, snapshot_download
        kw = {"local_dir": f["dir"]} if f["source"] == "local" else {"cache_dir": f["cache"]}
        state["target"] = f["dir"] or f["repo"]
        try:  # the repo's size, when the hub tells it: unknown is no refusal (the download fails by itself)
            info = HfApi().model_info(model, revision=revision or None, files_metadata=True)
            sizes = [s.size or 0 for s in info.siblings or []]
        except Exception:
            sizes = []
        if sizes:
            state["files_total"], state["bytes_total"] = len(sizes), sum(sizes)
            room(state["target"], sum(sizes) - du(state["target"]))
        err = []
        def go():
            try:
                snapshot_download(model, revision=revision or None, **kw)
            except Exception as e:
                err.append(e)
        t = threading.Thread(target=go, daemon=True)
        t.start()
        while t.is_alive():
            t.join(2)
            state["bytes_done"] = du(state["target"])
            save()
            late()
        if err:
            raise err[0]
    state["state"] = "done"
except Exception as e:
    state["state"], state["error"] = "failed", f"{type(e).__name__}: {e}"[:300]
# Kept for the daemon to read the result: until it stops the container (SIGTERM, which PID 1 would otherwise
# ignore until docker's kill) or, at most, `keep` seconds, so that a forgotten one ends on its own. Blocked
# before the result is written: a stop sent the moment it is read ends the wait, not the process by signal.
import signal
ends = {signal.SIGTERM, signal.SIGINT}
signal.pthread_sigmask(signal.SIG_BLOCK, ends)
save(True)
signal.sigtimedwait(ends, float(keep))
