"""The shape of the code, read from the source (AST, nothing imported): no import cycles between
modules, none between packages (a layered house), a pure core that reaches no I/O shell, one importer
per outside dependency, one name per class, modules of one job and a size a reader takes in. Imports
inside functions are edges; type-only imports (`if TYPE_CHECKING:`) are edges between packages,
not between modules (a module may name, for its types, a module that imports it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Every package of generated code (api/generate.py): `startswith(GENERATED)` tells a module of one.
GENERATED = (
    "nvdp.api.v1beta1",
    "nvdp.api.podresources_v1",
    *(f"nvdp.api.dra.{p}" for p in ("v1", "v1beta1", "health_v1alpha1", "health_v1", "registration_v1")),
)
MAX_LINES = 420  # "about 400"; generated code excepted
# Packages that group packages by kind: the layer is the package under them (nvdp.node.nvml).
GROUPS = ("nvdp.node", "nvdp.plugins", "nvdp.side")

# The pure core: plain data in, plain data out. Its imports must stay inside this set (plus the
# foundations below); an I/O shell in their closure is an upward arrow.
PURE = {
    "nvdp.plugins.deviceplugin.allocation",
    "nvdp.plugins.deviceplugin.allocation.allocator",
    "nvdp.plugins.deviceplugin.allocation.gpus",
    "nvdp.plugins.deviceplugin.allocation.shared",
    "nvdp.plugins.deviceplugin.allocation.topology",
    "nvdp.node.cdi.edits",
    "nvdp.node.cdi.names",
    "nvdp.node.cdi.node_files",
    "nvdp.node.cdi.spec",
    "nvdp.config.model",
    "nvdp.config.notices",
    "nvdp.config.runtime",
    "nvdp.config.values",
    "nvdp.node.gpus.devices",
    "nvdp.plugins.dra.capacity",
    "nvdp.plugins.dra.claims",
    "nvdp.plugins.dra.devices",
    "nvdp.plugins.dra.names",
    "nvdp.plugins.dra.slices",
    "nvdp.sim.dra.counters",
    "nvdp.sim.dra.scheduler",
    "nvdp.side.gfd.clique",
    "nvdp.side.gfd.labels",
    "nvdp.node.health.condition",
    "nvdp.node.health.settings",
    "nvdp.node.health.state",
    "nvdp.node.health.types",
    "nvdp.node.health.xid",
    "nvdp.node.gpus.inventory",
    "nvdp.sim.kubelet.validation",
    "nvdp.node.gpus.list_size",
    "nvdp.node.gpus.misfits",
    "nvdp.node.mps.allocate",
    "nvdp.node.mps.layout",
    "nvdp.node.mps.plan",
    "nvdp.node.nvml.naming",
    "nvdp.node.nvml.sim.mig",
    "nvdp.node.nvml.sim.models",
    "nvdp.node.nvml.sim.node",
    "nvdp.node.nvml.types",
    "nvdp.plugins.deviceplugin.responses",
    "nvdp.node.gpus.resources",
    "nvdp.node.gpus.unusable",
}
FOUNDATIONS = {
    "nvdp",
    "nvdp.base.errors",
    "nvdp.base.logs",
    "nvdp.base.units",
    "nvdp.base.timers",  # the timers tests shorten: a leaf on nvdp.base.errors and nvdp.base.units
    "nvdp.api",
    *(f"{package}.api_pb2" for package in GENERATED),
    *GENERATED,
}


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: set[str] = field(default_factory=set)  # nvdp modules
    type_imports: set[str] = field(default_factory=set)  # nvdp modules named under `if TYPE_CHECKING:`
    outside: set[str] = field(default_factory=set)  # top-level names of other packages
    dynamic: set[str] = field(default_factory=set)  # importlib.import_module("...") literals


def _nodes(tree: ast.Module) -> Iterator[tuple[ast.AST, bool]]:
    """Every node, and whether it is in the body of an `if TYPE_CHECKING:` block."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, typing_only = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend((child, True) for child in node.body)
            stack.extend((child, typing_only) for child in node.orelse)
            continue
        yield node, typing_only
        stack.extend((child, typing_only) for child in ast.iter_child_nodes(node))


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
        for node, typing_only in _nodes(module.tree):
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
                        (module.type_imports if typing_only else module.imports).add(known(target))
                elif not typing_only:
                    module.outside.add(target.split(".")[0])
    return found


