"""``EnvPool``: B x N text environments stepped in parallel by worker processes.

Each worker process owns a contiguous block of env indices (so the N rollouts of a task, which the collector
puts next to each other, share a worker and its per-process game caches) and talks to the pool over one pipe.
A call sends one command to every worker involved, then collects one message per env as it finishes.

Failure handling: an exception inside an env ends that env's episode (``done=True``, reward 0,
``StepInfo.extra["error"]``); a worker that dies, or sends nothing for ``step_timeout`` seconds, is killed and
restarted, the episodes it held end as failed (those not in the current call when they are next stepped),
and the call returns normally for all other envs. The next ``reset`` re-creates the restarted worker's envs.
``num_workers=0`` runs every env in the calling process (no timeouts; for debugging and tests).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import numbers
import pickle
import signal
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from envs.base import Env, Observation, StepInfo, Task

logger = logging.getLogger(__name__)

StepResult = tuple[Observation, float, bool, StepInfo]


def worker_context(start_method: str) -> Any:
    """The context the env workers start from. Inside a loky worker (Hydra's joblib launcher) the process-wide
    start method is "loky", which a spawned child inherits but cannot look up (it has not imported loky), so it
    died at start-up: this process goes back to the plain method first."""
    if mp.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        mp.set_start_method(start_method, force=True)
    return mp.get_context(start_method)


# -- worker side ----------------------------------------------------------------------------------------------
def _worker_main(conn: Connection, env_factory: Callable[[], Env], worker_id: int) -> None:
    """Serve commands until "close" or a closed pipe. One reply per env item, then ("done", seq)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    envs: dict[int, Env] = {}
    try:
        while True:
            try:
                seq, cmd, items = conn.recv()
            except (EOFError, OSError):
                break
            if cmd == "close":
                break
            for idx, arg in items:
                try:
                    out = _apply(envs, env_factory, cmd, idx, arg)
                    conn.send((seq, "ok", idx, out))
                except Exception as exc:  # noqa: BLE001 - reported to the parent, which ends the episode
                    msg = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
                    conn.send((seq, "error", idx, msg))
            conn.send((seq, "done", -1, None))
    finally:
        for env in envs.values():
            try:
                env.close()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        conn.close()


def _apply(envs: dict[int, Env], env_factory: Callable[[], Env], cmd: str, idx: int, arg: Any) -> Any:
    if cmd == "reset":
        if idx not in envs:
            envs[idx] = env_factory()
        return envs[idx].reset(arg)
    if cmd == "step":
        if idx not in envs:
            raise RuntimeError(f"env {idx} was never reset in this worker")
        return envs[idx].step(arg)
    if cmd == "expert":
        env = envs.get(idx)
        expert = getattr(env, "expert_action", None)
        return expert() if expert is not None else None
    raise ValueError(f"unknown pool command {cmd!r}")


# -- parent side ----------------------------------------------------------------------------------------------
STARTUP_GRACE_S = 120.0  # a fresh worker's first reply may include interpreter start-up and imports


@dataclass
class _Worker:
    worker_id: int
    indices: tuple[int, ...]
    process: Any = None
    conn: Connection | None = None
    fresh: bool = True  # no reply received yet: the first one gets STARTUP_GRACE_S

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def _stop_worker(worker: _Worker, grace: float = 2.0) -> None:
    """Ask a worker to exit, kill it if it does not, reap it, close its pipe. Safe to call twice."""
    proc, conn = worker.process, worker.conn
    if conn is not None:
        try:
            conn.send((-1, "close", []))
        except (OSError, ValueError):
            pass
    if proc is not None:
        proc.join(grace)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)
        try:
            proc.close()
        except ValueError:  # still running after SIGKILL + 5 s: leave it to the OS
            logger.warning("env worker %d (pid %s) did not exit", worker.worker_id, proc.pid)
    if conn is not None:
        conn.close()
    worker.process, worker.conn = None, None


def _shutdown(workers: list[_Worker]) -> None:
    for worker in workers:
        _stop_worker(worker)


