"""Static checks of the package's structure, read from its source with `ast` (tamrun is not imported):

- no import cycle between tamrun modules;
- imports only go down the layers (`LAYERS`: each top-level package or module on a floor), at most
  MAX_TOP_LEVEL_MODULES modules at tamrun/'s top and MAX_PACKAGE_FILES in a folder;
- no private name (``_x``, not a dunder) taken from another tamrun module, by import or attribute;
- no function or method longer than MAX_FUNCTION_LINES lines;
- no reference to a file outside the repository in the package, conf/, docs/ or README.md;
- no undefined name, unused import or other pyflakes finding in tamrun/ or tests/.

Each failure lists every offender as ``path:line``.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tamrun"
MAX_FUNCTION_LINES = 60
# Paths that exist only outside the repository: the published tree must not point at them.
OUTSIDE_REFERENCES = ("DESIGN.md", "shared/specs", "../shared")
# Where the outside references are looked for (folders are searched recursively).
DOCUMENTED_TREES = ("tamrun", "conf", "docs", "README.md")
LARGEST_TEXT_FILE = 2_000_000  # bytes; larger files are data (the embedded dataset), not prose or code


# --- the package's modules ----------------------------------------------------------------------


@lru_cache(maxsize=None)
def modules() -> Dict[str, Path]:
    """Dotted module name -> source file; a package is its ``__init__.py`` under the package's name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@lru_cache(maxsize=None)
def tree(name: str) -> ast.Module:
    path = modules()[name]
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@lru_cache(maxsize=None)
def nodes(name: str) -> Tuple[ast.AST, ...]:
    """Every node of the module, at any depth (imports inside functions included)."""
    return tuple(ast.walk(tree(name)))


def where(name: str, line: int) -> str:
    return f"{modules()[name].relative_to(ROOT)}:{line}"


def is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def base_of(name: str, node: ast.ImportFrom) -> Optional[str]:
    """The absolute module an ``from ... import`` statement of module ``name`` reads from."""
    if node.level == 0:
        return node.module
    package = name.split(".") if is_package(name) else name.split(".")[:-1]
    if node.level > 1:
        package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def known(dotted: Optional[str]) -> Optional[str]:
    """The longest prefix of ``dotted`` that is a tamrun module (``tamrun.x.fn`` -> ``tamrun.x``)."""
    parts = (dotted or "").split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules():
            return candidate
    return None


@lru_cache(maxsize=None)
def imports(name: str) -> Tuple[Tuple[str, int, Optional[str]], ...]:
    """(imported tamrun module, line, imported name or None) for every import of module ``name``,
    at any depth (imports inside functions included). ``from pkg import sub`` imports the module
    ``pkg.sub`` when there is one, else the name ``sub`` of ``pkg``."""
    return tuple(_imports(name))


def _imports(name: str) -> Iterator[Tuple[str, int, Optional[str]]]:
    for node in nodes(name):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = known(alias.name)
                if target is not None and alias.name.startswith("tamrun"):
                    yield target, node.lineno, None
        elif isinstance(node, ast.ImportFrom):
            base = base_of(name, node)
            if base is None or not (base == "tamrun" or base.startswith("tamrun.")):
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules():
                    yield submodule, node.lineno, None
                elif known(base) is not None:
                    yield known(base), node.lineno, alias.name


# --- a. import cycles -----------------------------------------------------------------------------


@lru_cache(maxsize=None)
def import_graph() -> Dict[str, Dict[str, int]]:
    """module -> {imported module: line of the first such import}."""
    graph: Dict[str, Dict[str, int]] = {name: {} for name in modules()}
    for name in modules():
        for target, line, _ in imports(name):
            if target != name:
                graph[name].setdefault(target, line)
    return graph


