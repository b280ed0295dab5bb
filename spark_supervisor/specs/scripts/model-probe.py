
def size(p):
    try:
        st = os.stat(p)
    except OSError:
        return -2 if os.path.islink(p) else -1
    return -3 if os.path.isdir(p) else st.st_size

def blob(p):
    # A link into the hub cache's blobs/: the blob's name, which for a Git LFS file is its content's sha256.
    try:
        parent, name = os.path.split(os.readlink(p))
    except OSError:
        return ""
    return name if os.path.basename(parent) == "blobs" else ""

f = resolve(*sys.argv[1:4])
d = f["dir"]
f["kind"] = "none" if not d else "file" if os.path.isfile(d) else "dir" if os.path.isdir(d) else "none"
if f["kind"] == "file":
    f["size"] = size(d)
elif f["kind"] == "dir":
    try:
        names = sorted(os.listdir(d))
    except OSError as e:
        names, f["list_error"] = [], str(e)[:200]
    f["files"] = {n: size(os.path.join(d, n)) for n in names[:MAX]}
    f["blobs"] = {}
    for n in names[:MAX]:
        b = blob(os.path.join(d, n))
        if b:
            f["blobs"][n] = b
    for name in INDEXES:
        p = os.path.join(d, name)
        if not os.path.lexists(p):
            continue
        try:
            with open(p) as fh:
                j = json.load(fh)
            shards = sorted({str(v) for v in (j.get("weight_map") or {}).values()})
            f["index"] = {"name": name, "shards": {s: size(os.path.join(d, s)) for s in shards},
                          "total_size": (j.get("metadata") or {}).get("total_size")}
        except Exception as e:
            f["index"] = {"name": name, "error": f"{type(e).__name__}: {e}"[:200]}
        break
    # What the model is, hashed for the record: a regular file only (a FIFO would hang the probe), read
    # bounded (a config is a few KiB; a bigger one is not hashed).
    for name in ("config.json", "params.json"):
        p = os.path.join(d, name)
        if not os.path.isfile(p):
            continue
        try:
            with open(p, "rb") as fh:
                raw = fh.read(1 << 22)
            if len(raw) < 1 << 22:
                f["config_sha256"] = hashlib.sha256(raw).hexdigest()
        except OSError:
            pass
        break
    # The disk's own sequential read rate, for the load's read rate to be judged against (judge.loadrate): the
    # largest weight file's first 256 MiB at most, with O_DIRECT so that the page cache (on unified memory, GPU
    # memory) neither answers nor fills, for a second at most. None: too little to read, or refused.
    weights = {n: s for n, s in f["files"].items() if n.endswith((".safetensors", ".bin", ".pt")) and s > 0}
    if weights and max(weights.values()) >= 64 << 20 and hasattr(os, "O_DIRECT"):
        import mmap
        buf, done, fd = mmap.mmap(-1, 8 << 20), 0, -1
        try:
            fd = os.open(os.path.join(d, max(weights, key=weights.get)), os.O_RDONLY | os.O_DIRECT)
            t0 = time.monotonic()
            while done < 256 << 20 and time.monotonic() - t0 < 1.0:
                n = os.readv(fd, [buf])
                if n <= 0:
                    break
                done += n
            took = time.monotonic() - t0
            if done >= 16 << 20 and took > 0:  # a slow disk (USB, NFS) is measured too: it is where it matters
                f["disk_gb_s"] = round(done / took / 1e9, 3)
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)
print(MARK + " " + json.dumps(f))
