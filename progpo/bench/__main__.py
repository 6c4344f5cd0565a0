"""``python -m progpo.bench {credit,knn,iteration,decoding} ...``; see ``progpo.bench.cli``."""

from progpo.bench.cli import main

if __name__ == "__main__":
    main()
