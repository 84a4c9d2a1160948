"""The package's shape, enforced: no import cycles, layers that only point down, small modules.

Every import counts: module level, inside functions, under ``TYPE_CHECKING``. The layers,
top to bottom (each may import only from layers below it, and from itself):

* tools: ``_cli``, ``_check``, ``_check_progress``, ``_preflight``, ``_demo``, ``_bench``
  (the ``brokerkit`` command);
* service: ``brokerkit`` itself, the App and what is built on it (``_app``, ``_worker``,
  ``_runner``, ``_policy``, ``_middleware``, ``metrics``, ``tracing``, ``testing``,
  ``_sync``): users of the facade, like any application, and never of a backend;
* facade: ``_broker``, ``_consumer``, ``_registry``;
* backends: ``brokerkit.backends.<name>`` (each imports the toolkit ``brokerkit.backends``
  and its own package, nothing else of brokerkit: what a third party can do, a built-in
  does the same way);
* toolkit and core mechanisms: ``brokerkit.backends`` (``__init__``, ``base``) and every
  other ``brokerkit._*`` module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import brokerkit

ROOT = Path(brokerkit.__file__).parent
MAX_LINES = 500

TOOLS = {
    "brokerkit._cli",
    "brokerkit._check",
    "brokerkit._check_progress",
    "brokerkit._demo",
    "brokerkit._bench",
    "brokerkit._ops_cli",
    "brokerkit._run_cli",
    "brokerkit._guard",
    "brokerkit._preflight",
    "brokerkit.__main__",
}
SERVICE = {"brokerkit"} | {
    f"brokerkit.{m}"
    for m in ("_app", "_worker", "_runner", "_policy", "_middleware", "metrics", "tracing",
              "testing", "_sync")
}  # fmt: skip
FACADE = {"brokerkit._broker", "brokerkit._consumer", "brokerkit._registry", "brokerkit._redrive"}
TOOLKIT = {"brokerkit.backends", "brokerkit.backends.base"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The brokerkit modules ``name`` imports, anywhere in its source."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import sub`` imports the submodule pkg.sub when there is one (and
            # pkg's __init__ only as every submodule's parent, which is no edge of its own)
            subs = [f"{base}.{alias.name}" for alias in node.names]
            names_only = [s for s in subs if s not in MODULES]
            targets = [s for s in subs if s in MODULES] + ([base] if names_only else [])
        else:
            continue
        found |= {t for t in targets if t in MODULES and t != name}
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def layer(name: str) -> int:
    if name in TOOLS:
        return 4
    if name in SERVICE:
        return 3
    if name in FACADE:
        return 2
    if name.startswith("brokerkit.backends.") and name not in TOOLKIT:
        return 1
    return 0


def backend_package(name: str) -> str | None:
    """``brokerkit.backends.kafka._receiver`` -> ``brokerkit.backends.kafka``."""
    if layer(name) != 1:
        return None
    return ".".join(name.split(".")[:3])


def test_there_are_no_import_cycles() -> None:
    # Tarjan's strongly connected components; any component of two or more is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


def test_layers_only_import_downwards() -> None:
    wrong = []
    for name, targets in GRAPH.items():
        for target in targets:
            if layer(target) > layer(name):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_backends_use_only_the_public_toolkit() -> None:
    wrong = []
    for name, targets in GRAPH.items():
        own = backend_package(name)
        if own is None:
            continue
        for target in targets:
            if target in TOOLKIT or target == own or target.startswith(own + "."):
                continue
            wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_the_service_layer_reaches_no_backend() -> None:
    # the App works on every backend because it only ever talks to the facade
    wrong = [
        f"{name} -> {target}"
        for name in SERVICE
        for target in GRAPH.get(name, set())
        if layer(target) == 1  # a backend package (the toolkit's types are fine)
    ]
    assert wrong == []


def test_no_module_is_over_500_lines() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_the_graph_sees_imports_inside_functions_and_type_checking() -> None:
    # the consumer imports _validate inside a function; the broker imports _consumer
    assert "brokerkit._validate" in GRAPH["brokerkit._consumer"]
    assert "brokerkit._consumer" in GRAPH["brokerkit._broker"]
    assert layer("brokerkit.backends.memory") == 1 and layer("brokerkit.backends.base") == 0
