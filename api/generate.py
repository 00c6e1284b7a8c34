"""Generate (or check) the Python code for the kubelet APIs nvdp speaks.

    python api/generate.py           # write the generated modules under nvdp/api/
    python api/generate.py --check   # exit 1 when the committed code is stale

Needs the `dev` extra (grpcio-tools). Each proto is mapped to an import path under `nvdp/api/` so the
generated stubs import each other as `nvdp.api.<package>.*`; the wire names (proto packages v1beta1
and v1) are unchanged:

- api/deviceplugin/v1beta1/api.proto -> nvdp/api/v1beta1/ (the device-plugin API)
- api/podresources/v1/api.proto -> nvdp/api/podresources_v1/ (the PodResources API)
- api/dra/v1, api/dra/v1beta1 -> nvdp/api/dra/v1, v1beta1 (the kubelet's DRA plugin API)
- api/dra-health/v1alpha1, v1 -> nvdp/api/dra/health_v1alpha1, health_v1 (DRA resource health)
- api/pluginregistration/v1 -> nvdp/api/dra/registration_v1 (the kubelet's plugin registration)
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# proto directory -> the package its code is generated into
APIS = {
    ROOT / "api" / "deviceplugin" / "v1beta1": Path("nvdp") / "api" / "v1beta1",
    ROOT / "api" / "podresources" / "v1": Path("nvdp") / "api" / "podresources_v1",
    ROOT / "api" / "dra" / "v1": Path("nvdp") / "api" / "dra" / "v1",
    ROOT / "api" / "dra" / "v1beta1": Path("nvdp") / "api" / "dra" / "v1beta1",
    ROOT / "api" / "dra-health" / "v1alpha1": Path("nvdp") / "api" / "dra" / "health_v1alpha1",
    ROOT / "api" / "dra-health" / "v1": Path("nvdp") / "api" / "dra" / "health_v1",
    ROOT / "api" / "pluginregistration" / "v1": Path("nvdp") / "api" / "dra" / "registration_v1",
}
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(proto_dir: Path, package: Path, out_root: Path) -> None:
    from grpc_tools import protoc  # dev dependency, imported only here

    virtual = package.as_posix()
    args = [
        "protoc",
        f"-I{virtual}={proto_dir}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"{virtual}/api.proto",
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {proto_dir / 'api.proto'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    opts = parser.parse_args(argv)
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for proto_dir, package in APIS.items():
            generate(proto_dir, package, Path(tmp))
            for name in GENERATED:
                fresh = Path(tmp) / package / name
                committed = ROOT / package / name
                if opts.check:
                    if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False):
                        stale.append(str(committed.relative_to(ROOT)))
                else:
                    committed.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(fresh, committed)
    if stale:
        print("stale generated code (run python api/generate.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
