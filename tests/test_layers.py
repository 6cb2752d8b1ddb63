"""The layers point one way: every import of every module (those inside functions and under TYPE_CHECKING
included) goes to a lower layer, so the instruments never see the trainer and no two subpackages import
each other. docs/architecture.md draws the same layers."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rlgrad"

# Lowest first. A unit (a top-level module or subpackage of rlgrad) may import only units of LOWER layers
# (and itself): siblings of one layer never import each other.
LAYERS = [
    {"errors"},
    {"config"},  # the settings, every list of allowed values, the instruments' step rule
    {"envs", "batch", "collectives", "metrics", "runfiles"},  # leaves: torch / numpy / stdlib (+ errors, config)
    {"algos"},  # the RL math: aggregation, advantages, KL, log-probs, the clipped losses, the actor objective
    {"tasks", "logging", "models", "distributed"},  # data and rewards, sinks, models, processes
    {"hooks", "rundata"},  # the hook contract | the one reader of run files
    {"analysis", "rl", "doctor"},  # the instruments | the trainer | the doctor: independent of each other
    {"viz"},  # figures and the report (the doctor's findings head it)
    {"recipes", "integrations", "loss", "core"},  # trainer + instruments composed | inside TRL and verl | old paths
    {"cli"},
    {"__main__", "__init__"},
]
RANK = {unit: k for k, layer in enumerate(LAYERS) for unit in layer}
# Lower, but still out of bounds: the instruments see a batch, a model and a loss, never the processes,
# the models' loading or the tasks; the figures read run files only.
FORBIDDEN = {("analysis", u) for u in ("distributed", "models", "tasks")} | {
    (reader, u) for reader in ("viz", "doctor")
    for u in ("algos", "models", "distributed", "hooks", "tasks", "collectives", "batch")}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(source: str, module: str) -> set[str]:
    """Every rlgrad module ``source`` imports, wherever the import statement sits."""
    out = set()
    package = module if (SRC.parent / module.replace(".", "/") / "__init__.py").exists() else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "rlgrad"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package up
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] != "rlgrad":
                continue
            for a in node.names:  # `from rlgrad import collectives` imports the module rlgrad.collectives
                sub = f"{base}.{a.name}"
                is_module = (SRC.parent / sub.replace(".", "/")).with_suffix(".py").exists() or (
                    SRC.parent / sub.replace(".", "/") / "__init__.py").exists()
                out.add(sub if is_module else base)
    return out


def all_edges() -> list[tuple[str, str]]:
    edges = []
    for path in sorted(SRC.rglob("*.py")):
        mod = module_name(path)
        edges += [(mod, imp) for imp in sorted(imports_of(path.read_text(), mod))]
    return edges


def violations(edges: list[tuple[str, str]]) -> list[str]:
    """Edges between units that do not point down, and units missing from LAYERS."""
    bad = []
    for src, dst in edges:
        a, b = unit_of(src), unit_of(dst)
        if a == b or b == "__init__":
            continue
        if a not in RANK or b not in RANK:
            bad.append(f"{src} -> {dst}: unit {a if a not in RANK else b} is in no layer")
        elif RANK[b] >= RANK[a]:
            bad.append(f"{src} -> {dst}: {b} (layer {RANK[b]}) is not below {a} (layer {RANK[a]})")
        elif (a, b) in FORBIDDEN:
            bad.append(f"{src} -> {dst}: {a} must not depend on {b}")
    return bad


def unit_cycles(edges: list[tuple[str, str]]) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        a, b = unit_of(src), unit_of(dst)
        if a != b:
            graph.setdefault(a, set()).add(b)
    cycles, state = [], {}

    def visit(u: str, path: list[str]) -> None:
        state[u] = 1
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                cycles.append(path[path.index(v):] + [v])
            elif v not in state:
                visit(v, path + [v])
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u, [u])
    return cycles


def test_every_import_points_down_and_no_subpackages_import_each_other():
    edges = all_edges()
    assert len(edges) > 50  # the parser found the imports (the check is not vacuous)
    assert not violations(edges), "\n".join(violations(edges))
    assert not unit_cycles(edges)


def test_the_check_fails_on_an_upward_import_added_back():
    source = (SRC / "analysis" / "buckets.py").read_text() + (
        "\n\ndef _later():\n    from rlgrad.rl.trainer import Trainer\n    return Trainer\n")
    edges = all_edges() + [("rlgrad.analysis.buckets", imp)
                           for imp in imports_of(source, "rlgrad.analysis.buckets")]
    found = violations(edges)
    assert any("rlgrad.analysis.buckets -> rlgrad.rl.trainer" in v for v in found)
    # an instrument importing the loss math goes down: allowed; the trainer importing an instrument is not
    assert not violations([("rlgrad.analysis.engine", "rlgrad.algos.objective")])
    assert violations([("rlgrad.rl.trainer", "rlgrad.analysis")])
    assert unit_cycles([("rlgrad.rl.actor", "rlgrad.analysis.dist"), ("rlgrad.analysis.x", "rlgrad.rl.core")])
    # lower but out of bounds: an instrument reaching for the processes, the figures for the loss math
    assert violations([("rlgrad.analysis.neurons", "rlgrad.distributed")])
    assert violations([("rlgrad.rundata", "rlgrad.loss")])


def test_relative_and_package_imports_resolve():
    src = "from rlgrad import collectives\nfrom rlgrad import rundata as D\nimport rlgrad.algos.kl\n"
    assert imports_of(src, "rlgrad.analysis.engine") == {"rlgrad.collectives", "rlgrad.rundata", "rlgrad.algos.kl"}
    assert imports_of("from .engine import slice_gradients\n", "rlgrad.analysis.neurons") == {
        "rlgrad.analysis.engine"}


def test_no_source_file_over_600_lines_and_no_function_over_80():
    too_long = []
    for path in sorted(SRC.rglob("*.py")):
        source = path.read_text()
        if len(source.splitlines()) > 600:
            too_long.append(f"{path.relative_to(SRC)}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 80:
                too_long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}: "
                                f"{node.end_lineno - node.lineno + 1} lines")
    assert not too_long, "\n".join(too_long)
