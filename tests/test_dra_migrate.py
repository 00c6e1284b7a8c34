"""Moving a node from NVIDIA's DRA driver to `nvdp dra-kubelet-plugin`, with the plugin as a process:
the CDI hook binary NVIDIA's chart installs (`--nvidia-cdi-hook-path` / NVIDIA_CDI_HOOK_PATH) named
in the claims' specs; the claims NVIDIA's driver prepared adopted from its checkpoint."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nvdp.base.logs import TextFormatter
from nvdp.plugins.dra.checkpoint import Checkpoint, PreparedDevice
from nvdp.plugins.dra.nvidia_checkpoint import adopt, current_boot_id, parse
from nvdp.sim.kubelet import Kubelet
from nvdp.sim.kubelet.dra import Claim
from testkit import start_plugin, wait_until
from tests.builders import sim_gpus
from tests.dra_support import DRIVER, dra_cluster, make_claim, schedule, slices_of
from tests.nvidia_checkpoint_support import checkpoint_v2, v2_claim

GPU = "nvidia.com/gpu"
GPUS = [g.uuid for g in sim_gpus("pcie-4")]
HOOK = "/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook"


@pytest.mark.parametrize(
    ("env", "program", "argv0"),
    [
        ({"NVIDIA_CDI_HOOK_PATH": HOOK}, HOOK, ["nvidia-cdi-hook"]),
        ({}, "/usr/bin/nvidia-ctk", ["nvidia-ctk", "hook"]),
    ],
    ids=["nvidia-cdi-hook-path", "default-nvidia-ctk"],
)
def test_claim_spec_hooks_name_the_cdi_hook_binary(
    tmp_path: Path, env: dict[str, str], program: str, argv0: list[str]
) -> None:
    with dra_cluster(tmp_path, env=env) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        claim = make_claim(cluster.api, "hooked")
        schedule(cluster.api, claim)
        cluster.kubelet.start_pod("pod-1", "gpu.nvidia.com", [claim])
        spec = cluster.specs()["k8s.gpu.nvidia.com-claim_uid-hooked.json"]
        hooks = spec["containerEdits"]["hooks"]
        assert {h["path"] for h in hooks} == {program}
        assert {h["args"][len(argv0)] for h in hooks} >= {
            "create-symlinks",
            "update-ldcache",
        }
        assert all(h["args"][: len(argv0)] == argv0 for h in hooks)


NVIDIA_DATA = Path(__file__).parent / "data" / "dra" / "nvidia-checkpoint"
TRAIN, EVAL = "a7d04e5b-2c19-4f6a-8e3d-5b1c0f9a7d42", "c91e7f30-4b2d-4a8e-b6f5-2e0d8c4a1b63"


def nvidia_spec(cdi: Path, uid: str, device: str) -> Path:
    """The claim spec NVIDIA's driver writes (YAML; the content does not matter here)."""
    cdi.mkdir(parents=True, exist_ok=True)
    path = cdi / f"k8s.gpu.nvidia.com-claim_{uid}.yaml"
    path.write_text(f"cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: {uid}-{device}\n")
    return path


def test_claims_nvidia_prepared_are_adopted_held_and_unprepared(tmp_path: Path) -> None:
    """NVIDIA's driver prepared ml/train (gpu-2) and had started ml/eval (gpu-3); the config gives DRA
    GPU 0 and the device plugin the rest. The adopted claim holds GPU 2 from the device plugin until
    the kubelet unprepares it; the claim only started leaves nothing behind."""
    claims = {
        TRAIN: v2_claim(TRAIN, "train", "gpu-2", GPUS[2]),
        EVAL: v2_claim(EVAL, "eval", "gpu-3", GPUS[3], "PrepareStarted"),
    }
    with dra_cluster(tmp_path, config="version: v1\ndra:\n  devices: [0]\n") as cluster:
        node = cluster.node
        node.checkpoint.parent.mkdir(parents=True)
        node.checkpoint.write_text(checkpoint_v2(claims, current_boot_id()))
        train_spec, eval_spec = nvidia_spec(node.cdi, TRAIN, "gpu-2"), nvidia_spec(node.cdi, EVAL, "gpu-3")
        cluster.start()
        cluster.registered()
        record = node.checkpoint.parent / "served-by-dra.json"
        wait_until(lambda: record.exists() and GPUS[2] in record.read_text(), 10, "the hold in DRA's record")
        assert "adopted the claims NVIDIA's DRA driver prepared" in cluster.log()
        assert json.loads(record.read_text())["holds"] == {GPUS[2]: "claim ml/train"}
        assert (node.checkpoint.parent / "checkpoint.json.nvidia").exists()
        assert train_spec.exists() and not eval_spec.exists()  # a claim only started: its spec goes

        plugin_dir = node.root / "device-plugins"  # beside plugins/: the device plugin finds the records
        kubelet = Kubelet(plugin_dir, pod_resources=True)
        kubelet.start()
        plugin = start_plugin(
            plugin_dir,
            cluster.nvml,
            config_file=Path(cluster.env["CONFIG_FILE"]),
            log_path=tmp_path / "p.log",
        )
        try:
            kubelet.wait_for_registration(GPU, timeout=20)
            wait_until(lambda: advertised(kubelet) == {GPUS[1], GPUS[3]}, 20, "GPUs 1 and 3, not the held 2")
            said = "claim ml/train holds it through the DRA driver"
            wait_until(lambda: said in plugin.log(), 10, "the device plugin says why GPU 2 waits")

            train = Claim("ml", "train", TRAIN)  # not in the API: only the adopted checkpoint answers
            (device,) = cluster.kubelet.node_prepare(DRIVER, [train]).claims[TRAIN].devices
            assert (device.device_name, list(device.cdi_device_ids)) == (
                "gpu-2",
                [f"k8s.gpu.nvidia.com/claim={TRAIN}-gpu-2"],
            )
            assert not cluster.kubelet.node_unprepare(DRIVER, [train]).claims[TRAIN].error
            assert not train_spec.exists()
            assert TRAIN not in json.loads(node.checkpoint.read_text())["claims"]
            wait_until(lambda: advertised(kubelet) == set(GPUS[1:]), 20, "GPU 2 to the device plugin")
        finally:
            plugin.stop()
            kubelet.stop()


