"""Generate (or check) the Python code for the kubelet's gRPC APIs nvdp speaks.

    python api/generate.py           # write nvdp/api/<package>/api_pb2{,_grpc}.py{,i}
    python api/generate.py --check   # exit 1 when the committed code is stale

Needs the `dev` extra (grpcio-tools). Each proto is mapped to the import path of its output package
(`nvdp/api/v1beta1/api.proto`, ...) so the generated stubs import each other as `nvdp.api.<package>.*`;
the wire names (the protos' packages) are unchanged.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (directory of the api.proto, the package its code goes to)
APIS = (
    ("deviceplugin/v1beta1", "nvdp/api/v1beta1"),
    ("dra/v1", "nvdp/api/dra/v1"),
    ("dra/v1beta1", "nvdp/api/dra/v1beta1"),
    ("dra-health/v1alpha1", "nvdp/api/dra/health_v1alpha1"),
    ("dra-health/v1", "nvdp/api/dra/health_v1"),
    ("pluginregistration/v1", "nvdp/api/dra/registration_v1"),
)
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_root: Path) -> None:
    from grpc_tools import protoc  # dev dependency, imported only here

    for proto_dir, virtual in APIS:
        args = [
            "protoc",
            f"-I{virtual}={ROOT / 'api' / proto_dir}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            f"{virtual}/api.proto",
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on api/{proto_dir}/api.proto")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = []
        for _, package in APIS:
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
