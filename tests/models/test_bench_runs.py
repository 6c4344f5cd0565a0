"""The run the model benchmarks measure (``progpo.bench.runs``) and the decoding benchmark end to end."""

from __future__ import annotations

import tempfile
from pathlib import Path

import psutil
import pytest

from progpo.bench.cli import main as bench_main
from progpo.bench.runs import configured_run


def _bench_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("progpo-bench-*"))


@pytest.mark.slow
def test_configured_run_builds_the_overrides_run_and_closes_it_when_the_body_raises():
    before = _bench_dirs()
    with pytest.raises(RuntimeError, match="body failed"):
        with configured_run(["experiment=fast_dev", "seed=3", "rollout.num_workers=1"], threads=1) as (cfg, run):
            assert cfg.seed == 3 and cfg.logger._target_.endswith("no_logger")
            assert run.logger is None and Path(cfg.run_dir).is_dir()
            run.collector.warm_up(run.datamodule.train_batch().tasks, 1)  # starts the env workers
            workers = [psutil.Process(pid) for pid in run.collector._env_pool.worker_pids]
            assert workers and all(w.is_running() for w in workers)
            raise RuntimeError("body failed")
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    assert _bench_dirs() == before  # the temporary run folder is gone


@pytest.mark.slow
def test_bench_decoding_replays_one_rollout_through_both_loops(capsys):
    bench_main(["decoding", "experiment=fast_dev", "--repeats", "1", "--threads", "1"])
    out = capsys.readouterr().out
    assert out.startswith("# progpo.bench decoding: tiny,") and "1 thread(s)" in out
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in out.splitlines()
            if line.startswith("| transformers generate") or line.startswith("| KV-cache loop")}
    assert set(rows) == {"transformers generate (baseline)", "KV-cache loop (engine)"}
    generate, loop = rows["transformers generate (baseline)"], rows["KV-cache loop (engine)"]
    assert float(generate[0]) > 0 and float(loop[0]) > 0
    # the same recorded calls, the same grammar: the two loops generate about the same number of tokens
    assert abs(int(generate[1]) - int(loop[1])) <= 0.2 * int(generate[1])
    assert "KV-cache loop vs generate:" in out
