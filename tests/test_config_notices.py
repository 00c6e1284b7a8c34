"""Migration notices (nvdp.config.notices): a config key that NVIDIA's plugin ignores (or refuses) and
nvdp applies is one NOTICE line at the plugin's start and in `nvdp config check`; a misplaced key
(`flags.renameByDefault`, NVIDIA issue #1433) says where it belongs."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest

from nvdp.cli import main
from nvdp.config import parse_text
from nvdp.config.notices import MAX_NOTICES, NVIDIA_IGNORES, migration_notices
from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin, wait_until

IGNORES = NVIDIA_IGNORES

# The case on a 4-GPU node: nvdp advertises nvidia.com/gpu x3 and nvidia.com/gpu-shared x4
# (GPU 0 shared 4 ways under a new name); NVIDIA's plugin drops rename and devices: nvidia.com/gpu x16.
RENAMED_SUBSET = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      rename: gpu-shared
      replicas: 4
      devices: [0]
"""
RENAMED_SUBSET_NOTICES = [
    f"sharing.timeSlicing.resources[0].rename: {IGNORES}: the replicas are advertised as "
    "nvidia.com/gpu-shared (NVIDIA's: nvidia.com/gpu)",
    f"sharing.timeSlicing.resources[0].devices: {IGNORES}: nvidia.com/gpu is shared on device 0 only, "
    "the other devices stay whole (NVIDIA's: every device shared)",
]


@pytest.mark.parametrize(
    ("text", "notices"),
    [
        pytest.param(RENAMED_SUBSET, RENAMED_SUBSET_NOTICES, id="rename-and-devices"),
        pytest.param(
            "resources:\n  gpus: [{pattern: '*A100*', name: a100}]\n"
            "  mig: [{pattern: 1g.5gb, name: small}]\n",
            [
                f"resources.gpus[0]: {IGNORES}: GPUs whose product name matches '*A100*' are advertised as "
                "nvidia.com/a100 (NVIDIA's: nvidia.com/gpu)",
                f"resources.mig[0]: {IGNORES}: MIG devices whose profile matches '1g.5gb' are advertised as "
                "nvidia.com/small (NVIDIA's: nvidia.com/mig-<profile>, or nvidia.com/gpu with the single MIG "
                "strategy)",
            ],
            id="resources",
        ),
        pytest.param(
            "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
            "    - {name: gpu, rename: gpu.mine, replicas: 2, devices: 2}\n",
            [
                f"sharing.timeSlicing.resources[0].rename: {IGNORES}: the replicas are advertised as "
                "nvidia.com/gpu.mine (NVIDIA's: nvidia.com/gpu.shared)",
                f"sharing.timeSlicing.resources[0].devices: {IGNORES}: nvidia.com/gpu is shared on the "
                "first 2 devices only, the other devices stay whole (NVIDIA's: every device shared)",
            ],
            id="rename-by-default-overridden",
        ),
        pytest.param(
            "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 1, devices: ['0', '1']}\n",
            [
                f"sharing.mps.resources[0].devices: {IGNORES}: nvidia.com/gpu is shared on devices 0, 1 "
                "only, the other devices stay whole (NVIDIA's: every device shared)",
                "sharing.mps.resources[0].replicas: NVIDIA's plugin refuses 1 (its replicas must be >= 2); "
                "nvdp applies it: the selected devices are advertised whole, not shared",
            ],
            id="mps-devices-and-one-replica",
        ),
        # What both plugins do alike: no notice.
        pytest.param("sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 4}]\n", [], id="plain"),
        pytest.param(
            "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
            "    - {name: gpu, replicas: 4}\n"
            "    - {name: mig-1g.5gb, rename: mig-1g.5gb.shared, replicas: 2}\n",
            [],
            id="rename-by-default",
        ),
        pytest.param("version: v1\n", [], id="empty"),
    ],
)
def test_notices(text: str, notices: list[str]) -> None:
    assert migration_notices(parse_text(text)) == notices


def test_notices_are_bounded() -> None:
    entries = "".join(f"    - {{name: gpu, replicas: 2, devices: [{n}]}}\n" for n in range(50))
    lines = migration_notices(parse_text(f"sharing:\n  timeSlicing:\n    resources:\n{entries}"))
    assert len(lines) == MAX_NOTICES + 1
    assert lines[-1] == "and 30 more notices"


@pytest.mark.parametrize("nvml", [[], ["--nvml", "sim:pcie-4"]], ids=["parse", "resources"])
def test_config_check_prints_the_notices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nvml: list[str]
) -> None:
    path = tmp_path / "shared.yaml"
    path.write_text(RENAMED_SUBSET)
    assert main(["config", "check", str(path), *nvml]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [f"  notice: {line}" for line in RENAMED_SUBSET_NOTICES]
    if nvml:  # what nvdp serves there; NVIDIA's plugin would serve nvidia.com/gpu x16
        assert out[1:3] == [
            "  nvidia.com/gpu: 3 device(s)",
            "  nvidia.com/gpu-shared: 4 device(s) time-slicing x4",
        ]


def test_the_plugin_prints_the_notices_at_start(sock_dir: Path, kubelet: Kubelet) -> None:
    config = sock_dir / "config.yaml"
    config.write_text(RENAMED_SUBSET)
    with start_plugin(sock_dir, "sim:pcie-4", config_file=config) as plugin:
        kubelet.wait_for_devices("nvidia.com/gpu-shared", lambda d: len(d) == 4, timeout=20)
        assert len(kubelet.wait_for_devices("nvidia.com/gpu", lambda d: len(d) == 3, timeout=10)) == 3
        lines = notice_lines(plugin)
        assert [line.split(" NOTICE  ", 1)[1] for line in lines] == [
            f"{notice} config_file={config}" for notice in RENAMED_SUBSET_NOTICES
        ]
        plugin.send(signal.SIGHUP)  # a reload loads the file again: the notices again
        wait_until(lambda: len(notice_lines(plugin)) == 4, 20, "the notices after the reload")


def notice_lines(plugin: Process) -> list[str]:
    return [line for line in plugin.log().splitlines() if " NOTICE  " in line]


def test_a_misplaced_key_says_where_it_belongs(caplog: pytest.LogCaptureFixture) -> None:
    """NVIDIA issue #1433: `flags.renameByDefault` is silently ignored there."""
    with caplog.at_level(logging.WARNING):
        parse_text("flags:\n  renameByDefault: true\n")
    assert [r.getMessage() for r in caplog.records] == [
        "flags.renameByDefault: unknown field (renameByDefault belongs under sharing.timeSlicing or under "
        "sharing.mps); ignored (--strict-config refuses it)"
    ]


def test_config_check_refuses_a_misplaced_key_saying_where_it_belongs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "misplaced.yaml"
    path.write_text("flags:\n  plugin:\n    migStrategy: mixed\n")
    assert main(["config", "check", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: {path}: flags.plugin.migStrategy: unknown field (migStrategy belongs under flags)"
    ]
