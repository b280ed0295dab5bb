"""The package's layout holds (issues 21, 43): every module sits in a layer and imports only down the layers
(LAYERS), no import cycle among its modules, no module over MAX_MODULE_LINES lines, no class over
MAX_CLASS_LINES. Read from the sources with `ast`, nothing imported.

An import cycle counts every import of a package module, at module level, inside a function (a lazy
import only moves the cycle to run time) or under `if TYPE_CHECKING:` (never run, but two modules that
need each other's names, even for annotations only, are one module in two files). Importing a.b.c runs
the packages a and a.b first, so those count too, unless the importer is inside them already.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "spark_supervisor"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 250

# Modules and classes let over a limit, each with why. Nothing is today. An entry must still be over its limit
# (an entry that is not fails the test: take it out), so this list only shrinks. Paths are relative to the
# package.
LONG_MODULES: dict[str, str] = {}
LONG_CLASSES: dict[str, str] = {}

# The layers, lowest first: a module imports the modules of its own package and those of the packages in
# layers below its own, never one beside or above it. A path says its layer (docs/architecture.md has
# the table with what each holds). The top level holds no module but the package's own two: a new module
# goes into the layer whose imports it needs.
LAYERS: list[set[str]] = [
    {"base", "model"},    # 0 what everything uses: bounded files, redaction; the vocabulary (data only)
    {"config"},           # 1 the config, its per-deployment view and the names of what it owns
    {"state", "adapters"},  # 2 the state directory; the I/O adapters (Docker, SSH, HTTP, sysfs)
    {"specs"},            # 3 the argument lists and container specs, the fixed scripts
    {"judge"},            # 4 pure judgements of what was read
    {"world", "plan"},    # 5 observe and act on the nodes; the pure decision table
    {"report"},           # 6 metrics, alerts, systemd, the journal, the status document, the record
    {"reconcile"},        # 7 one deployment's state machine
    {"change"},           # 8 a config change: classify, prove, roll back
    {"loop"},             # 9 the process: the daemon, its stack, reloads
    {"cli"},              # 10 the commands
    {"__main__"},         # 11 `python -m spark_supervisor`
]
TOP_LEVEL = {"__init__.py", "__main__.py"}

# Imports that go up or sideways today, importer -> imported, each with why; an entry that no longer does
# fails the test (take it out), so this list only shrinks. It is to end empty.
UPWARD: dict[tuple[str, str], str] = {}


def modules() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the package (a package is its __init__). A file
    in a directory that is not a package (scripts/: the Python run in the image) is none."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        dirs = [d for d in [path.parent, *path.parent.parents] if d.is_relative_to(ROOT)]
        if not all((d / "__init__.py").exists() for d in dirs):
            continue
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (under `if TYPE_CHECKING:` too)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module `name` (in `path`) imports, directly or as the packages around them."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
            continue
        if node.level:
            base = package.split(".")
            base = base[:len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        targets.add(origin)
        targets.update(f"{origin}.{a.name}" for a in node.names)  # `from . import x`: x may be a module
    edges = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):  # a.b.c runs a and a.b first
            up = ".".join(parts[:i])
            if up in known and up != name and not (name + ".").startswith(up + "."):
                edges.add(up)
    return edges


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; a module that
    imports itself is one too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle() -> None:
    found = cycles(graph())
    assert not found, "import cycles, each among: " + "; ".join(", ".join(c) for c in found)


def test_cycles_are_found_and_named() -> None:
    # The check itself: a cycle through a lazy import, and one through a package's __init__.
    edges = {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": set(), "p": {"p.d"}, "p.d": {"p.e"}, "p.e": {"p"}}
    assert cycles(edges) == [["p", "p.d", "p.e"], ["p.a", "p.b"]]


def test_imports_are_read_at_every_depth(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nfrom . import a\nif TYPE_CHECKING:\n    from .b import B\n"
                   "def f():\n    from .c import x\n    import spark_supervisor.d\n    from .q.r import y\n")
    known = {f"{PACKAGE}.{m}" for m in ("a", "b", "c", "d", "m", "q", "q.r")} | {PACKAGE}
    # not the package it is in (already running), but q, the package around q.r, and TYPE_CHECKING's b
    assert imported(f"{PACKAGE}.m", src, known) == {f"{PACKAGE}.{m}" for m in ("a", "b", "c", "d", "q", "q.r")}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def module_lines() -> dict[str, int]:
    return {_rel(p): len(p.read_text().splitlines()) for p in modules().values()}


def class_lines() -> dict[str, int]:
    sizes = {}
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                sizes[f"{_rel(path)}:{node.name}"] = (node.end_lineno or node.lineno) - start + 1
    return sizes


@pytest.mark.parametrize(("what", "sizes", "limit", "allowed"), [
    ("module", module_lines, MAX_MODULE_LINES, LONG_MODULES),
    ("class", class_lines, MAX_CLASS_LINES, LONG_CLASSES),
])
def test_sizes(what: str, sizes: object, limit: int, allowed: dict[str, str]) -> None:
    assert callable(sizes)
    got: dict[str, int] = sizes()
    over = {k: n for k, n in got.items() if n > limit}
    new = {k: n for k, n in over.items() if k not in allowed}
    assert not new, f"{what}s over {limit} lines (split them): {new}"
    done = sorted(k for k in allowed if k not in over)
    assert not done, f"no longer over {limit} lines: take them out of the allow-list: {done}"


def _layer(module: str) -> str:
    """The layer's package of a module of the package ("" for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward(edges: dict[str, set[str]], layers: list[set[str]]) -> set[tuple[str, str]]:
    """The imports (importer, imported; names relative to the package) that do not go down the layers: to a
    package beside the importer's in its layer or above it. A module of no layer is an error of its own."""
    tier = {package: i for i, layer in enumerate(layers) for package in layer}
    found = set()
    for importer, targets in edges.items():
        for target in targets:
            a, b = _layer(importer), _layer(target)
            if a == b or not b:
                continue
            if tier[a] <= tier[b]:
                found.add((importer.partition(".")[2], target.partition(".")[2]))
    return found


