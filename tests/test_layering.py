"""The shape of the code, read from the source (AST, nothing imported): no import cycles, a pure core
that reaches no I/O shell, one importer per outside dependency, modules of one job and a size a
reader takes in. Type-only imports (`if TYPE_CHECKING:`) are not edges; imports inside functions are.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERATED = "nvdp.api.v1beta1"
MAX_LINES = 420  # "about 400" (kube.py, 408, is the one adapter over `kubernetes`); generated code excepted

# The pure core: plain data in, plain data out. Its imports must stay inside this set (plus the
# foundations below); an I/O shell in their closure is an upward arrow.
PURE = {
    "nvdp.allocation",
    "nvdp.allocation.allocator",
    "nvdp.allocation.gpus",
    "nvdp.allocation.shared",
    "nvdp.allocation.synthetic",
    "nvdp.allocation.topology",
    "nvdp.cdi.names",
    "nvdp.cdi.spec",
    "nvdp.devices",
    "nvdp.gfd.labels",
    "nvdp.health.state",
    "nvdp.health.types",
    "nvdp.health.xid",
    "nvdp.kubelet_standin.validation",
    "nvdp.list_size",
    "nvdp.misfits",
    "nvdp.mps.allocate",
    "nvdp.mps.layout",
    "nvdp.mps.plan",
    "nvdp.nvml.naming",
    "nvdp.nvml.sim.mig",
    "nvdp.nvml.sim.models",
    "nvdp.nvml.sim.node",
    "nvdp.nvml.types",
    "nvdp.plugin.responses",
    "nvdp.resources",
    "nvdp.unusable",
}
FOUNDATIONS = {
    "nvdp",
    "nvdp.errors",
    "nvdp.logs",
    "nvdp.units",
    "nvdp.api",
    f"{GENERATED}.api_pb2",
    GENERATED,
}


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: set[str] = field(default_factory=set)  # nvdp modules
    outside: set[str] = field(default_factory=set)  # top-level names of other packages
    dynamic: set[str] = field(default_factory=set)  # importlib.import_module("...") literals


def _runtime_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node, minus the bodies of `if TYPE_CHECKING:` blocks."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


@cache
def modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for path in sorted((ROOT / "nvdp").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        found[name] = Module(name, path, ast.parse(path.read_text(), str(path)))

    def known(dotted: str) -> str:
        while dotted not in found:
            dotted = dotted.rpartition(".")[0]
        return dotted

    for module in found.values():
        package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
        for node in _runtime_nodes(module.tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # `from pkg import submodule` is an edge to the submodule, not to pkg's __init__
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else base for a in node.names]
            elif (
                isinstance(node, ast.Call)
                and ast.unparse(node.func).endswith("import_module")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                module.dynamic.add(str(node.args[0].value))
            for target in targets:
                if target == "nvdp" or target.startswith("nvdp."):
                    if known(target) != module.name:
                        module.imports.add(known(target))
                else:
                    module.outside.add(target.split(".")[0])
    return found


def importers(predicate: str) -> set[str]:
    return {m.name for m in modules().values() if predicate in m.outside or predicate in m.dynamic}


def test_no_import_cycles() -> None:
    graph = {name: module.imports for name, module in modules().items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_pure_core_reaches_no_io_shell() -> None:
    graph = modules()
    upward = {
        f"{name} -> {target}"
        for name in PURE
        for target in graph[name].imports
        if target not in PURE | FOUNDATIONS
    }
    assert sorted(upward) == []
    outside = {f"{name}: {dep}" for name in PURE for dep in graph[name].outside - {"__future__"}}
    io_dependencies = {"grpc", "yaml", "kubernetes", "pynvml", "threading", "subprocess", "socket"}
    assert sorted(o for o in outside if o.rpartition(" ")[2] in io_dependencies) == []


@pytest.mark.parametrize(
    ("dependency", "allowed"),
    [
        ("kubernetes", {"nvdp.kube"}),
        ("pynvml", {"nvdp.nvml.real"}),
        ("google", {f"{GENERATED}.api_pb2"}),
    ],
    ids=["kubernetes", "pynvml", "protobuf"],
)
def test_one_importer_per_outside_dependency(dependency: str, allowed: set[str]) -> None:
    assert importers(dependency) <= allowed


def test_the_generated_code_is_reached_through_nvdp_api_only() -> None:
    generated_users = {
        m.name
        for m in modules().values()
        if any(t.startswith(GENERATED) for t in m.imports) and not m.name.startswith("nvdp.api")
    }
    assert generated_users == set()
    # the wire types belong to the plugin, the kubelet stand-in and the Allocate pieces they use
    api_users = {m.name for m in modules().values() if "nvdp.api" in m.imports}
    wire = ("nvdp.plugin.", "nvdp.kubelet_standin.", "nvdp.mps.allocate", "nvdp.simulate")
    assert sorted(u for u in api_users if not u.startswith(wire)) == []


def test_the_kubernetes_adapter_is_a_leaf() -> None:
    assert modules()["nvdp.kube"].imports == {"nvdp.errors"}


def test_every_module_says_its_job_and_stays_readable() -> None:
    undocumented = [m.name for m in modules().values() if not ast.get_docstring(m.tree)]
    assert undocumented == []
    long = {
        m.name: n
        for m in modules().values()
        if not m.name.startswith(GENERATED) and (n := len(m.path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
