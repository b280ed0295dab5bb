"""spark-supervisor: keeps multi-node vLLM deployments serving."""

from __future__ import annotations


def version() -> str:
    """The installed distribution's version: pyproject.toml is the one place it is written."""
    from importlib import metadata  # here, not at import: `status` stays fast
    try:
        return metadata.version("spark-supervisor")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0+unknown"


def __getattr__(name: str) -> str:  # spark_supervisor.__version__, looked up only when asked for
    if name == "__version__":
        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
