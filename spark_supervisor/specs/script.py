"""The fixed scripts the supervisor runs, each a file of spark_supervisor/specs/scripts/ (package data, so that
ruff and shellcheck read them): shell run as `sh -c SCRIPT NAME ARGS...` with every input a positional
parameter, and Python run by the image's interpreter (`-c`). Read once, when the module that runs them is
imported; a script is its file's text exactly (no newline added or taken away)."""

from __future__ import annotations

from importlib import resources


def load(name: str) -> str:
    """The text of spark_supervisor/specs/scripts/<name>."""
    return (resources.files(__package__) / "scripts" / name).read_bytes().decode("utf-8")
