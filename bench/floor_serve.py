"""The floor plugin (bench/floor.py) as a process of its own, so that it pays the same process boundary
as `nvdp plugin` in bench/run.py.

`python -m bench.floor_serve --socket DIR/floor.sock --kubelet-socket DIR/kubelet.sock` serves, registers
with the kubelet (stand-in) and runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from bench.floor import RESOURCE, start_floor_plugin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--socket", required=True, type=Path, help="unix socket to serve on")
    parser.add_argument("--kubelet-socket", required=True, type=Path, help="kubelet.sock to register with")
    parser.add_argument("--resource", default=RESOURCE, help=f"resource name (default {RESOURCE})")
    parser.add_argument("--devices", type=int, default=8, help="devices in ListAndWatch (default 8)")
    parser.add_argument("--workers", type=int, default=32, help="gRPC worker threads (default 32, as nvdp)")
    args = parser.parse_args()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    plugin = start_floor_plugin(args.socket, devices=args.devices, workers=args.workers)
    try:
        plugin.register(args.kubelet_socket, args.resource)
        while not stop.wait(3600):
            pass
    finally:
        plugin.stop()
        args.socket.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
