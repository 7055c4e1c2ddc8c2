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


def test_records_are_data_that_audit_and_select_read():
    graph = drawing()
    assert not graph["reach_lens.records"] & {"reach_lens.select", "reach_lens.audit"}
    assert not graph["reach_lens.audit"] & {"reach_lens.select", "reach_lens.records"}
    assert "reach_lens.records" in graph["reach_lens.select"] and "reach_lens.audit" not in graph["reach_lens.select"]
    from reach_lens import audit

    assert not hasattr(audit, "make_record") and not hasattr(audit, "RECORD_COLUMNS")  # no re-export shims


def test_stats_audit_census_fates_layers():
    # stats knows nothing of records or studies; audit (one record table) sits below census and the RLVR fates,
    # and the fates need no training stack (only audit and stats)
    graph = drawing()
    assert not graph["reach_lens.stats"]
    assert not [m for m in graph["reach_lens.audit"] if m.startswith(("reach_lens.census", "reach_lens.rlvr"))]
    assert graph["reach_lens.census"] == graph["reach_lens.rlvr.fates"] == {"reach_lens.audit", "reach_lens.stats"}
    from reach_lens import audit

    moved = ("fates", "fate_counts", "paired_change", "crossover", "hit_rate_bins", "census_cell", "meets_criterion",
             "guesser_reach", "guessing_floor", "Rate", "repair_rate", "breakage_rate", "independence_baseline")
    assert not [name for name in moved if hasattr(audit, name)]  # each lives in one place, no re-export shims


def test_a_cycle_is_found_when_there_is_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