def test_every_module_is_in_a_layer() -> None:
    placed = {package for layer in LAYERS for package in layer}
    loose = sorted({_layer(m) for m in modules()} - placed - {""})
    assert not loose, f"packages or top-level modules in no layer (put them in LAYERS, or into a layer): {loose}"
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert set(top) <= TOP_LEVEL, f"modules at the top level (move them into their layer's package): {top}"


def test_imports_go_down_the_layers() -> None:
    # each import named by the module it reaches, not also by the packages it runs on the way
    deepest = {m: {t for t in ts if not any(o.startswith(t + ".") for o in ts)} for m, ts in graph().items()}
    found = upward(deepest, LAYERS)
    new = sorted(found - set(UPWARD))
    assert not new, "imports up or beside the layers (move the code down, or the name to the layer both use): " + \
        "; ".join(f"{a} -> {b}" for a, b in new)
    done = sorted(set(UPWARD) - found)
    assert not done, f"no longer up the layers: take them out of UPWARD: {done}"


def test_upward_imports_are_found() -> None:
    # The check itself: down is fine, beside and up are not, a package's own modules import each other.
    layers = [{"a", "b"}, {"c"}]
    edges = {"p.c.x": {"p.a", "p.a.y", "p.c.z"}, "p.a.y": {"p.b.w", "p.c"}, "p.c.z": {"p.c.x"}}
    assert upward(edges, layers) == {("a.y", "b.w"), ("a.y", "c")}


# A module that became a package keeps its old way in: `python -m spark_supervisor.cli` worked when cli was
# one module (operators and the testbed's chaos still run it), so the package has a __main__.py.
@pytest.mark.parametrize("module", ["spark_supervisor", "spark_supervisor.cli"])
def test_python_m_runs_the_command(module: str) -> None:
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT.parent)
    assert out.returncode == 0 and "spark-supervisor" in out.stdout, out.stderr


def test_state_file_names_are_named_once() -> None:
    """A state directory's file names are string constants of state/names.py only: a list elsewhere drifts (the
    planted-file check once missed two files its own list forgot)."""
    from spark_supervisor.state import names
    named = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    found = sorted(f"{_rel(path)}:{node.lineno} {node.value!r}" for path in modules().values()
                   if path != ROOT / "state" / "names.py"
                   for node in ast.walk(ast.parse(path.read_text(), str(path)))
                   if isinstance(node, ast.Constant) and node.value in named)
    assert len(named) > 10 and not found, f"state file names outside state/names.py (use its constants): {found}"


# Parameters and return types annotated `Any` exactly, in the package's function signatures: none is left. What
# a function walks with isinstance is `object`, a JSON value model.document.JSON, a callback its Callable. The
# ceiling only goes down: lower it when you remove one, never raise it to let one in.
ANY_CEILING = 0


def bare_any() -> list[str]:
    """Each signature's bare `Any` (a parameter, *args, **kwargs or the return) as "path:line function name";
    `Any | None` counts too. Not the in-container Python of specs/scripts/, which mypy does not read."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.is_relative_to(ROOT / "specs" / "scripts"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = node.args
            named = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]
            for name, ann in [*((x.arg, x.annotation) for x in named), ("<return>", node.returns)]:
                if ann is not None and ((isinstance(ann, ast.Name) and ann.id == "Any")
                                        or ast.unparse(ann) == "Any | None"):
                    found.append(f"{_rel(path)}:{node.lineno} {node.name} {name}")
    return found


def test_any_in_signatures_stays_below_its_ceiling() -> None:
    found = bare_any()
    assert len(found) <= ANY_CEILING, (f"{len(found)} bare `Any` in signatures, over the ceiling of {ANY_CEILING} "
                                       "(give each its type: object where the body narrows it): " + "; ".join(found))