class EnvPool:
    """``num_envs`` environments built by ``env_factory`` in ``num_workers`` processes.

    Args:
        env_factory: picklable zero-argument callable returning an ``envs.base.Env`` (runs in the workers).
        num_envs: number of environments (B x N).
        num_workers: worker processes (capped at ``num_envs``); 0 runs everything in this process.
        step_timeout: seconds a worker may go without finishing one env's reset/step before it counts as hung
            (a freshly started worker gets ``STARTUP_GRACE_S`` for its first reply).
        start_method: multiprocessing start method, "spawn" (default) or "forkserver" (never "fork": the
            TextWorld engine loads native libraries that must not be shared across a fork).
    """

    def __init__(
        self,
        env_factory: Callable[[], Env],
        num_envs: int,
        num_workers: int,
        step_timeout: float = 30.0,
        start_method: str = "spawn",
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 (0 = in-process), got {num_workers}")
        if step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 seconds, got {step_timeout}")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
        if not callable(env_factory):
            raise TypeError(f"env_factory must be a zero-argument callable, got {type(env_factory).__name__}")
        self.env_factory = env_factory
        self.num_envs = num_envs
        self.max_workers = num_workers  # the configured count; a pool resized up may start more, up to it
        self.num_workers = min(num_workers, num_envs)
        self.step_timeout = float(step_timeout)
        self._seq = 0
        self._closed = True  # until the finalizer exists; __del__ of a half-built pool must do nothing
        self._last_obs: dict[int, Observation] = {}
        self._active: set[int] = set()  # envs inside an episode (reset, not yet done)
        self._lost: dict[int, str] = {}  # active envs whose worker died while they were not being stepped
        self._local: dict[int, Env] = {}
        self._workers: list[_Worker] = []
        self._owner: list[int] = []  # env index -> its worker (``_assign``)
        if self.num_workers > 0:
            try:
                pickle.dumps(env_factory)
            except Exception as exc:
                raise TypeError(
                    f"env_factory must be picklable to reach the worker processes: {exc}"
                ) from exc
            self._ctx = worker_context(start_method)
            self._workers.extend(_Worker(w, ()) for w in range(self.num_workers))
            self._assign()
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        self._closed = False
        try:
            for worker in self._workers:
                self._start(worker)
        except BaseException:
            self.close()
            raise

    # -- public API -------------------------------------------------------------------------------------
    @property
    def worker_pids(self) -> list[int | None]:
        return [w.pid for w in self._workers]

    def resize(self, num_envs: int) -> None:
        """Hold ``num_envs`` environments from now on, in the running workers (starting more, up to the configured
        count, if the pool grew past its worker count). Episodes in progress are abandoned, as by ``reset``.

        Why: a run plays batches of several sizes (the held-out set, the training batch), and a fresh pool pays
        ~6 s to start its workers (spawn, imports) and ~50 ms per env for each env object's first reset (~11 s for
        128 envs on 2 workers, against ~1 s for a later reset onto new games). One pool resized between them pays
        that once: the workers stay, and an index keeps its env object in the worker that owns it. Indices are
        split into contiguous blocks as at construction, so a task's N copies share a worker's game cache; a
        worker keeps the env objects of indices it no longer owns and re-uses them (after a reset) when they
        come back to it.
        """
        self._check_open()
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if num_envs == self.num_envs:
            return
        self.num_envs = num_envs
        self._active.clear()
        self._lost.clear()
        self._last_obs.clear()
        wanted = min(self.max_workers, num_envs)
        if self._workers and wanted > len(self._workers):
            for w in range(len(self._workers), wanted):
                worker = _Worker(w, ())
                self._workers.append(worker)
                self._start(worker)
            self.num_workers = wanted
        self._assign()

    def reset(self, tasks: Sequence[Task]) -> list[Observation]:
        """Start an episode in every env (``tasks[i]`` for env ``i``)."""
        self._check_open()
        if len(tasks) != self.num_envs:
            raise ValueError(f"reset needs one task per env: got {len(tasks)} tasks for {self.num_envs} envs")
        self._lost.clear()
        self._active.clear()
        items = {i: tasks[i] for i in range(self.num_envs)}
        outcomes = self._run("reset", items)
        retry = {i: tasks[i] for i, (kind, _) in outcomes.items() if kind == "crash"}
        if retry:  # the worker was restarted: give its envs one more try on the fresh process
            logger.warning("retrying reset of %d envs after a worker failure", len(retry))
            outcomes.update(self._run("reset", retry))
        observations = []
        for i in range(self.num_envs):
            kind, payload = outcomes[i]
            if kind != "ok":
                raise RuntimeError(f"reset of env {i} (task {tasks[i].task_id!r}) failed: {payload}")
            observations.append(payload)
            self._last_obs[i] = payload
        self._active = set(range(self.num_envs))
        return observations

    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        """Step the named envs (the still-active ones) in parallel; returns a result for each of them."""
        self._check_open()
        self._check_indices(actions)
        results: dict[int, StepResult] = {}
        items = {}
        for idx, action in actions.items():
            if idx in self._lost:
                results[idx] = self._failed(idx, self._lost.pop(idx))
            elif idx not in self._active:
                raise RuntimeError(
                    f"env {idx} is not in an episode (finished or never reset): call reset first"
                )
            else:
                items[idx] = action
        for idx, (kind, payload) in self._run("step", items).items():
            results[idx] = payload if kind == "ok" else self._failed(idx, payload)
            if kind == "ok":
                self._last_obs[idx] = payload[0]
            if kind != "ok" or payload[2]:
                self._active.discard(idx)
        return {idx: results[idx] for idx in actions}

    def expert_actions(self, indices: Iterable[int]) -> dict[int, str | None]:
        """The expert's next action for each env (None where the env has no expert or its worker failed)."""
        self._check_open()
        indices = list(indices)
        self._check_indices(indices)
        outcomes = self._run("expert", {i: None for i in indices if i not in self._lost})
        return {i: outcomes[i][1] if i in outcomes and outcomes[i][0] == "ok" else None for i in indices}

    def close(self) -> None:
        """Stop every worker and close every env (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        for env in self._local.values():
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing must not mask what brought us here
                logger.debug("env close failed", exc_info=True)
        self._local.clear()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # weakref.finalize already covers garbage collection and interpreter exit; this keeps close() explicit.
        if not getattr(self, "_closed", True):
            self.close()

    # -- internals --------------------------------------------------------------------------------------
    def _assign(self) -> None:
        """Contiguous blocks of env indices, one per worker (a worker may get none when envs < workers)."""
        workers = len(self._workers)
        bounds = [round(i * self.num_envs / workers) for i in range(workers + 1)] if workers else []
        for w, worker in enumerate(self._workers):
            worker.indices = tuple(range(bounds[w], bounds[w + 1]))
        self._owner = [w for w, worker in enumerate(self._workers) for _ in worker.indices]

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("EnvPool is closed")

    def _check_indices(self, indices: Iterable[int]) -> None:
        bad = [i for i in indices if not (isinstance(i, numbers.Integral) and 0 <= i < self.num_envs)]
        if bad:
            raise IndexError(f"env indices {bad[:5]} out of range [0, {self.num_envs})")

    def _failed(self, idx: int, error: str) -> StepResult:
        last = self._last_obs.get(idx)
        obs = Observation(
            text="",
            admissible_actions=(),
            task_description=last.task_description if last else "",
            task_type=last.task_type if last else "",
        )
        return obs, 0.0, True, StepInfo(won=False, valid=True, extra={"error": error})

    def _start(self, worker: _Worker) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, self.env_factory, worker.worker_id),
            name=f"progpo-env-worker-{worker.worker_id}",
            daemon=True,
        )
        proc.start()
        child.close()
        worker.process, worker.conn, worker.fresh = proc, parent, True

    def _restart(self, worker: _Worker, reason: str, busy: Iterable[int]) -> None:
        """Replace a dead or hung worker; its active envs that were not in the failed call become lost."""
        logger.warning("env worker %d (pid %s) %s; restarting it", worker.worker_id, worker.pid, reason)
        _stop_worker(worker, grace=0.0)
        busy = set(busy)
        for idx in worker.indices:
            if idx in self._active and idx not in busy:
                self._lost[idx] = f"env worker {worker.worker_id} {reason} while this episode was running"
        self._start(worker)

    def _run(self, cmd: str, items: dict[int, Any]) -> dict[int, tuple[str, Any]]:
        """Run ``cmd`` on ``items`` ({env index: argument}); returns {index: (kind, payload)} where kind is
        "ok", "error" (the env raised) or "crash" (its worker died or hung and was restarted)."""
        if not items:
            return {}
        if self.num_workers == 0:
            return self._run_local(cmd, items)
        self._seq += 1
        seq = self._seq
        pending: dict[int, set[int]] = {}
        for idx in items:
            pending.setdefault(self._owner[idx], set()).add(idx)
        out: dict[int, tuple[str, Any]] = {}
        deadline: dict[int, float] = {}
        for w, idxs in pending.items():
            worker = self._workers[w]
            try:
                worker.conn.send((seq, cmd, [(i, items[i]) for i in sorted(idxs)]))
                grace = max(self.step_timeout, STARTUP_GRACE_S) if worker.fresh else self.step_timeout
                deadline[w] = time.monotonic() + grace
            except (OSError, ValueError) as exc:
                alive = worker.process is not None and worker.process.is_alive()
                self._fail_worker(worker, f"could not be reached ({exc})" if alive else "died", idxs, out)
        while deadline:
            by_conn = {self._workers[w].conn: w for w in deadline}
            sentinels = {self._workers[w].process.sentinel: w for w in deadline}
            timeout = max(0.0, min(deadline.values()) - time.monotonic())
            ready = wait(list(by_conn) + list(sentinels), timeout)
            for obj in ready:
                w = by_conn.get(obj)
                if w is None or w not in deadline:
                    continue
                worker = self._workers[w]
                try:
                    while worker.conn.poll():
                        mseq, kind, idx, payload = worker.conn.recv()
                        worker.fresh = False
                        if mseq != seq:
                            continue  # a reply to an earlier, abandoned call
                        if kind == "done":
                            deadline.pop(w)
                            break
                        out[idx] = (kind, payload)
                        pending[w].discard(idx)
                        deadline[w] = time.monotonic() + self.step_timeout
                except (EOFError, OSError):
                    deadline.pop(w, None)
                    self._fail_worker(worker, "died", pending[w], out)
            for obj in ready:  # a worker that exited without closing its pipe cleanly
                w = sentinels.get(obj)
                if w is not None and w in deadline:
                    deadline.pop(w)
                    self._fail_worker(self._workers[w], "died", pending[w], out)
            now = time.monotonic()
            for w in [w for w, t in deadline.items() if t <= now]:
                deadline.pop(w)
                self._fail_worker(
                    self._workers[w], f"hung (no reply for {self.step_timeout:.0f} s)", pending[w], out
                )
        return out

    def _fail_worker(self, worker: _Worker, reason: str, idxs: set[int], out: dict) -> None:
        code = None
        if worker.process is not None:
            if reason == "died":
                worker.process.join(1.0)  # reap it, so that the exit code is known
            code = worker.process.exitcode
        detail = f"env worker {worker.worker_id} (pid {worker.pid}) {reason}" + (
            f", exit code {code}" if code is not None else ""
        )
        for idx in idxs:
            out[idx] = ("crash", detail)
        self._restart(worker, reason, idxs)

    def _run_local(self, cmd: str, items: dict[int, Any]) -> dict[int, tuple[str, Any]]:
        out = {}
        for idx, arg in items.items():
            try:
                out[idx] = ("ok", _apply(self._local, self.env_factory, cmd, idx, arg))
            except Exception as exc:  # noqa: BLE001 - same contract as a worker: the episode ends
                out[idx] = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
        return out
