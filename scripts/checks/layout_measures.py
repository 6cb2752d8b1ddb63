"""The layout's measures (issue 30, "Verified by"), for any checkout of rlgrad:

    python scripts/checks/layout_measures.py                          # this checkout's src/rlgrad
    python scripts/checks/layout_measures.py --src /other/checkout    # a checkout, its src/ or its src/rlgrad

Prints: the modules at the package root, the files per package, the longest import chain between modules
(all imports, and those that run at import time), module-level import loops, upward imports and loops between
units against the measured checkout's own layer rules, the largest file in lines of code (lines holding only
string literals (docstrings among them), comments and blank lines left out), the most complex functions (ruff's C901 /
PLR0912 / PLR0915 numbers), and the share of source lines over 100 characters.

Imports are read by tests/test_layers.py's parser (this checkout's, loaded by path and pointed at the measured
source), so the measures and the layer test see the same edges, and lines of code are counted by its code_lines
(the file budget's counter). The layer rules (LAYERS, FORBIDDEN) are the
measured checkout's own tests/test_layers.py where it has one: an older checkout is judged by its own layers.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
LONG = 100  # a source line longer than this many characters counts as long
TOP = 5  # how many of the largest files and most complex functions to list


# ---------------------------------------------------------------- finding the source and the parser


def resolve_src(arg: str | None) -> Path:
    """``src/rlgrad`` of a checkout given as the checkout, its ``src`` or the package itself."""
    if arg is None:
        return ROOT / "src" / "rlgrad"
    p = Path(arg).expanduser().resolve()
    for cand in (p, p / "rlgrad", p / "src" / "rlgrad"):
        if cand.name == "rlgrad" and (cand / "__init__.py").exists():
            return cand
    sys.exit(f"layout_measures: no rlgrad package at {arg} (give a checkout, its src/ or src/rlgrad)")


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layer_modules(src: Path) -> tuple[ModuleType, ModuleType, Path, Path]:
    """The parser (this checkout's tests/test_layers.py, else the measured one's) and the layer rules (the
    measured checkout's, else this one's), both pointed at ``src``."""
    here = ROOT / "tests" / "test_layers.py"
    there = src.parents[1] / "tests" / "test_layers.py"
    parser_path = here if here.exists() else there
    rules_path = there if there.exists() else here
    if not parser_path.exists():
        sys.exit("layout_measures: no tests/test_layers.py here or beside the measured source")
    parser = load_module(parser_path, "_layers_parser")
    rules = parser if rules_path == parser_path else load_module(rules_path, "_layers_rules")
    for m in (parser, rules):
        m.SRC = src  # the functions read the module global at call time
    return parser, rules, parser_path, rules_path


# ---------------------------------------------------------------- the import graph


def top_level_source(source: str) -> str:
    """Only the import statements that run when the module is imported: those at module level, in module-level
    ``try`` / ``if`` blocks, but not under ``if TYPE_CHECKING`` nor inside functions or classes' methods."""
    keep: list[ast.stmt] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                keep.append(node)
            elif isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                    visit(part)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)  # a class body runs at import time (its methods do not)

    visit(ast.parse(source).body)
    return "\n".join(ast.unparse(n) for n in keep)


