"""Generate (or check) the Python code for the kubelet device-plugin API.

    python api/generate.py           # write nvdp/api/v1beta1/api_pb2{,_grpc}.py
    python api/generate.py --check   # exit 1 when the committed code is stale

Needs the `dev` extra (grpcio-tools). The proto is mapped to the import path
`nvdp/api/v1beta1/api.proto` so the generated stubs import each other as
`nvdp.api.v1beta1.*`; the wire names (package v1beta1) are unchanged.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "api" / "deviceplugin" / "v1beta1"
OUT_PACKAGE = Path("nvdp") / "api" / "v1beta1"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_root: Path) -> None:
    from grpc_tools import protoc  # dev dependency, imported only here

    virtual = OUT_PACKAGE.as_posix()
    args = [
        "protoc",
        f"-I{virtual}={PROTO_DIR}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"{virtual}/api.proto",
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = []
        for name in GENERATED:
            fresh = Path(tmp) / OUT_PACKAGE / name
            committed = ROOT / OUT_PACKAGE / name
            if opts.check:
                if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False):
                    stale.append(str(committed.relative_to(ROOT)))
            else:
                shutil.copyfile(fresh, committed)
        if stale:
            print("stale generated code (run python api/generate.py): " + ", ".join(stale))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
