"""The command line of ``python -m progpo.sweep`` (see the package doc)."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict

from progpo.sweep.fidelity import FidelityObjective
from progpo.sweep.spec import load_spec
from progpo.sweep.trial import TrainerObjective, check_trainer_config

log = logging.getLogger(__package__)


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    hydra_overrides: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, hydra_overrides = args[:cut], args[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m progpo.sweep",
        description="Optuna sweep of the progpo trainer. Trainer (Hydra) overrides go after `--`.",
    )
    parser.add_argument("sweep_file", help="sweep definition, e.g. sweeps/progpo_alfworld.yaml")
    parser.add_argument("settings", nargs="*", help="key=value settings of the sweep file, e.g. n_trials=20")
    parser.add_argument("--log-level", default="INFO")
    opts = parser.parse_args(args)
    logging.basicConfig(level=opts.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from hydra.errors import HydraException

    try:
        spec = load_spec(opts.sweep_file, opts.settings)
        check_trainer_config(spec, hydra_overrides)
        # The one switch between the two kinds of sweep: a `fidelity:` section tunes credit fidelity on truth files.
        objective = (FidelityObjective(spec, hydra_overrides) if spec.fidelity is not None
                     else TrainerObjective(spec, hydra_overrides))
    except (ValueError, HydraException) as error:  # bad sweep file, bad override, invalid trainer config
        log.error("invalid sweep: %s", error)
        return 2
    result = objective.run()
    print(json.dumps(asdict(result), indent=2, default=str))  # noqa: T201 - CLI output
    return 0
