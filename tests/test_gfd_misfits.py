"""`nvdp gfd` on a mixed fleet, as processes: strict about the config's form, tolerant about the node's
facts. A config entry that does not fit a node (a sharing entry for a resource it lacks, a MIG-enabled
GPU without MIG devices, MPS without an MPS root on a node that only gets labelled) never stops the
labels: each misfit is one WARNING line (once, not once per pass) and a Node event where the API
server is reachable, and the rest of the node is labelled. A disk that cannot take the labels keeps
the last ones. `nvdp config check --nvml` prints the same misfits as warnings and exits 0."""

from __future__ import annotations

import resource
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nvdp.cli import main
from testkit import REPO, Process, wait_until
from tests.kube_api_standin import KubeApiStandin
from tests.test_gfd_process import gfd_argv, gfd_env

DATA = REPO / "tests" / "data" / "gfd"
CASE1 = DATA / "configs" / "ts-unmatched.yaml"  # nvidia.com/gpu x2 and nvidia.com/mig-1g.5gb x4
CASE1_WARNING = (
    "sharing.timeSlicing.resources[1]: nvidia.com/mig-1g.5gb matches no resource on this node; entry not "
    "applied (it could match: nvidia.com/gpu) reason=SharingEntryUnmatched"
)
MPS_ENTRY = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
# One ConfigMap for the whole fleet.
FLEET_ENTRIES = {
    "default": "version: v1\n",
    "time-slicing": CASE1.read_text(),
    "mps": MPS_ENTRY,
    "mig-single": "version: v1\nflags:\n  migStrategy: single\n",
    "mig-mixed": "version: v1\nflags:\n  migStrategy: mixed\n",
}
FLEET_NODES = {
    "dgx-a100": "sim:dgx-a100",
    "dgx-a100-mig": "sim:dgx-a100-mig",
    "dgx-a100-repartition": f"sim:{DATA / 'nodes' / 'dgx-a100-repartition.yaml'}",  # GPU 0 between layouts
    "pcie-4": "sim:pcie-4",
    "dgx-h100": "sim:dgx-h100",
}


def _labels_in(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines())
    return {k: v for k, v in pairs if k != "nvidia.com/gfd.timestamp"}