def module_graph(parser: ModuleType, src: Path, import_time_only: bool) -> dict[str, set[str]]:
    """Module -> the rlgrad modules it imports (explicit imports only: the parent packages Python runs on the
    way are not edges). Targets that are no module file (a namespace package) are dropped."""
    files = sorted(src.rglob("*.py"))
    modules = {parser.module_name(p): p for p in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        source = path.read_text()
        if import_time_only:
            source = top_level_source(source)
        graph[mod] = {t for t in parser.imports_of(source, mod) if t in modules and t != mod}
    return graph


def finish_order(graph: dict[str, set[str]]) -> list[str]:
    """Modules in the order a depth-first search finishes them (iterative: no recursion limit)."""
    seen: set[str] = set()
    order: list[str] = []
    for root in sorted(graph):
        if root in seen:
            continue
        seen.add(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            v, children = work[-1]
            w = next((c for c in children if c not in seen), None)
            if w is None:
                order.append(v)
                work.pop()
            else:
                seen.add(w)
                work.append((w, iter(sorted(graph[w]))))
    return order


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Kosaraju), each sorted, every component after those it imports."""
    reverse: dict[str, set[str]] = {m: set() for m in graph}
    for u, targets in graph.items():
        for v in targets:
            reverse[v].add(u)
    comp_of: dict[str, int] = {}
    comps: list[list[str]] = []
    for root in reversed(finish_order(graph)):  # importers first: a component before the ones it imports
        if root in comp_of:
            continue
        comp_of[root] = len(comps)
        members, todo = [root], [root]
        while todo:
            for u in reverse[todo.pop()]:
                if u not in comp_of:
                    comp_of[u] = len(comps)
                    members.append(u)
                    todo.append(u)
        comps.append(sorted(members))
    return comps[::-1]


def longest_chain(graph: dict[str, set[str]]) -> tuple[list[str], list[list[str]]]:
    """The longest import chain (importer first), found on the condensation of the graph (every import loop one
    node, so the search ends), and the loops. Where no loop lies on it, the chain is a simple path of modules."""
    comps = sccs(graph)
    comp_of = {m: k for k, comp in enumerate(comps) for m in comp}
    succ: dict[int, set[int]] = {k: set() for k in range(len(comps))}
    for u, targets in graph.items():
        succ[comp_of[u]] |= {comp_of[v] for v in targets if comp_of[v] != comp_of[u]}
    # sccs lists every component after those it imports: each successor's chain is known before its importers'.
    best: dict[int, tuple[int, int | None]] = {}  # component -> (edges on the longest chain from it, next)
    for k in range(len(comps)):
        nxt = max(succ[k], key=lambda j: (best[j][0], -j), default=None)
        best[k] = (0 if nxt is None else best[nxt][0] + 1, nxt)
    start = max(best, key=lambda k: (best[k][0], -k))
    chain_comps = [start]
    while best[chain_comps[-1]][1] is not None:
        chain_comps.append(best[chain_comps[-1]][1])
    # One module per component, joined by real edges; where no edge leaves the module reached, the chain goes on
    # from another member of its loop (marked).
    def into(members: list[str], k: int) -> tuple[str, str] | None:
        return next(((m, v) for m in members for v in sorted(graph[m]) if comp_of[v] == k), None)

    if len(chain_comps) == 1:
        return [comps[start][0]], [c for c in comps if len(c) > 1]
    first, _ = into(comps[start], chain_comps[1])
    chain = [first]
    for k in chain_comps[1:]:
        step = into([chain[-1]], k)
        if step is None:
            step = into(comps[comp_of[chain[-1]]], k)
            chain.append(f"(loop) {step[0]}")
        chain.append(step[1])
    return chain, [c for c in comps if len(c) > 1]


# ---------------------------------------------------------------- sizes, complexity, long lines


def find_ruff() -> list[str] | None:
    for cand in (Path(sys.executable).parent / "ruff", ROOT / ".venv" / "bin" / "ruff"):
        if cand.exists():
            return [str(cand)]
    if shutil.which("ruff"):
        return [shutil.which("ruff")]
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    return None


def function_at(path: Path, row: int) -> str:
    """The name of the function defined at line ``row`` of ``path`` (ruff's PLR messages do not name it)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.lineno == row:
            return node.name
    return "?"


RUFF_RULES = {"C901": "cyclomatic complexity", "PLR0912": "branches", "PLR0915": "statements"}


def ruff_complexity(src: Path) -> dict[str, list[tuple[int, str]]] | str:
    """Per rule, every function's number (highest first) as ruff counts it with every threshold at 0."""
    ruff = find_ruff()
    if ruff is None:
        return "ruff not found (pip install ruff)"
    cmd = [*ruff, "check", "--isolated", "--no-cache", "--output-format", "json", "--select", ",".join(RUFF_RULES),
           "--config", "lint.mccabe.max-complexity = 0", "--config", "lint.pylint.max-branches = 0",
           "--config", "lint.pylint.max-statements = 0", str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    try:
        found = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return f"ruff failed: {proc.stderr.strip()[:300]}"
    out: dict[str, list[tuple[int, str]]] = {rule: [] for rule in RUFF_RULES}
    for item in found:
        rule, msg = item["code"], item["message"]
        if rule not in out or "(" not in msg:
            continue
        number = int(msg.rsplit("(", 1)[1].split()[0])  # "`fit` is too complex (23 > 0)", "Too many branches (14 > 0)"
        path, row = Path(item["filename"]), item["location"]["row"]
        name = msg.split("`")[1] if "`" in msg else function_at(path, row)
        where = f"{path.relative_to(src.parent)}:{row} {name}"
        out[rule].append((number, where))
    for rule in out:
        out[rule].sort(key=lambda t: (-t[0], t[1]))
    return out


# ---------------------------------------------------------------- the report


def rel(path: Path, src: Path) -> str:
    return str(path.relative_to(src.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", help="a checkout, its src/ or its src/rlgrad (default: this checkout's)")
    args = ap.parse_args(argv)
    src = resolve_src(args.src)
    parser, rules, parser_path, rules_path = layer_modules(src)
    files = sorted(src.rglob("*.py"))
    sources = {p: p.read_text() for p in files}

    print(f"source: {src}")
    print(f"import parser: {parser_path}; layer rules: {rules_path}")
    print(f"python files: {len(files)}")

    root_modules = sorted(p.name for p in src.glob("*.py"))
    plain = [n for n in root_modules if n not in ("__init__.py", "__main__.py")]
    print(f"\nmodules at the package root: {len(root_modules)} ({len(plain)} without __init__.py / __main__.py)")
    print("  " + " ".join(n[:-3] for n in plain))

    per_pkg = Counter(rel(p.parent, src) for p in files)
    print(f"\nfiles per package ({len(per_pkg)} packages):")
    for pkg, n in sorted(per_pkg.items()):
        print(f"  {pkg + '/':24s} {n:3d}")

    for label, import_time in (("all imports, as the layer test reads them", False),
                               ("imports that run at import time", True)):
        graph = module_graph(parser, src, import_time)
        chain, loops = longest_chain(graph)
        n_edges = sum(len(t) for t in graph.values())
        hops = len(chain) - 1  # "(loop) m": m reached inside a loop, by one import or more
        print(f"\nimport graph ({label}): {len(graph)} modules, {n_edges} edges")
        print(f"  longest import chain: {hops} imports, {hops + 1} modules"
              + (" (at least: it passes through an import loop)" if any(m.startswith("(loop)") for m in chain) else ""))
        print("    " + "\n    -> ".join(chain))
        print(f"  module-level import loops: {len(loops)}")
        for loop in loops:
            print("    " + " <-> ".join(loop))

    edges = parser.all_edges()
    bad = rules.violations(edges)
    # the rules' own circle finder: cycles(edges) since issue 44, unit_cycles(edges) before
    cycles = (rules.cycles if hasattr(rules, "cycles") else rules.unit_cycles)(edges)
    print(f"\nlayer rules ({len(rules.LAYERS)} layers): {len(edges)} import edges")
    print(f"  upward or forbidden imports: {len(bad)}")
    for line in bad:
        print("    " + line)
    print(f"  loops between units: {len(cycles)}")
    for cyc in cycles:
        print("    " + " -> ".join(cyc))

    sizes = sorted(((parser.code_lines(s), len(s.splitlines()), rel(p, src)) for p, s in sources.items()),
                   reverse=True)
    print("\nlargest files (lines of code: no docstrings or other lines of text, comments, blank lines | all lines):")
    for loc, total, name in sizes[:TOP]:
        print(f"  {loc:5d} | {total:5d}  {name}")
    print(f"  total: {sum(s[0] for s in sizes)} lines of code, {sum(s[1] for s in sizes)} lines")

    complexity = ruff_complexity(src)
    print("\nmost complex functions (ruff, every threshold at 0):")
    if isinstance(complexity, str):
        print("  " + complexity)
    else:
        for rule, found in complexity.items():
            print(f"  {rule} ({RUFF_RULES[rule]}):" + (" none" if not found else ""))
            for number, where in found[:TOP]:
                print(f"    {number:4d}  {where}")

    lines = [line for s in sources.values() for line in s.splitlines()]
    nonblank = [line for line in lines if line.strip()]
    long_lines = sum(len(line) > LONG for line in lines)
    print(f"\nlines over {LONG} characters: {long_lines} of {len(lines)} lines ({100 * long_lines / len(lines):.1f}%; "
          f"{100 * long_lines / len(nonblank):.1f}% of the {len(nonblank)} non-blank lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
