"""The command line of ``python -m progpo.bench``: one subcommand per benchmark; see the package doc."""

from __future__ import annotations

import argparse

import progpo.bench
from progpo.bench import credit, decoding, iteration

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m progpo.bench", description=progpo.bench.__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    credit.add_parsers(sub)
    iteration.add_parser(sub)
    decoding.add_parser(sub)
    args = parser.parse_args(argv)
    args.run(args)