def _oneshot(nvml: str, config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    argv = gfd_argv("--oneshot", "--config-file", str(config), "--output-file", str(out), nvml=nvml)
    return subprocess.run(argv, env=gfd_env(), cwd=REPO, capture_output=True, text=True, timeout=60)


def _warnings(stderr: str) -> list[str]:
    return [line.split(" WARNING ", 1)[1] for line in stderr.splitlines() if " WARNING " in line]


def test_an_entry_for_a_resource_the_node_lacks_is_one_warning_and_the_rest_is_labelled(
    tmp_path: Path,
) -> None:
    out = tmp_path / "gfd"
    result = _oneshot("sim:dgx-a100", CASE1, out)
    assert result.returncode == 0, result.stderr
    labels = _labels_in(out.read_text())
    assert labels == _labels_in((DATA / "dgx-a100-none-ts-unmatched.labels").read_text())
    assert labels["nvidia.com/gpu.replicas"] == "2"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"
    assert _warnings(result.stderr) == [CASE1_WARNING]


def test_mps_is_labelled_without_an_mps_root(tmp_path: Path) -> None:
    config = tmp_path / "mps.yaml"
    config.write_text(MPS_ENTRY)
    out = tmp_path / "gfd"
    result = _oneshot("sim:dgx-a100", config, out)
    assert result.returncode == 0, result.stderr
    labels = _labels_in(out.read_text())
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"
    assert labels["nvidia.com/mps.capable"] == "true"
    assert labels["nvidia.com/gpu.replicas"] == "4"


def test_mps_form_errors_are_still_refused(tmp_path: Path) -> None:
    config = tmp_path / "mps.yaml"
    config.write_text(MPS_ENTRY + "flags:\n  migStrategy: mixed\n")
    result = _oneshot("sim:dgx-a100", config, tmp_path / "gfd")
    assert result.returncode == 1
    assert result.stderr == (
        'error: sharing.mps: MPS sharing is not supported with MIG strategy "mixed" '
        "(--mig-strategy / MIG_STRATEGY / flags.migStrategy)\n"
    )


def _fleet_run(tmp_path: Path, node: str, entry: str) -> tuple[str, str, subprocess.CompletedProcess[str]]:
    out = tmp_path / f"{node}-{entry}.labels"
    return node, entry, _oneshot(FLEET_NODES[node], tmp_path / entry, out)


@pytest.mark.soak  # 25 processes: about 5 s of CPU
def test_one_configmap_labels_every_node_of_a_mixed_fleet(tmp_path: Path) -> None:
    for name, text in FLEET_ENTRIES.items():
        (tmp_path / name).write_text(text)
    runs = [(node, entry) for node in FLEET_NODES for entry in FLEET_ENTRIES]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda run: _fleet_run(tmp_path, *run), runs))
    warned: dict[tuple[str, str], list[str]] = {}
    for node, entry, result in results:
        assert result.returncode == 0, f"{node} / {entry}: {result.stderr}"
        assert " ERROR " not in result.stderr and "Traceback" not in result.stderr, f"{node} / {entry}"
        labels = _labels_in((tmp_path / f"{node}-{entry}.labels").read_text())
        assert labels["nvidia.com/gpu.product"].startswith("NVIDIA-"), f"{node} / {entry}"
        warned[node, entry] = [w for w in _warnings(result.stderr) if "reason=" in w]
    # What did not apply is named: the MIG entry on nodes without 1g.5gb MIG devices...
    for node in ("dgx-a100", "pcie-4", "dgx-h100", "dgx-a100-mig", "dgx-a100-repartition"):
        assert any("reason=SharingEntryUnmatched" in w for w in warned[node, "time-slicing"]), node
    # ... and the GPU between MIG layouts, wherever the strategy looks for MIG devices.
    for entry in ("mig-single", "mig-mixed"):
        assert [w for w in warned["dgx-a100-repartition", entry] if "MigWithoutDevices" in w] == [
            "GPU 0 (GPU-925be680-6786-5653-edfc-0f1c7087259e) has MIG enabled but no MIG devices yet; not "
            "advertised until they are created reason=MigWithoutDevices"
        ]
    # Nodes the config fits entirely are labelled without a word.
    assert warned["dgx-a100", "default"] == warned["pcie-4", "mps"] == warned["dgx-h100", "mig-mixed"] == []


def test_config_check_prints_misfits_as_warnings_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(CASE1), "--nvml", "sim:dgx-a100"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{CASE1}: ok, 1 resource(s) (migStrategy none)",
        "  nvidia.com/gpu: 16 device(s) time-slicing x2",
        "  warning: " + CASE1_WARNING.removesuffix(" reason=SharingEntryUnmatched"),
    ]


# ---- the loop: misfits once, Node events, MIG devices picked up, a full disk -----------------------


def _passes(log: str) -> int:
    """Labelling passes so far: each one opens NVML."""
    return log.count("simulated NVML initialized")


