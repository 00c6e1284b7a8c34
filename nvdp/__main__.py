"""`python -m nvdp`: the `nvdp` command."""

from nvdp.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
