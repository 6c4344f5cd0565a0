"""``python -m progpo.sweep SWEEP.yaml [key=value ...] [-- trainer overrides ...]``; see ``progpo.sweep.cli``."""

from progpo.sweep.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
