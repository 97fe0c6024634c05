"""The package's import graph: no import cycle, and no import against the layering below.

Every module under ``src/gatepool`` is parsed with ``ast`` and every import in it counts, wherever it
stands (module level, inside a function, under an ``if``): ``import a.b``, ``from a import b`` (the
submodule ``a.b`` when there is one, else the module ``a``), relative imports, and calls of
``importlib.import_module``: with a literal, the module it names; with an f-string, every module under
its literal prefix (``f"gatepool.cli.{name}"``: all of ``gatepool.cli.*``); with any other argument, every
gatepool module whose name stands as a string literal in the same file.

A module's *area* is the second part of its name (``gatepool.layers.attention`` → ``layers``,
``gatepool.data`` → ``data``); ``gatepool`` itself (the package's ``__init__``) and ``gatepool.__main__``
are areas of their own. An area may import its own modules and those of the areas listed for it, and
nothing else:

    area        may import                                   why
    utils       —                                            plumbing: io, environment
    data        utils                                        verified data: IDX sets, generated canvases
    layers      utils                                        the library: pools, attention, blocks, tokens
    analysis    utils, layers                                tools for any nn.Module: knows no model
    models      utils, layers, analysis.probe                analysis.probe only so that a model file
                                                             registers its block's probe rule
    train       utils, data, layers, models                  one trainer for every model
    lab         utils, data, layers, models, analysis,       the lecture's experiments, reproduce, bench
                train, gatepool
    cli         every area                                   the command line
    gatepool    layers, models                               lazy top-level names (create_model, ...)
    __main__    cli                                          ``python -m gatepool``

So ``layers`` imports nothing above it, ``analysis`` knows no model, and nothing imports ``lab`` but the
CLI. Within an area any import is allowed, as long as it makes no cycle (a package ``__init__`` and its
submodules included: an ``__init__`` that imports its submodules cannot be imported back by them).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

ALLOWED: dict[str, set[str]] = {
    "utils": set(),
    "data": {"utils"},
    "layers": {"utils"},
    "analysis": {"utils", "layers"},
    "models": {"utils", "layers", "analysis.probe"},
    "train": {"utils", "data", "layers", "models"},
    "lab": {"utils", "data", "layers", "models", "analysis", "train", "gatepool"},
    "cli": {"utils", "data", "layers", "models", "analysis", "train", "lab", "gatepool"},
    "gatepool": {"layers", "models"},
    "__main__": {"cli"},
}


# ---------------------------------------------------------------------------------------------------
# The graph
# ---------------------------------------------------------------------------------------------------


def modules(src: Path, package: str) -> dict[str, Path]:
    """{dotted name: file} for every module of ``package`` under ``src`` (``__init__`` = the package)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: set[str]) -> str | None:
    """``name`` if it is one of ``known``, else the longest known prefix of it, else None."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_import_module(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id == "import_module"
    )


def imports_of(module: str, path: Path, known: set[str]) -> dict[str, int]:
    """{imported module of the package: first line} for one module, every import statement counted."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    here = module if is_package else module.rpartition(".")[0]  # what a relative import starts from
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    found: dict[str, int] = {}

    def add(name: str | None, line: int) -> None:
        if name is not None and name != module:
            found.setdefault(name, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(_resolve(alias.name, known), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else _resolve(base, known), node.lineno)
        elif isinstance(node, ast.Call) and _is_import_module(node) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                add(_resolve(arg.value, known), node.lineno)
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                prefix = arg.values[0].value
                for name in known:
                    if name.startswith(prefix):
                        add(name, node.lineno)
            else:  # a computed name: every module the file names in a string may be it
                for name in strings & known:
                    add(name, node.lineno)
    return found


def import_graph(src: Path, package: str) -> dict[str, dict[str, int]]:
    """{module: {imported module: line}} over the whole package."""
    mods = modules(src, package)
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a → b → … → a) per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)

    out = []
    for comp in components:  # a readable cycle through the component's first module
        members, start = set(comp), comp[0]
        path, seen = [start], {start}
        while True:
            nxt = sorted(w for w in graph[path[-1]] if w in members)
            back = start if start in nxt else None
            if back:
                out.append([*path, start])
                break
            step = next((w for w in nxt if w not in seen), None)
            if step is None:  # dead end inside the component: fall back to listing it
                out.append(comp)
                break
            path.append(step)
            seen.add(step)
    return out


def area(module: str) -> str:
    parts = module.split(".")
    return parts[0] if len(parts) == 1 else parts[1]


def allowed(src_module: str, dst_module: str, table: dict[str, set[str]]) -> bool:
    a, b = area(src_module), area(dst_module)
    if a == b:
        return True
    pkg = src_module.split(".")[0]
    for entry in table.get(a, set()):
        if entry == b and "." not in entry:
            return True
        target = f"{pkg}.{entry}"
        if "." in entry and (dst_module == target or dst_module.startswith(target + ".")):
            return True
    return False


