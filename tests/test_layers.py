"""The package's import drawing: every import runs down, none back up.

Read from the source (every ``import`` and ``from ... import``, those inside functions included), a module imports
another when it names it or a name defined in it; a package's ``__init__`` counts as a module of its own. The
drawing must be acyclic (so it has floors), the experiment scripts' ``cli`` is imported by no library module, and
no library module reaches for the top-level ``reach_lens`` namespace, which re-exports what a user composes.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "reach_lens"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:  # a submodule by name, else a name defined in the module
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in out if m in known and m != name}


def drawing() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_drawing_has_floors_no_import_runs_back_up():
    graph = drawing()
    assert len(graph) > 40
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_no_library_module_imports_the_scripts_cli_or_the_top_level_namespace():
    graph = drawing()
    assert not [m for m, deps in graph.items() if "reach_lens.cli" in deps]
    assert not [m for m, deps in graph.items() if "reach_lens" in deps and m != "reach_lens"]


def test_the_ground_floor_imports_nothing_above_it():
    graph = drawing()
    for ground in ("reach_lens.errors", "reach_lens.version", "reach_lens.stats", "reach_lens.logs"):
        assert graph[ground] == set(), (ground, graph[ground])
    assert graph["reach_lens.protocol"] == {"reach_lens.version"}  # plain data: the engine's facts are passed in
    assert graph["reach_lens.store"] <= {"reach_lens.errors", "reach_lens.protocol"}


def test_a_cycle_is_found_when_there_is_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
