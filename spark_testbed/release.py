"""The previous release beside the current code (`make bench-beside`): which tag it is, and a venv holding its
spark_supervisor and nothing else of its own.

The release's venv reaches the dev venv's site-packages through a `.pth` path line, so both versions run with
the very same dependencies and only spark-supervisor's own code differs. A path line does not process that
directory's own `.pth` files: the dev venv's editable finder (the checkout's spark_supervisor) stays off, and
the release imports spark_supervisor from its own site-packages (checked before the venv is used).

The venv is built from `git archive <tag>` (the work tree is never touched) and cached under
<cache_dir>/release-<tag>-<commit12>: a name that points at a finished, checked venv or does not exist. A venv
cannot be moved (its scripts name its interpreter by path), so it is built where it stays, in a directory of
its own, and the cache's name is then made a link to it in one rename.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import tomllib
from pathlib import Path
from typing import Any

# What the wheel is built from (the Makefile's BUILD_WHEEL).
WHEEL_SOURCES = ("pyproject.toml", "README.md", "spark_supervisor", "man")
GIT_TIMEOUT = 60
BUILD_TIMEOUT = 600


class NoRelease(RuntimeError):
    """No tag to compare against, or a release venv that cannot be built."""


def _git(src: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=src, capture_output=True, text=True, check=True,
                          timeout=GIT_TIMEOUT).stdout.strip()


def commit_of(src: Path, rev: str) -> str:
    """The full commit a revision (a tag, HEAD) names."""
    try:
        return _git(src, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise NoRelease(f"no commit {rev!r} in {src}") from None


def previous_release(src: Path) -> str:
    """The newest tag reachable from HEAD on another commit than HEAD's: the last tag, or when HEAD itself is
    tagged (a release being measured), the one before it."""
    head = commit_of(src, "HEAD")
    for rev in ("HEAD", "HEAD^"):
        try:
            tag = _git(src, "describe", "--tags", "--abbrev=0", rev)
        except subprocess.CalledProcessError:
            break  # no tag reachable, or HEAD has no parent
        if commit_of(src, tag) != head:
            return tag
    raise NoRelease(f"no release to compare with: no tag reachable from HEAD ({head[:12]}) in {src} other than on "
                    f"HEAD itself; pass one (--beside TAG)")


def release_config(src: Path, tag: str) -> dict[str, Any]:
    """The tag's own etc/testbed.toml (an older daemon may refuse keys added since)."""
    return tomllib.loads(_git(src, "show", f"{tag}:etc/testbed.toml"))


def release_env() -> dict[str, str]:
    """The environment to run a release's venv in: no PYTHONPATH (a checkout on it would come before the
    venv's own spark_supervisor) nor PYTHONHOME, and the working directory not put on sys.path (run from the
    checkout, `python -c` would import its spark_supervisor: PYTHONSAFEPATH, Python 3.11)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "PYTHONSAFEPATH": "1"}


def dev_site_packages() -> list[str]:
    """The running interpreter's site-packages (purelib, and platlib when it differs)."""
    paths = sysconfig.get_paths(vars={"base": sys.prefix, "platbase": sys.prefix})
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def imported_from(venv: Path) -> Path:
    """Where the venv's python imports spark_supervisor from (raises when it cannot)."""
    code = "import spark_supervisor; print(spark_supervisor.__file__)"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True,
                         timeout=GIT_TIMEOUT, env=release_env())
    return Path(out.stdout.strip())


def problem(venv: Path) -> str:
    """What is wrong with a release venv ("" when nothing): it must import spark_supervisor from its own
    site-packages, and its CLI must answer --help."""
    try:
        mine = imported_from(venv)
        if not mine.resolve().is_relative_to(venv.resolve() / "lib"):
            return f"it imports spark_supervisor from {mine}, not from its own site-packages"
        subprocess.run([str(venv / "bin" / "spark-supervisor"), "--help"], capture_output=True, check=True,
                       timeout=GIT_TIMEOUT, env=release_env())
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    return ""