def advertised(kubelet: Kubelet) -> set[str]:
    if GPU not in kubelet.resources():
        return set()
    return {i for i, d in kubelet.devices(GPU).items() if d.health == "Healthy"}


V1_CLAIM, V2_CLAIM = "3f2b6c1e-8a4d-4c2e-9b1f-0d6e5a7c9e21", TRAIN
BOOT = "0c7e5d2a-9f31-4b8e-a6c4-1d2e3f4a5b6c"  # the boot ID in checkpoint-v2.json


@pytest.mark.parametrize(
    ("file", "claim", "where", "started", "boot"),
    [
        ("checkpoint-v1.json", V1_CLAIM, ("", V1_CLAIM, "gpu-1"), (), ""),
        ("checkpoint-v2.json", V2_CLAIM, ("ml", "train", "gpu-2"), (EVAL,), BOOT),
    ],
    ids=["v1-releases-25.3", "v2-current"],
)
def test_reads_nvidia_checkpoint(
    file: str, claim: str, where: tuple[str, str, str], started: tuple[str, ...], boot: str
) -> None:
    found = parse((NVIDIA_DATA / file).read_text())
    (prepared,) = found.claims.values()
    (device,) = prepared.devices
    assert (prepared.uid, prepared.namespace, prepared.name, device.device_name) == (claim, *where)
    assert device == PreparedDevice(
        ("gpu",), "node-a", where[2], (f"k8s.gpu.nvidia.com/claim={claim}-{where[2]}",)
    )
    assert (found.started, found.boot_id, found.bad_checksums) == (started, boot, ())


@pytest.mark.parametrize(
    ("change", "bad"),
    [
        (lambda t: t.replace('"gpu-2"', '"gpu-0"'), ("v1", "v2")),
        (lambda t: t.replace('"name":"train"', '"name":"tuned"'), ("v2",)),
        (lambda t: json.dumps(json.loads(t), indent=1), ("v1", "v2")),
    ],
    ids=["device-in-both", "v2-only-field", "not-go-compact"],
)
def test_checksums_that_do_not_match_are_found(change: Callable[[str], str], bad: tuple[str, ...]) -> None:
    text = (NVIDIA_DATA / "checkpoint-v2.json").read_text()
    assert parse(change(text)).bad_checksums == bad


def copy_checkpoint(tmp_path: Path, text: str) -> Checkpoint:
    path = tmp_path / "checkpoint.json"
    path.write_text(text)
    return Checkpoint(path)


def test_adopted_into_nvdps_checkpoint_nvidias_kept_beside(tmp_path: Path) -> None:
    text = (NVIDIA_DATA / "checkpoint-v2.json").read_text()
    checkpoint = copy_checkpoint(tmp_path, text)
    adopt(checkpoint, BOOT)
    assert list(checkpoint.load()) == [V2_CLAIM]
    assert (tmp_path / "checkpoint.json.nvidia").read_text() == text
    adopt(checkpoint, BOOT)  # nvdp's form now: left alone
    assert list(checkpoint.load()) == [V2_CLAIM]


def test_a_checksum_that_does_not_match_is_said_and_the_claims_adopted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = (NVIDIA_DATA / "checkpoint-v1.json").read_text().replace('"In"', '"NotIn"')
    checkpoint = copy_checkpoint(tmp_path, text)
    adopt(checkpoint, BOOT)
    (line,) = [TextFormatter().format(r)[25:] for r in caplog.records if r.levelname == "WARNING"]
    assert line == (
        "WARNING NVIDIA DRA driver checkpoint: checksum does not match; adopting its claims anyway"
        f" path={checkpoint.path} checksums=v1"
    )
    assert list(checkpoint.load()) == [V1_CLAIM]


def test_claims_of_another_boot_are_not_adopted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    checkpoint = copy_checkpoint(tmp_path, (NVIDIA_DATA / "checkpoint-v2.json").read_text())
    caplog.set_level("INFO")
    adopt(checkpoint, "9d3c0b1a-0000-4000-8000-000000000001")
    assert checkpoint.load() == {}
    assert any("from before the node's last boot" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "text",
    ['{"version": "nvdp/v1", "claims": {}}\n', "{not json", '{"checksum": 1}', ""],
    ids=["nvdp", "garbage", "no-version-part", "empty"],
)
def test_other_files_are_left_to_nvdps_reader(tmp_path: Path, text: str) -> None:
    checkpoint = copy_checkpoint(tmp_path, text)
    adopt(checkpoint, BOOT)
    assert checkpoint.path.read_text() == text
    assert not (tmp_path / "checkpoint.json.nvidia").exists()
