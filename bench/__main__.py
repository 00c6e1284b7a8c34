"""`python -m bench`: run every benchmark and print one table (see bench/run.py)."""

from bench.run import main

raise SystemExit(main())
