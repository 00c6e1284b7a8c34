"""How the code is laid out: the tests stand on the package, not on the benchmarks."""

from __future__ import annotations

import ast

import pytest

from nvdp.testing import REPO


def imported_packages(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text(), path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return names


@pytest.mark.parametrize(
    "path", sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("*.py")), ids=str
)
def test_tests_do_not_import_the_benchmarks(path: str) -> None:
    """Helpers the tests share with the benchmarks live in nvdp.testing."""
    assert "bench" not in imported_packages(path)
