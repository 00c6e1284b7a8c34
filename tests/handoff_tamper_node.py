"""Both real processes on one node, each holding a GPU the config gives the other (a pod through the
device plugin, a claim through the DRA driver), and the holder's hand-over record tampered with while
a thread samples what each API advertises: for tests/test_handoff_tampered_e2e.py and
`python -m tests.handoff_tamper_run`.

The device plugin's advertised GPUs are the kubelet stand-in's ListAndWatch devices, the DRA driver's
the devices of the API stand-in's ResourceSlices."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from nvdp.plugins.handoff import DEVICE_PLUGIN, DRA
from testkit import wait_until
from tests.dra_support import DRIVER, make_claim, published, schedule
from tests.test_handoff_tampered import empty, grow, nest, remove_file, symlink_to_a_forged_copy, truncate
from tests.test_one_gpu_one_api_e2e import GPU, UUIDS, TwoApiNode, one_node, overlaps

SWAPPED = "version: v1\ndra:\n  devices: [0, 1]\n"  # the SPLIT config turned round
SAMPLE_S = 0.005
Tamper = Callable[[Path], None]


def remove_the_directory(path: Path) -> None:
    """The DRA driver's whole directory removed, as a kubelet reinstall does (its owner makes it again;
    a file the processes make again meanwhile may leave it not empty)."""
    shutil.rmtree(path.parent, ignore_errors=True)


TAMPERS = [
    remove_file,
    empty,
    truncate,
    symlink_to_a_forged_copy,
    grow,
    nest,
    remove_the_directory,
]
HOLDERS = [DEVICE_PLUGIN, DRA]


@dataclass(frozen=True)
class Outcome:
    samples: int
    both: frozenset[str]  # held GPUs advertised by the API that does not hold them, at any sample
    rewritten_s: float | None  # tamper until the holder's record said its hold again
    overlapping: list[tuple[float, frozenset[str]]]  # any moment of the whole history both advertised


class CrossedNode:
    """A TwoApiNode where the device plugin's pod holds `by_pod` and DRA's claim holds `by_claim`, and
    the config gives each of them to the other API."""

    def __init__(self, node: TwoApiNode) -> None:
        self.node = node
        node.serving(UUIDS[:2], UUIDS[2:], 30, "GPUs 0, 1 by the plugin, 2, 3 by DRA")
        (self.by_pod,) = node.kubelet.admit_pod("ml", "train", {"main": {GPU: 1}}).assignments[0].device_ids
        api = node.cluster.api
        claim = make_claim(api, "c1")
        (device,) = schedule(api, claim)
        node.cluster.kubelet.start_pod("pod-1", DRIVER, [claim])
        self.by_claim = published(api)[device]["attributes"]["uuid"]["string"]
        node.switch(SWAPPED)
        self.steady()

    @property
    def directory(self) -> Path:
        return self.node.cluster.node.plugins / DRIVER

    def steady(self, timeout: float = 30) -> None:
        """Each side serves the GPU its own pod or claim holds, and the free GPUs the config gives it."""
        pod_free = next(u for u in UUIDS[2:] if u != self.by_claim)
        claim_free = next(u for u in UUIDS[:2] if u != self.by_pod)
        self.node.serving([self.by_pod, pod_free], [self.by_claim, claim_free], timeout, "the crossed split")
        for api in HOLDERS:
            wait_until(partial(self.rewritten, api), timeout, f"{api}'s record")

    def held_by(self, api: str) -> str:
        return self.by_pod if api == DEVICE_PLUGIN else self.by_claim

    def rewritten(self, api: str) -> bool:
        """The record of `api` is there, a file of its own, and says its hold."""
        path = self.directory / f"served-by-{api}.json"
        try:
            if path.is_symlink():
                return False
            record = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            return False
        return isinstance(record, dict) and self.held_by(api) in (record.get("holds") or {})

    def tamper(self, holder: str, tamper: Tamper, window_s: float, rewrite_s: float = 30) -> Outcome:
        """Tamper with `holder`'s record and sample both APIs every SAMPLE_S for `window_s` (and until
        the record was written again, for at most `rewrite_s`: 0 for a stopped holder)."""
        both: set[str] = set()
        samples = 0
        rewritten: float | None = None
        stop = threading.Event()
        started = threading.Event()
        tampered = threading.Event()  # the record is looked at again only once the tamper is done
        at = 0.0

        def sample() -> None:
            nonlocal samples, rewritten
            started.set()
            while not stop.is_set():
                plugin, dra = self.node.by_plugin(), self.node.by_dra()
                both.update((plugin & {self.by_claim}) | (dra & {self.by_pod}))
                samples += 1
                if rewritten is None and tampered.is_set() and self.rewritten(holder):
                    rewritten = time.monotonic() - at
                stop.wait(SAMPLE_S)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        started.wait()
        at = time.monotonic()
        tamper(self.directory / f"served-by-{holder}.json")
        tampered.set()
        deadline = at + window_s
        while time.monotonic() < deadline or (rewritten is None and time.monotonic() < at + rewrite_s):
            time.sleep(SAMPLE_S)
        stop.set()
        thread.join()
        return Outcome(samples, frozenset(both), rewritten, overlaps(self.node.timeline()))


@contextmanager
def crossed_node(tmp_path: Path, timers: Mapping[str, str] | None = None) -> Iterator[CrossedNode]:
    """`timers`: both processes' (`nvdp.base.timers`); production's by default: a record is written again
    when its directory's watch wakes, long before the hand-over's retry."""
    with one_node(tmp_path, timers=timers or {}) as node:
        yield CrossedNode(node)
