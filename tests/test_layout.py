"""How the code is laid out: the tests stand on the package, not on the benchmarks (but for the test of
the benchmarks' own verdict), the benchmarks follow the package's module-size rule, and each test
helper, fake and builder is defined once."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

import nvdp
from testkit import REPO
from tests.test_layering import MAX_LINES

TEST_FILES = sorted(str(p.relative_to(REPO)) for d in ("tests", "testkit") for p in (REPO / d).glob("*.py"))
BENCH_TESTS = {"tests/test_bench_budgets.py"}  # its subject is bench/budgets.py, which `.ci/run` relies on


def imported_packages(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text(), path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return names


@pytest.mark.parametrize("path", [p for p in TEST_FILES if p not in BENCH_TESTS], ids=str)
def test_tests_do_not_import_the_benchmarks(path: str) -> None:
    """Helpers the tests share with the benchmarks live in testkit."""
    assert "bench" not in imported_packages(path)


def is_fixture(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """Decorated with pytest.fixture (pytest looks a fixture up per module: one name may serve many)."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target) in ("pytest.fixture", "fixture"):
            return True
    return False


def helpers_defined(path: str) -> list[str]:
    """The module's top-level classes and functions, less its tests and fixtures."""
    return [
        node.name
        for node in ast.parse((REPO / path).read_text(), path).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and not node.name.startswith("test_")
        and not is_fixture(node)
    ]


def test_each_helper_fake_and_builder_is_defined_once() -> None:
    """A test helper lives in one module and is imported where it is used: the shared fakes in
    tests/fakes.py, the builders in tests/builders.py, what reads a daemon in tests/readings.py, and
    none of them again under the name of what testkit ships (wait_until, start_plugin...)."""
    where: dict[str, list[str]] = {}
    for path in TEST_FILES:
        for name in helpers_defined(path):
            where.setdefault(name, []).append(path)
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_every_bench_module_says_its_job_and_stays_readable() -> None:
    modules = {str(p.relative_to(REPO)): p for p in sorted((REPO / "bench").glob("*.py"))}
    assert [name for name, p in modules.items() if not ast.get_docstring(ast.parse(p.read_text()))] == []
    lengths = {name: len(p.read_text().splitlines()) for name, p in modules.items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def readme_layout_map() -> str:
    """The first code block of the README's *Development* section: the map of the code."""
    section = (REPO / "README.md").read_text().partition("\n## Development\n")[2]
    return section.split("```")[1]


def test_the_readme_layout_map_names_every_package() -> None:
    """The README's map names every package under nvdp/ (the generated stubs under nvdp/api/ aside)
    and every module directly under nvdp/, each by its path (`nvdp/plugins/deviceplugin/`, `nvdp/cli.py`),
    and names no path that is gone."""
    named = {token.rstrip(".,;:") for token in re.findall(r"(?<![\w/])nvdp/[\w/.]*", readme_layout_map())}
    packages = {
        f"{init.parent.relative_to(REPO)}/"
        for init in (REPO / "nvdp").rglob("__init__.py")
        if init.parent == REPO / "nvdp/api" or (REPO / "nvdp/api") not in init.parents
    } - {"nvdp/"}
    modules = {f"nvdp/{p.name}" for p in (REPO / "nvdp").glob("*.py") if p.name != "__init__.py"}
    assert sorted((packages | modules) - named) == []
    assert sorted(name for name in named if not (REPO / name).exists()) == []


def test_python_dash_m_nvdp_is_the_nvdp_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nvdp", "--version"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"nvdp {nvdp.__version__}")


@pytest.mark.parametrize(
    "path",
    sorted(str(p.relative_to(REPO)) for d in ("bench", "testkit") for p in (REPO / d).rglob("*.py")),
    ids=str,
)
def test_the_benchmarks_need_neither_the_tests_nor_pytest(path: str) -> None:
    """`python -m bench` runs from a checkout without pytest: what it shares with the tests is in
    testkit/, which imports neither."""
    assert imported_packages(path) & {"tests", "pytest"} == set()
