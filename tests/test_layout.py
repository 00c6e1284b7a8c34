"""How the code is laid out: the tests stand on the package, not on the benchmarks (but for the test of
the benchmarks' own verdict), and the benchmarks follow the package's module-size rule."""

from __future__ import annotations

import ast

import pytest

from nvdp.testing import REPO
from tests.test_layering import MAX_LINES

TEST_FILES = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("*.py"))
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
    """Helpers the tests share with the benchmarks live in nvdp.testing."""
    assert "bench" not in imported_packages(path)


def test_every_bench_module_says_its_job_and_stays_readable() -> None:
    modules = {str(p.relative_to(REPO)): p for p in sorted((REPO / "bench").glob("*.py"))}
    assert [name for name, p in modules.items() if not ast.get_docstring(ast.parse(p.read_text()))] == []
    lengths = {name: len(p.read_text().splitlines()) for name, p in modules.items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