def upward(graph: dict[str, dict[str, int]], table: dict[str, set[str]]) -> list[str]:
    """Every import the table does not allow, as 'module:line imports target (area a → area b)'."""
    bad = []
    for m, targets in sorted(graph.items()):
        if area(m) not in table:
            bad.append(f"{m}: area {area(m)!r} is not in the table")
            continue
        for t, line in sorted(targets.items()):
            if not allowed(m, t, table):
                may = sorted(table[area(m)]) or "nothing"
                bad.append(f"{m}:{line} imports {t} ({area(m)} may import {may})")
    return bad


# ---------------------------------------------------------------------------------------------------
# The package
# ---------------------------------------------------------------------------------------------------


GRAPH = import_graph(SRC, "gatepool")


def test_the_walk_sees_the_package():
    assert "gatepool.layers.attention" in GRAPH and "gatepool.cli" in GRAPH
    # a sample of edges of every kind: module level, in a function, importlib with an f-string
    assert "gatepool.layers.attention" in GRAPH["gatepool.layers.blocks"]
    assert "gatepool.lab.harness" in GRAPH["gatepool.cli.experiments"]  # inside a function
    assert "gatepool.cli.train" in GRAPH["gatepool.cli"]  # importlib.import_module(f"gatepool.cli.{name}")
    assert "gatepool.models" in GRAPH["gatepool"]  # importlib.import_module(_LAZY[name])


def test_no_import_cycle():
    found = cycles(GRAPH)
    assert not found, "import cycles:\n" + "\n".join(" → ".join(c) for c in found)


def test_no_upward_import():
    bad = upward(GRAPH, ALLOWED)
    assert not bad, "imports against the layering (see tests/test_layout.py):\n" + "\n".join(bad)


def test_every_area_is_in_the_table():
    assert {area(m) for m in GRAPH} <= set(ALLOWED)


# ---------------------------------------------------------------------------------------------------
# The checker itself, on a toy package: it must see a cycle and an upward import wherever they hide
# ---------------------------------------------------------------------------------------------------


def _toy(tmp_path: Path, files: dict[str, str]) -> dict[str, dict[str, int]]:
    for rel, text in files.items():
        path = tmp_path / "toy" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return import_graph(tmp_path, "toy")


TOY_TABLE = {"toy": set(), "utils": set(), "layers": {"utils"}, "models": {"utils", "layers"},
             "lab": {"utils", "layers", "models"}, "cli": {"lab"}}
TOY_BASE = {"__init__.py": "", "utils/__init__.py": "", "layers/__init__.py": "", "models/__init__.py": "",
            "lab/__init__.py": "", "cli/__init__.py": "", "utils/io.py": "", "models/net.py": "",
            "lab/harness.py": "", "cli/run.py": ""}


def test_checker_clean_toy(tmp_path):
    g = _toy(tmp_path, {**TOY_BASE, "layers/a.py": "from toy.utils import io\n",
                        "models/net.py": "from ..layers import a\n",
                        "cli/run.py": "import toy.lab.harness\n"})
    assert g["toy.models.net"] == {"toy.layers.a": 1}
    assert cycles(g) == [] and upward(g, TOY_TABLE) == []


@pytest.mark.parametrize(
    "how",
    [
        "from toy.models import net\n",
        "def f():\n    from toy.models.net import Net\n",
        "import importlib\nimportlib.import_module('toy.models.net')\n",
        "from importlib import import_module\ndef f(k):\n    return import_module(f'toy.models.{k}')\n",
        "import importlib\nNAMES = {'n': 'toy.models.net'}\nimportlib.import_module(NAMES['n'])\n",
    ],
    ids=["module-level", "in-function", "importlib-literal", "importlib-fstring", "importlib-computed"],
)
def test_checker_sees_upward_import_and_cycle(tmp_path, how):
    g = _toy(tmp_path, {**TOY_BASE, "layers/a.py": how, "models/net.py": "from toy.layers import a\n"})
    assert [b.split(":")[0] for b in upward(g, TOY_TABLE)] == ["toy.layers.a"]
    assert cycles(g) == [["toy.layers.a", "toy.models.net", "toy.layers.a"]]


def test_checker_sees_init_cycle_and_lab_import(tmp_path):
    g = _toy(tmp_path, {**TOY_BASE, "lab/__init__.py": "from toy.lab import harness\n",
                        "lab/harness.py": "def registry():\n    import toy.lab\n",
                        "models/net.py": "from toy.lab.harness import registry\n"})
    assert cycles(g) == [["toy.lab", "toy.lab.harness", "toy.lab"]]
    assert upward(g, TOY_TABLE) == ["toy.models.net:1 imports toy.lab.harness (models may import "
                                    "['layers', 'utils'])"]
