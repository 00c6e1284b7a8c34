"""Soak tests: `nvdp plugin` as a real process against the kubelet stand-in, for a long while.

- 100 kubelet restarts in a row: every one re-registers, and the process ends with the threads and
  file descriptors it had after the first registration.
- 10,000 Allocate calls from 16 threads, 1% of them malformed: every valid call gets exactly the
  devices asked for, every malformed one INVALID_ARGUMENT, and the daemon serves on.

Select them with `-m soak`; they also run in the default test command.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from nvdp.api import pb
from nvdp.sim.kubelet import Kubelet
from testkit import Process, ProcStats, start_plugin, wait_until, write_time_slicing_config

pytestmark = pytest.mark.soak

GPU = "nvidia.com/gpu"
# The plugin's gRPC worker pool (a ThreadPoolExecutor) starts threads lazily, when every worker is busy,
# and never stops them: back-to-back restarts overlap the old stream's end with the new registration's
# calls and may start one or two more workers. A leak would be one thread per restart, 100 here.
POOL_SLACK = 2
REGISTERED = "registered with kubelet"  # also in "re-registered with kubelet"


def _start_registered(kubelet: Kubelet, processes: list[Process], **kw: object) -> Process:
    process = start_plugin(kubelet.plugin_dir, **kw)  # type: ignore[arg-type]
    processes.append(process)
    kubelet.wait_for_registration(GPU, timeout=30)
    kubelet.wait_for_devices(GPU, timeout=30)
    _wait_registered(process, 1)
    return process


def _wait_registered(process: Process, count: int) -> None:
    """The kubelet opens the stream before it answers Register: wait for the answer to reach the plugin
    (a restart before that cancels the Register call, and the plugin registers again)."""
    wait_until(lambda: _log_count(process, REGISTERED) >= count, 15, f"registration #{count} logged")


def _steady(process: Process, kubelet: Kubelet) -> ProcStats:
    """The process's threads and fds once the first registration is over.

    grpc closes the Register call's channel (a socket on kubelet.sock) on its own thread: on a loaded
    machine it can still be open, for a while, after the registration is logged, and a baseline taken
    then makes the end look lower than the start. So wait until no connection to kubelet.sock is left
    (/proc/net/unix), then until two readings agree."""
    wait_until(lambda: not _connections_to(kubelet.socket_path), 15, "the Register channel closed")
    last = [ProcStats.read(process.pid)]

    def unchanged() -> ProcStats | None:
        now, before = ProcStats.read(process.pid), last[0]
        last[0] = now
        return now if (now.threads, now.fds) == (before.threads, before.fds) else None

    return wait_until(unchanged, 15, "steady threads and fds after the first registration", interval=0.1)


def _connections_to(socket_path: Path) -> int:
    """Connected sockets on `socket_path` (the accepting side shows its path, state 03: connected)."""
    count = 0
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 7 and os.path.normpath(fields[7]) == str(socket_path) and fields[5] == "03":
            count += 1
    return count


def _log_count(process: Process, text: str) -> int:
    return process.log().count(text)


def _stop_and_check(process: Process) -> None:
    """Stop the plugin; it must exit 0, and its log must hold no traceback."""
    assert process.stop(timeout=5) == 0, process.log()[-3000:]
    assert "Traceback" not in process.log(), process.log()[-3000:]


def test_hundred_kubelet_restarts_reregister_and_leak_nothing(
    kubelet: Kubelet, processes: list[Process]
) -> None:
    process = _start_registered(kubelet, processes)
    start = _steady(process, kubelet)
    for n in range(2, 102):
        kubelet.restart()
        kubelet.wait_for_registration(GPU, n, timeout=15)
        kubelet.wait_for_devices(GPU, timeout=15)  # the new ListAndWatch stream is up
        _wait_registered(process, n)
    registrations = [r for r in kubelet.registrations if r.resource == GPU]
    assert len(registrations) == 101
    assert not kubelet.rejections

    # Servers replaced by a restart finish their threads asynchronously: wait for them, with a deadline.
    def settled() -> ProcStats | None:
        now = ProcStats.read(process.pid)
        return now if now.threads <= start.threads + POOL_SLACK and now.fds <= start.fds else None

    try:
        end = wait_until(settled, timeout=30, what="threads and fds back to where they started")
    except TimeoutError:
        end = ProcStats.read(process.pid)
    assert end.fds == start.fds, f"fds {start.fds} -> {end.fds}"
    assert start.threads <= end.threads <= start.threads + POOL_SLACK, (
        f"threads {start.threads} -> {end.threads}"
    )
    assert (
        _log_count(process, REGISTERED) == 101
    )  # "registered with kubelet" once, "re-registered..." 100 times
    _stop_and_check(process)


@dataclass(frozen=True)
class Call:
    containers: list[list[str]]
    valid: bool
    kind: str


def _plan(ids: list[str], calls: int, seed: int = 0) -> list[Call]:
    """`calls` Allocate requests; every 100th malformed, cycling through the kinds of malformed."""
    rng = random.Random(seed)
    bad_kinds = [
        "unknown id",
        "empty list",
        "oversize unknown list",
        "one unknown among valid",
        "second container empty",
    ]
    plan = []
    for i in range(calls):
        if i % 100 == 50:
            kind = bad_kinds[(i // 100) % len(bad_kinds)]
            valid = rng.sample(ids, 2)
            malformed: dict[str, list[list[str]]] = {
                "unknown id": [[f"GPU-{rng.getrandbits(64):016x}"]],
                "empty list": [[]],
                "oversize unknown list": [[f"GPU-{rng.getrandbits(128):032x}" for _ in range(2000)]],
                "one unknown among valid": [[valid[0], "GPU-nope", valid[1]]],
                "second container empty": [valid, []],
            }
            plan.append(Call(malformed[kind], False, kind))
        else:
            containers = [rng.sample(ids, rng.randint(1, 4)) for _ in range(rng.choice((1, 1, 1, 2)))]
            plan.append(Call(containers, True, "valid"))
    return plan


def _expected_visible(container: list[str]) -> str:
    """NVIDIA_VISIBLE_DEVICES for the replicas asked for: their GPUs, each once, in order."""
    return ",".join(dict.fromkeys(i.split("::")[0] for i in container))


def test_ten_thousand_allocations_with_one_percent_malformed(
    kubelet: Kubelet, processes: list[Process], sock_dir: Path
) -> None:
    config = write_time_slicing_config(sock_dir / "config.yaml", replicas=4)
    process = _start_registered(kubelet, processes, config_file=config)
    ids = list(kubelet.wait_for_devices(GPU, lambda d: len(d) == 32))
    plan = _plan(ids, 10_000)
    stub = kubelet.stub(GPU)

    def call(c: Call) -> tuple[Call, object]:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in c.containers]
        )
        try:
            return c, stub.Allocate(request, timeout=30)
        except grpc.RpcError as error:
            return c, error

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, plan))

    wrong = []
    for c, outcome in results:
        if c.valid:
            if isinstance(outcome, grpc.RpcError):
                wrong.append(f"valid {c.containers} refused: {outcome.code()} {outcome.details()}")
                continue
            assert isinstance(outcome, pb.AllocateResponse)
            got = [r.envs["NVIDIA_VISIBLE_DEVICES"] for r in outcome.container_responses]
            if got != [_expected_visible(ids) for ids in c.containers]:
                wrong.append(f"valid {c.containers} answered {got}")
        elif not isinstance(outcome, grpc.RpcError):
            wrong.append(f"{c.kind} {c.containers} accepted: {outcome}")
        elif outcome.code() != grpc.StatusCode.INVALID_ARGUMENT:
            wrong.append(f"{c.kind} refused with {outcome.code()}: {(outcome.details() or '')[:200]}")
    assert sum(not c.valid for c in plan) == 100
    assert not wrong, f"{len(wrong)} wrong answers, e.g. {wrong[:5]}"

    assert process.alive()
    assert kubelet.resources() == [GPU]  # ListAndWatch still open
    assert kubelet.allocate(GPU, [ids[:1]]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
    refused = [line for line in process.log().splitlines() if "request refused" in line]
    assert len(refused) == 100
    assert all(len(line) < 4096 for line in refused), "a refusal logged a huge line"
    _stop_and_check(process)