def strongly_connected(graph: Dict[str, Dict[str, int]]) -> List[List[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def one_cycle(graph: Dict[str, Dict[str, int]], component: List[str]) -> List[str]:
    """A shortest cycle through the component's first module, staying inside the component."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node]):
                if succ == start:
                    return paths[node] + [start]
                if succ in members and succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")  # pragma: no cover


def test_no_import_cycle_between_tamrun_modules():
    graph = import_graph()
    offenders = []
    for component in strongly_connected(graph):
        cycle = one_cycle(graph, component)
        steps = "\n".join(f"      {a} -> {b}  ({where(a, graph[a][b])})" for a, b in zip(cycle, cycle[1:]))
        offenders.append(f"  modules that import each other: {', '.join(component)}\n    a cycle:\n{steps}")
    assert not offenders, ("import cycles between tamrun modules (move the shared code down a layer, or "
                           "pass it in as an argument):\n" + "\n".join(offenders))


# --- b. private names of other modules ------------------------------------------------------------


def is_private(attr: str) -> bool:
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


def module_aliases(name: str) -> Dict[str, str]:
    """Local names bound to a tamrun module anywhere in ``name`` (``import tamrun.x as m``,
    ``from tamrun import x``, ``import tamrun.x`` binds ``tamrun``)."""
    aliases = {}
    for node in nodes(name):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules():
                    aliases[alias.asname] = alias.name
                elif not alias.asname and alias.name.split(".")[0] == "tamrun":
                    aliases["tamrun"] = "tamrun"
        elif isinstance(node, ast.ImportFrom):
            base = base_of(name, node)
            for alias in node.names:
                if base and f"{base}.{alias.name}" in modules():
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
    return aliases


def dotted(node: ast.AST) -> Optional[str]:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def private_uses(name: str) -> Iterator[str]:
    for target, line, imported in imports(name):
        if imported is not None and is_private(imported) and target != name:
            yield f"{where(name, line)}  from {target} import {imported}"
    aliases = module_aliases(name)
    for node in nodes(name):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        owner = dotted(node.value)
        if owner is None or owner.split(".")[0] not in aliases:
            continue
        head, _, rest = owner.partition(".")
        module = aliases[head] + (f".{rest}" if rest else "")
        if module in modules() and module != name:
            yield f"{where(name, node.lineno)}  {owner}.{node.attr}  ({module})"


def test_no_private_name_taken_from_another_tamrun_module():
    offenders = [use for name in modules() for use in private_uses(name)]
    assert not offenders, ("private names (leading underscore) used outside their module; make them public "
                           "(and documented) or move the code that needs them:\n  " + "\n  ".join(offenders))


# --- c. long functions ----------------------------------------------------------------------------


def long_functions(name: str) -> Iterator[Tuple[int, str]]:
    """(length, 'path:line qualified_name length') of each function over the limit (the def line to
    its last line: decorators excluded, docstring included)."""

    def walk(node: ast.AST, prefix: str) -> Iterator[Tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualified = f"{prefix}{child.name}"
                length = child.end_lineno - child.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    yield length, f"{where(name, child.lineno)}  {qualified}  {length} lines"
                yield from walk(child, f"{qualified}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree(name), "")


def test_no_function_longer_than_the_limit():
    offenders = sorted((found for name in modules() for found in long_functions(name)), reverse=True)
    assert not offenders, (f"functions longer than {MAX_FUNCTION_LINES} lines (split them into named steps):\n  "
                           + "\n  ".join(text for _, text in offenders))


# --- d. references to files outside the repository ------------------------------------------------


def text_files() -> Iterator[Path]:
    for entry in DOCUMENTED_TREES:
        path = ROOT / entry
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        for candidate in candidates:
            if (candidate.is_file() and "__pycache__" not in candidate.parts
                    and candidate.stat().st_size <= LARGEST_TEXT_FILE):
                yield candidate


def test_no_reference_to_a_file_outside_the_repository():
    offenders = []
    for path in text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # an image or another binary file
        for number, line in enumerate(text.splitlines(), start=1):
            for reference in OUTSIDE_REFERENCES:
                if reference in line:
                    offenders.append(f"{path.relative_to(ROOT)}:{number}  {reference}: {line.strip()[:100]}")
    assert not offenders, ("references to files outside the repository (cite a file of the repository, e.g. "
                           "docs/architecture.md, instead):\n  " + "\n  ".join(offenders))


# --- the checks' own parsing ----------------------------------------------------------------------


def test_the_import_graph_sees_the_package():
    """Guards the checks above against passing vacuously: the package is found and its imports resolve
    (absolute, relative and inside functions)."""
    graph = import_graph()
    assert "tamrun.config.schema" in graph and "tamrun" in graph
    assert "tamrun.config.schema" in graph["tamrun.config.checks"]
    assert sum(len(targets) for targets in graph.values()) > len(graph)


def test_pyflakes_finds_nothing_in_the_package_or_the_tests():
    """pyflakes over tamrun/ and tests/: an undefined name (a line left behind by a merge) fails here,
    not only on the rare path that executes it."""
    import io

    from pyflakes.api import checkRecursive
    from pyflakes.reporter import Reporter

    out, err = io.StringIO(), io.StringIO()
    found = checkRecursive([str(PACKAGE), str(ROOT / "tests")], Reporter(out, err))
    assert found == 0 and not err.getvalue(), out.getvalue() + err.getvalue()


def test_ci_runs_exactly_the_readmes_test_command():
    """The README's second command (set up and pass the tests) is the line .ci/run executes, and it starts
    with the system packages the suite needs (.ci/system-packages, which names each one it installs)."""
    readme = (ROOT / "README.md").read_text().split("Set up and pass the tests:", 1)[1]
    command = next(line.strip() for line in readme.splitlines() if line.startswith("    "))
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == command and command.startswith("bash .ci/system-packages && ")
    packages = (ROOT / ".ci" / "system-packages").read_text()
    assert "postgresql" in packages and "chromium" in packages


# --- b. layers: imports only go down --------------------------------------------------------------

# tamrun's rooms (a top-level package or module; "__init__" is the package's own module), bottom to top.
# A module imports only from its own room or a room on a lower floor: the direction docs/architecture.md
# draws. A new room goes on the floor above everything it imports.
LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("__init__", "redact", "numbers"),  # the package's version; what is secret; a figure's digits
    ("errors",),  # tamrun's errors: field, value, fix
    ("config",),  # the typed settings, their checks, sizes and expressions
    ("data", "process", "machine"),  # the data; the process's edge; what the machine lets a run use
    ("effects",),  # the design's blocks
    ("solve",),  # the solvers
    ("memory",),  # byte formulas, the oracle, the OOM guard, the meter
    ("device",),  # the device manager, the memory timeline and report
    ("fit",),  # the dispatcher, the fitted model, prediction, evaluation
    ("pipeline",),  # the plain functions the jobs share
    ("tracking",),  # the MLflow store and run
    ("cluster",),  # joining a Ray cluster
    ("sweeps",),  # a sweep's life
    ("tco",),  # the plan and cost per machine class
    ("jobs",), ("adaptive",), ("aggregate",),  # what a run does
    ("compare",),  # a store's runs compared and registered
    ("runner",),  # one run, built from its config
    ("__main__", "bench", "hydra_plugins"),  # the entry points
)
MAX_TOP_LEVEL_MODULES = 8  # modules directly under tamrun/, __init__ and __main__ included
MAX_PACKAGE_FILES = 15  # .py files in one folder, its __init__ included
LARGER_PACKAGES = {"bench": 25}  # one module per benchmark (python -m tamrun.bench.<name>, cpu_profile included), the raw table they make (sites), the peers' children in their own environments (mstl_child: statsforecast, boost_child: mlforecast + LightGBM)


def room(name: str) -> str:
    """The room of a module: ``tamrun.solve.cg`` -> ``solve``, ``tamrun.errors`` -> ``errors``, ``tamrun`` -> ``__init__``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def floor_of() -> Dict[str, int]:
    return {name: floor for floor, rooms in enumerate(LAYERS) for name in rooms}


def test_every_room_is_on_one_floor():
    on_disk = {room(name) for name in modules()}
    listed = [name for rooms in LAYERS for name in rooms]
    assert len(listed) == len(set(listed)), "a room listed twice in LAYERS"
    assert on_disk == set(listed), (f"rooms not in LAYERS: {sorted(on_disk - set(listed))}; "
                                    f"listed but gone: {sorted(set(listed) - on_disk)}")


def test_imports_only_go_down_the_layers():
    """Every import from one room to another goes to a lower floor (LAYERS), inside functions included."""
    floor = floor_of()
    offenders = []
    for name, targets in import_graph().items():
        for target, line in targets.items():
            here, there = room(name), room(target)
            if here != there and floor[there] >= floor[here]:
                offenders.append(f"{where(name, line)}  {name} (floor {floor[here]}) imports {target} "
                                 f"(floor {floor[there]})")
    assert not offenders, "imports that do not go down the layers:\n  " + "\n  ".join(sorted(offenders))


def test_the_top_level_and_each_package_stay_small():
    top = [path.name for path in PACKAGE.glob("*.py")]
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at tamrun/'s top level: {sorted(top)}"
    crowded = {str(folder.relative_to(PACKAGE)): count for folder in PACKAGE.rglob("*") if folder.is_dir()
               for count in [len(list(folder.glob("*.py")))]
               if count > LARGER_PACKAGES.get(str(folder.relative_to(PACKAGE)), MAX_PACKAGE_FILES)}
    assert not crowded, f"folders over {MAX_PACKAGE_FILES} modules (split them by concept): {crowded}"


def test_the_layer_check_sees_a_climb():
    """Guards the layer check against passing vacuously: an import from the solvers to the runner would be
    an offender, and the real graph has imports across rooms that go down."""
    floor = floor_of()
    assert floor[room("tamrun.runner")] > floor[room("tamrun.solve.cg")]
    across = [(n, t) for n, targets in import_graph().items() for t in targets if room(n) != room(t)]
    assert len(across) > 100