def test_loop_reports_a_misfit_once_with_a_node_event_and_labels_mig_devices_once_they_appear(
    tmp_path: Path,
) -> None:
    node_file = tmp_path / "node.yaml"
    layout = (DATA / "nodes" / "dgx-a100-repartition.yaml").read_text()
    node_file.write_text(layout)
    out, node = tmp_path / "gfd", f"sim:{node_file}"
    argv = gfd_argv("--mig-strategy", "mixed", "--output-file", str(out), "--sleep-interval", "1h", nvml=node)
    with KubeApiStandin() as api:
        env = gfd_env(KUBECONFIG=str(api.write_kubeconfig(tmp_path / "kubeconfig")), NODE_NAME="node-a")
        with Process(argv, tmp_path / "gfd.log", env) as gfd:
            try:
                wait_until(lambda: out.exists(), 30, "first labels")
                assert "nvidia.com/mig-1g.5gb.count=1\n" in out.read_text()  # GPU 2's
                api.wait_for(lambda: api.created, 30, "the Node event")
                for n in range(2, 4):  # more passes: no second warning, no second event
                    gfd.send(signal.SIGHUP)
                    wait_until(lambda n=n: _passes(gfd.log()) >= n, 30, f"pass {n}")
                # mig-manager creates GPU 0's MIG devices: the next pass labels them
                node_file.write_text(layout.replace("mig: []", "mig: [1g.5gb, 1g.5gb, 1g.5gb]", 1))
                gfd.send(signal.SIGHUP)
                wait_until(
                    lambda: "nvidia.com/mig-1g.5gb.count=4\n" in out.read_text(), 30, "GPU 0's MIG devices"
                )
                gfd.send(signal.SIGTERM)
                assert gfd.wait(20) == 0
            finally:
                print(gfd.log()[-4000:])  # shown when the test fails
            log = gfd.log()
        events = [e for e in api.created if e["kind"] == "Event"]
    warnings = [line for line in log.splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and "reason=MigWithoutDevices" in warnings[0], "one warning across passes"
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "MigWithoutDevices")]
    assert events[0]["involvedObject"]["name"] == "node-a" and events[0]["involvedObject"]["kind"] == "Node"
    assert events[0]["source"]["component"] == "gpu-feature-discovery"
    assert "GPU 0 (" in events[0]["message"] and "no MIG devices yet" in events[0]["message"]
    assert 'resolved reason=MigWithoutDevices subject="GPU 0"' in log


class PipedGfd:
    """`nvdp gfd` with its log on a pipe: a file size limit (the full disk below) does not hold a pipe."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.lines.append(line)

    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(20)
        finally:
            if self.popen.poll() is None:
                self.popen.kill()
            self._reader.join(10)


def test_a_full_disk_keeps_the_last_labels_and_retries(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    out = tmp_path / "gfd"
    argv = gfd_argv("--config-file", str(config), "--output-file", str(out), "--sleep-interval", "1h")
    gfd = PipedGfd(argv, gfd_env())
    try:
        wait_until(lambda: out.exists(), 30, "first labels")
        before = out.read_text()
        # The disk fills up: no file of the process may grow past 64 bytes (EFBIG, where a full disk
        # gives ENOSPC: the same failed write(2) in the middle of the temp file).
        unlimited = resource.RLIM_INFINITY
        resource.prlimit(gfd.popen.pid, resource.RLIMIT_FSIZE, (64, unlimited))
        config.write_text((DATA / "configs" / "ts.yaml").read_text())  # new labels to write
        for n in range(2, 5):  # three passes that cannot write (a pass starts after the last one wrote)
            gfd.popen.send_signal(signal.SIGHUP)
            wait_until(lambda n=n: _passes(gfd.log()) >= n, 30, f"pass {n}")
        wait_until(lambda: "labels not published" in gfd.log(), 30, "the failure line")
        assert gfd.popen.poll() is None, "a full disk does not end the process"
        assert out.read_text() == before, "the last good labels stay"
        # a pass may be writing its temp file right now; none stays behind
        wait_until(lambda: not list(tmp_path.glob(".gfd-*")), 30, "the temp files removed")
        resource.prlimit(gfd.popen.pid, resource.RLIMIT_FSIZE, (unlimited, unlimited))  # room again
        gfd.popen.send_signal(signal.SIGHUP)
        wait_until(
            lambda: "nvidia.com/gpu.replicas=4\n" in out.read_text(), 30, "labels once the disk has room"
        )
    finally:
        status = gfd.stop()
        print(gfd.log()[-4000:])  # shown when the test fails
    assert status == 0
    log = gfd.log()
    failures = [line for line in log.splitlines() if "labels not published" in line]
    assert len(failures) == 1, "one line per failure, not per retry"
    assert " ERROR " in failures[0] and "File too large" in failures[0]
    assert log.count("labels published again") == 1
    assert "Traceback" not in log
