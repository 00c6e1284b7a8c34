"""`nvdp gfd` as a process: oneshot, the loop with SIGHUP reload, atomic rewrites, a clear error for
an unwritable output, and the NodeFeature object through the real `kubernetes` client."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nvdp.side.gfd.output import write_atomically
from testkit import REPO, Process, clean_env, wait_until
from tests.kube_api_nodefeature import KubeApi

DATA = REPO / "tests" / "data" / "gfd"
TS_CONFIG = (DATA / "configs" / "ts.yaml").read_text()
PLAIN_CONFIG = "version: v1\n"
NODE_FEATURE = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu-ns/nodefeatures/nvidia-features-for-node-a"


def gfd_argv(*extra: str, nvml: str = "sim:pcie-4") -> list[str]:
    """`nvdp gfd` on a simulated node, with this checkout's machine-type file."""
    return [
        sys.executable, "-m", "nvdp.cli", "gfd", "--nvml", nvml,
        "--machine-type-file", str(DATA / "product_name"), *extra,
    ]  # fmt: skip


_INHERITED = ("NODE_NAME", "POD_NAME", "POD_NAMESPACE", "NAMESPACE", "MPS_ROOT", "NVDP_SIM_EVENTS")


def gfd_env(**extra: str) -> dict[str, str]:
    """A clean environment (no inherited GFD_*, Kubernetes, node or simulation variables) plus `extra`."""
    env = clean_env()
    for name in list(env):
        if name.startswith(("GFD_", "KUBE")) or name in _INHERITED:
            del env[name]
    env.update(extra)
    return env


def _without_timestamp(text: str) -> str:
    return "".join(line for line in text.splitlines(True) if not line.startswith("nvidia.com/gfd.timestamp="))


