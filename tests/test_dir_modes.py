"""Issue 17 case 9: every directory nvdp creates is 0755, parents included, whatever the umask (under
umask 000 they used to be 0777: anyone could drop a CDI spec whose hooks the runtime runs as root).
Directories that exist already keep their mode."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import Process, clean_env, start_plugin, wait_until
from tests.builders import sim_gpus
from tests.cdi_support import make_node
from tests.mps_standin import Standin

GPU = "nvidia.com/gpu"
MPS4 = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 4\n"


def octal_mode(path: Path) -> str:
    return oct(stat.S_IMODE(os.stat(path).st_mode))


def test_make_dirs_ignores_the_umask_and_leaves_existing_directories_alone(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir(mode=0o700)
    code = (
        "import os, sys; from pathlib import Path; from nvdp.base.dirs import make_dirs; "
        "os.umask(0); make_dirs(Path(sys.argv[1])); make_dirs(Path(sys.argv[1]))"
    )
    target = kept / "a" / "b" / "c"
    done = subprocess.run([sys.executable, "-c", code, str(target)], env=clean_env(), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert [octal_mode(p) for p in (kept / "a", kept / "a" / "b", target)] == [oct(0o755)] * 3
    assert octal_mode(kept) == oct(0o700)


def test_make_dirs_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    from nvdp.base.dirs import make_dirs

    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        make_dirs(tmp_path / "file" / "sub")
    with pytest.raises(FileExistsError) as refused:
        make_dirs(tmp_path / "file")
    assert refused.value.filename == str(tmp_path / "file")


def test_plugin_makes_the_kubelet_and_cdi_directories_0755_under_umask_000(
    open_umask: None, sock_dir: Path, processes: list[Process]
) -> None:
    kubelet_dir = sock_dir / "kubelet" / "device-plugins"
    cdi_dir = sock_dir / "run" / "cdi"
    make_node(sock_dir / "root", sim_gpus("pcie-4"))
    plugin = start_plugin(
        kubelet_dir,
        "sim:pcie-4",
        log_path=sock_dir / "plugin.log",
        extra=[
            "--device-list-strategy=cdi-annotations",
            f"--cdi-spec-dir={cdi_dir}",
            f"--driver-root={sock_dir / 'root'}",
            f"--container-driver-root={sock_dir / 'no-mount'}",
        ],
    )
    processes.append(plugin)
    wait_until(lambda: "serving resource=" in plugin.log(), timeout=20, what="the serving line")
    made = [kubelet_dir.parent, kubelet_dir, cdi_dir.parent, cdi_dir]
    assert {str(p): octal_mode(p) for p in made} == {str(p): oct(0o755) for p in made}
    assert any(cdi_dir.iterdir()), "the spec was written there"
    assert octal_mode(sock_dir) == oct(0o700), "an existing directory keeps its mode"


def test_mps_control_daemon_makes_its_directories_0755_under_umask_000(
    open_umask: None, tmp_path: Path, processes: list[Process]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(MPS4)
    root = tmp_path / "run" / "nvidia" / "mps"
    standin = Standin(tmp_path / "standin")
    argv = [sys.executable, "-m", "nvdp.cli", "mps-control-daemon", "--nvml", "sim:pcie-4"]
    argv += ["--config-file", str(config), "--mps-root", str(root)]
    daemon = Process(argv, tmp_path / "daemon.log", standin.env(clean_env()))
    processes.append(daemon)
    marker = root / GPU / ".started"
    wait_until(marker.exists, timeout=20, what="the ready marker")
    made = [tmp_path / "run", tmp_path / "run" / "nvidia", root, root / "shm"]
    made += [root / "nvidia.com", root / GPU, root / GPU / "pipe", root / GPU / "log"]
    assert {str(p): octal_mode(p) for p in made} == {str(p): oct(0o755) for p in made}


def test_config_manager_destination_directory_0755_under_umask_000(tmp_path: Path) -> None:
    code = (
        "import os, sys; from nvdp.side.configmanager.files import link; "
        "os.umask(0); link(sys.argv[1], sys.argv[2])"
    )
    dst = tmp_path / "available" / "config" / "config.yaml"
    done = subprocess.run(
        [sys.executable, "-c", code, str(dst), "/etc/hostname"], env=clean_env(), capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()
    assert [octal_mode(dst.parent.parent), octal_mode(dst.parent)] == [oct(0o755)] * 2