def _extract(src: Path, tag: str, dest: Path) -> None:
    """The tag's wheel sources (those it has) into ``dest``, from `git archive`."""
    have = set(_git(src, "ls-tree", "--name-only", tag).splitlines())
    parts = [p for p in WHEEL_SOURCES if p in have]
    tar = subprocess.run(["git", "archive", "--format=tar", tag, *parts], cwd=src, capture_output=True, check=True,
                         timeout=GIT_TIMEOUT).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="data")


def _run(*cmd: str) -> str:
    """A build step (its output; raises when it fails), with no PYTHONPATH."""
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=BUILD_TIMEOUT,
                          env=release_env()).stdout


def _build(src: Path, tag: str, venv: Path, scratch: Path) -> None:
    """The tag's wheel built in ``scratch``, installed alone into a new venv at ``venv`` that reaches the dev
    venv's site-packages."""
    tree, wheels = scratch / "src", scratch / "wheels"
    tree.mkdir()
    _extract(src, tag, tree)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(tree))
    wheel = next(wheels.glob("spark_supervisor-*.whl"))
    python = str(venv / "bin" / "python")
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", str(wheel))
    own = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (own / "zz-spark-dev-site-packages.pth").write_text("".join(f"{p}\n" for p in dev_site_packages()))


def release_venv(src: Path, tag: str, cache_dir: Path, kind: str = "release") -> Path:
    """The bin/ of a venv holding ``tag``'s spark_supervisor (built once, then reused while it works). kind:
    "release", or "current" for HEAD's (`make bench-beside`'s current side; only the newest such venv is kept)."""
    commit = commit_of(src, tag)
    name = cache_dir / f"{kind}-{tag}-{commit[:12]}"
    if not problem(name):
        return name / "bin"
    cache_dir.mkdir(parents=True, exist_ok=True)
    venv = Path(tempfile.mkdtemp(prefix=f"{name.name}.", dir=cache_dir))  # where it stays
    venv.chmod(0o755)
    try:
        with tempfile.TemporaryDirectory(prefix="spark-release-") as scratch:
            _build(src, tag, venv, Path(scratch))
        if why := problem(venv):
            raise NoRelease(f"the venv built for {tag} at {venv}: {why}")
    except subprocess.CalledProcessError as e:
        shutil.rmtree(venv, ignore_errors=True)
        cmd = " ".join(map(str, e.cmd))
        raise NoRelease(f"building {tag}'s venv: {cmd} failed:\n{str(e.stderr)[-2000:]}") from e
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    _publish(name, venv)
    if kind == "current":
        for other in cache_dir.glob(f"{kind}-{tag}-*"):
            if other.is_symlink() and other != name:
                _unpublish(other)
    return name / "bin"


def _ours(name: Path) -> Path | None:
    """The venv the link ``name`` names if it is one this bench built (in the cache, named after the link)."""
    if not name.is_symlink():
        return None
    target = name.resolve()
    return target if target.parent == name.parent.resolve() and target.name.startswith(f"{name.name}.") else None


def _unpublish(name: Path) -> None:
    """A link this bench made, and the venv it names if that is one of ours."""
    old = _ours(name)
    name.unlink()
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _publish(name: Path, venv: Path) -> None:
    """``name`` made a link to the finished ``venv`` in one rename; a venv it named before is removed if it is
    one of ours (in the cache, named after ``name``), else left where it is. Something else at ``name`` is
    refused, not removed."""
    old = _ours(name)  # None for a link made by hand to elsewhere: only the link is replaced
    if name.exists() and not name.is_symlink():
        raise NoRelease(f"{name} is not a link this bench made: move it away")
    link = name.with_name(f".{venv.name}.link")
    link.unlink(missing_ok=True)
    link.symlink_to(venv.name)
    os.replace(link, name)
    if old is not None and old != venv.resolve():
        shutil.rmtree(old, ignore_errors=True)