def test_oneshot_writes_the_file_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    result = subprocess.run(
        [*gfd_argv("--oneshot", "--output-file", str(out))],
        env=gfd_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert _without_timestamp(text) == (DATA / "pcie-4-none.labels").read_text()
    assert [line for line in text.splitlines() if line.startswith("nvidia.com/gfd.timestamp=")][0][
        25:
    ].isdigit()
    assert not list(tmp_path.glob(".gfd-*")), "a temp file was left behind"


def test_unwritable_output_dir_is_one_clear_error_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "gfd"
    result = subprocess.run(
        gfd_argv("--oneshot", "--output-file", str(out)),
        env=gfd_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].endswith(
        f'exiting error="cannot write labels to {out}: Not a directory"'
    )
    assert "Traceback" not in result.stderr


def test_bad_flag_value_is_one_line() -> None:
    argv = gfd_argv("--sleep-interval", "soon")
    result = subprocess.run(argv, env=gfd_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == 'error: --sleep-interval / GFD_SLEEP_INTERVAL: invalid duration "soon"\n'


def test_loop_rewrites_on_sighup_never_half_written_and_removes_the_file_on_stop(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(PLAIN_CONFIG)
    out = tmp_path / "gfd"
    plain = (DATA / "pcie-4-none.labels").read_text()
    seen: set[str] = set()
    torn: list[str] = []
    done = threading.Event()

    def read_forever() -> None:
        while not done.is_set():
            try:
                text = _without_timestamp(out.read_text())
            except FileNotFoundError:
                continue
            seen.add(text)
            if not text.endswith("\n") or "nvidia.com/vgpu.present=false\n" not in text:
                torn.append(text)

    reader = threading.Thread(target=read_forever, daemon=True)
    reader.start()
    argv = gfd_argv("--output-file", str(out), "--config-file", str(config), "--sleep-interval", "1h")
    with Process(argv, tmp_path / "gfd.log", gfd_env()) as gfd:
        try:
            wait_until(lambda: out.exists(), 30, "first label file")
            for n in range(6):  # each reload flips the sharing config, so each one rewrites the file
                config.write_text(TS_CONFIG if n % 2 == 0 else PLAIN_CONFIG)
                gfd.send(signal.SIGHUP)
                want = "nvidia.com/gpu.replicas=4\n" if n % 2 == 0 else "nvidia.com/gpu.replicas=1\n"
                wait_until(lambda want=want: want in out.read_text(), 30, f"labels after reload {n}")
            # A burst of signals lands anywhere in the loop, even inside its own waiting: the
            # handlers must never deadlock the process (threading.Event.set() from a handler can).
            for _ in range(200):
                gfd.send(signal.SIGHUP)
            assert gfd.alive()
            gfd.send(signal.SIGTERM)
            assert gfd.wait(20) == 0
        finally:
            done.set()
            reader.join(5)
            print(gfd.log()[-4000:])  # shown when the test fails
        log = gfd.log()
    assert torn == [], "a reader saw a partial file"
    assert plain in seen and len(seen) == 2
    assert not out.exists(), "the label file outlived the process"
    assert log.count("SIGHUP received; reloading") >= 6 and "Traceback" not in log


def test_atomic_write_under_a_concurrent_reader(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    contents = ["a" * 200_000 + "\n", "b" * 300_000 + "\n"]
    write_atomically(path, contents[0])
    bad: list[int] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            text = path.read_text()
            if text not in contents:
                bad.append(len(text))

    reader = threading.Thread(target=read)
    reader.start()
    for n in range(200):
        write_atomically(path, contents[n % 2])
    done.set()
    reader.join()
    assert bad == []
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_node_feature_created_updated_and_retried_through_the_api(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(PLAIN_CONFIG)
    with KubeApi() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        env = gfd_env(KUBECONFIG=str(kubeconfig), NODE_NAME="node-a", KUBERNETES_NAMESPACE="gpu-ns")
        argv = gfd_argv("--use-node-feature-api", "--config-file", str(config), "--sleep-interval", "1h")
        with Process(argv, tmp_path / "gfd.log", env) as gfd:
            created = wait_until(lambda: api.get(NODE_FEATURE), 30, "NodeFeature created")
            assert created["kind"] == "NodeFeature" and created["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
            assert created["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": "node-a"}
            assert created["spec"]["labels"]["nvidia.com/gpu.replicas"] == "1"
            assert created["spec"]["labels"]["nvidia.com/gpu.count"] == "4"

            config.write_text(TS_CONFIG)
            gfd.send(signal.SIGHUP)
            wait_until(
                lambda: (
                    (api.get(NODE_FEATURE) or {})
                    .get("spec", {})
                    .get("labels", {})
                    .get("nvidia.com/gpu.replicas")
                    == "4"
                ),
                30,
                "NodeFeature updated",
            )
            methods = [r.method for r in api.requests_to("nodefeatures")]
            assert methods == ["GET", "POST", "GET", "PUT"]

            api.fail_next(1, 500)
            config.write_text(PLAIN_CONFIG)
            gfd.send(signal.SIGHUP)
            wait_until(
                lambda: (
                    (api.get(NODE_FEATURE) or {})
                    .get("spec", {})
                    .get("labels", {})
                    .get("nvidia.com/gpu.replicas")
                    == "1"
                ),
                30,
                "NodeFeature updated after an API error",
            )
            statuses = [(r.method, r.status) for r in api.requests_to("nodefeatures")][4:]
            assert statuses == [("GET", 500), ("GET", 200), ("PUT", 200)]
            log = gfd.log()
            assert "NodeFeature update failed; retrying" in log and "API error 500" in log
            gfd.send(signal.SIGTERM)
            assert gfd.wait(10) == 0
        assert api.get(NODE_FEATURE) is not None, "NVIDIA leaves the NodeFeature in place on exit"


@pytest.mark.parametrize(
    ("env", "error"),
    [
        pytest.param(
            {"KUBERNETES_NAMESPACE": "gpu-ns"},
            "error: --use-node-feature-api: the node name is required (--node-name / NODE_NAME)\n",
            id="no-node",
        ),
    ],
)
def test_node_feature_api_needs_node_name(env: dict[str, str], error: str) -> None:
    result = subprocess.run(
        gfd_argv("--use-node-feature-api", "--oneshot"),
        env=gfd_env(**env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stderr) == (1, error)


def test_simulate_shows_the_node_labels() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "simulate", "--profile", "pcie-4"],
        env=gfd_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    block = result.stdout.split("Node labels (what `nvdp gfd` writes for this node)\n", 1)[1]
    assert "  nvidia.com/gpu.product=NVIDIA-L40S\n" in block
    assert "  nvidia.com/gpu.count=4\n" in block and "  nvidia.com/gpu.family=ada-lovelace\n" in block
