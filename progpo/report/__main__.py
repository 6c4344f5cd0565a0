"""``python -m progpo.report --experiment NAME``; see ``progpo.report.cli``."""

from progpo.report.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
