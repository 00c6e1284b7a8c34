"""The plugin daemon is wired by construction: `Daemon.__init__` builds its parts in dependency order
and hands each one what it reads; no part is patched after it was built (no half-built object)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from pathlib import Path

from nvdp.plugins.deviceplugin.daemon import Daemon
from tests.test_metrics import sim_daemon


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    """Every expression assigned to in `node`, tuples unpacked."""
    for child in ast.walk(node):
        if isinstance(child, ast.Assign):
            pending = list(child.targets)
        elif isinstance(child, ast.AnnAssign | ast.AugAssign):
            pending = [child.target]
        else:
            continue
        while pending:
            target = pending.pop()
            if isinstance(target, ast.Tuple | ast.List):
                pending.extend(target.elts)
            else:
                yield target


def _foreign_assignments(source: str) -> list[str]:
    """The assignments to an attribute of anything but `self`, and the setattr() calls, in `source`."""
    tree = ast.parse(textwrap.dedent(source))
    found = [
        ast.unparse(t)
        for t in _targets(tree)
        if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self")
    ]
    found += [
        ast.unparse(call)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "setattr"
    ]
    return found


def test_daemon_init_assigns_no_attribute_of_another_object() -> None:
    assert _foreign_assignments(inspect.getsource(Daemon.__init__)) == []


def test_the_check_sees_a_part_patched_after_it_was_built() -> None:
    patched = """
    def __init__(self):
        self.metrics = Metrics()
        self.metrics.health = self.health
        a, (self.b, other.c) = 1, (2, 3)
        self.metrics.probes.rpc_probe: object = None
        setattr(self.metrics, "registrations", self.supervisor)
    """
    assert _foreign_assignments(patched) == [
        "self.metrics.health",
        "other.c",
        "self.metrics.probes.rpc_probe",
        "setattr(self.metrics, 'registrations', self.supervisor)",
    ]


def test_the_metrics_read_the_supervisor_and_health_from_construction(sock_dir: Path) -> None:
    daemon = sim_daemon(sock_dir)
    metrics = daemon.metrics
    assert metrics is not None
    assert metrics.probes.registrations is daemon.supervisor
    assert metrics.probes.health is daemon.health and metrics.probes.misfits is daemon.misfits
    assert metrics.readiness_problem() == "starting: no resources served yet"  # nothing decided yet
