"""Hand-over records fail closed, as processes: `nvdp plugin` and `nvdp dra-kubelet-plugin` on one
node, a pod holding a GPU through the device plugin and a claim holding one through DRA, the config
giving each held GPU to the other API. The holder's record is removed, emptied, truncated, replaced by
a symlink to a forged copy, grown past 1 MiB, deeply nested, or the DRA driver's whole directory is
removed: sampled every 5 ms (and in the whole history of both consumers), no held GPU is ever
advertised by the other API, and the holder writes its record again within moments (a record
written in place wakes it too)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nvdp.base.timers import as_env
from tests.handoff_tamper_node import HOLDERS, TAMPERS, CrossedNode, Tamper, crossed_node

WINDOW_S = 0.75  # either side acts on a changed record when its directory's watch wakes (ms)
# The hand-over's retry (production: 5 s, randomised) set out of the test's reach: a record written
# again was written on a watch's wake, whatever the machine's load, and REWRITTEN_S bounds only how
# long a wake and a write may take on a loaded machine (ms when quiet).
NO_RETRY = as_env(handoff_retry=3600)
REWRITTEN_S = 10.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrossedNode]:
    with crossed_node(tmp_path_factory.mktemp("tampered"), NO_RETRY) as crossed:
        yield crossed


@pytest.mark.parametrize("tamper", TAMPERS, ids=[t.__name__ for t in TAMPERS])
@pytest.mark.parametrize("holder", HOLDERS)
def test_a_tampered_record_never_lets_the_other_api_advertise_a_held_gpu(
    node: CrossedNode, holder: str, tamper: Tamper
) -> None:
    outcome = node.tamper(holder, tamper, WINDOW_S)
    assert outcome.samples > 20
    assert outcome.both == frozenset()
    assert outcome.overlapping == []
    assert outcome.rewritten_s is not None and outcome.rewritten_s < REWRITTEN_S
    node.steady()  # the free GPUs are served as before
    logs = node.node.plugin.log() + node.node.dra.log()
    assert "Traceback" not in logs