def importers(predicate: str) -> set[str]:
    return {m.name for m in modules().values() if predicate in m.outside or predicate in m.dynamic}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk of `graph` meets, each as the path that closes it."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def package_of(module: str) -> str:
    """The layer a module belongs to: its package under nvdp (`nvdp.config`) or under a group of
    packages (`nvdp.plugins.dra`), or itself for a module directly under either (`nvdp.cli`)."""
    parts = module.split(".")
    return ".".join(parts[: 3 if ".".join(parts[:2]) in GROUPS else 2])


def test_no_import_cycles() -> None:
    assert cycles({name: module.imports for name, module in modules().items()}) == []


def test_packages_are_layered() -> None:
    """No package reaches back to one that imports it, through any module, for its types either."""
    graph: dict[str, set[str]] = {}
    for name, module in modules().items():
        edges = graph.setdefault(package_of(name), set())
        edges.update(package_of(target) for target in module.imports | module.type_imports)
    for package, edges in graph.items():
        edges.discard(package)
    assert cycles(graph) == []


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
        ("kubernetes", {"nvdp.kube.client"}),
        ("pynvml", {"nvdp.node.nvml.real"}),
        ("google", {f"{package}.api_pb2" for package in GENERATED}),
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
    # the wire types belong to the plugins, the kubelet stand-in and the Allocate pieces they use
    api_users = {
        m.name
        for m in modules().values()
        if any(t == "nvdp.api" or t.startswith("nvdp.api.") for t in m.imports)
        and not m.name.startswith("nvdp.api")
    }
    wire = (
        "nvdp.plugins.deviceplugin.",
        "nvdp.plugins.kubeletplugin.",
        "nvdp.sim.kubelet.",
        "nvdp.node.mps.allocate",
        "nvdp.sim.simulate",
        "nvdp.plugins.dra.",
        "nvdp.plugins.ledger.podresources",
    )
    # the PodResources API belongs to the allocation ledger's client and the kubelet stand-in
    podresources_users = {m.name for m in modules().values() if "nvdp.api.podresources" in m.imports}
    assert podresources_users == {"nvdp.plugins.ledger.podresources", "nvdp.sim.kubelet.pod_resources"}
    assert sorted(u for u in api_users if not u.startswith(wire)) == []


def test_the_kubernetes_adapter_is_a_leaf() -> None:
    kube = [m for m in modules().values() if m.name == "nvdp.kube" or m.name.startswith("nvdp.kube.")]
    assert len(kube) > 1
    outside_kube = {t for m in kube for t in m.imports if t != "nvdp.kube" and not t.startswith("nvdp.kube.")}
    # bounded reads, as every reader; the one backoff of every retry loop (a leaf itself)
    assert outside_kube - FOUNDATIONS == {"nvdp.base.bounded", "nvdp.base.files", "nvdp.base.backoff"}


def test_every_module_says_its_job_and_stays_readable() -> None:
    undocumented = [m.name for m in modules().values() if not ast.get_docstring(m.tree)]
    assert undocumented == []
    long = {
        m.name: n
        for m in modules().values()
        if not m.name.startswith(GENERATED) and (n := len(m.path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_one_name_per_class() -> None:
    """No two classes in nvdp share a name: one concept, one name (nested classes included; the
    generated gRPC code names its classes after the API's services)."""
    where: dict[str, list[str]] = {}
    for module in modules().values():
        if module.name.startswith(GENERATED):
            continue
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(module.name)
    assert {name: places for name, places in where.items() if len(places) > 1} == {}


def test_a_group_package_names_its_members_and_imports_nothing() -> None:
    """nvdp/node/, nvdp/plugins/ and nvdp/side/ group packages by kind: each __init__.py is a
    docstring naming every member, and no code."""
    for group in GROUPS:
        module = modules()[group]
        members = sorted(
            p.stem if p.suffix == ".py" else p.name
            for p in module.path.parent.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()
        )
        assert [type(node) for node in module.tree.body] == [ast.Expr], group
        doc = ast.get_docstring(module.tree) or ""
        assert [m for m in members if f"`{m}`" not in doc] == [], group
