"""EnvPool: parallel stepping of real ALFWorld envs, worker crashes and hangs, clean shutdown."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass

import psutil
import pytest

from envs.alfworld import AlfWorldEnvFactory, find_games
from envs.alfworld.generate import TASK_TYPES
from envs.base import Observation, StepInfo, Task
from envs.pool import EnvPool


class ScriptedEnv:
    """Test double for the pool's failure paths (a real env cannot be made to hang on demand).

    ``"sleep"`` blocks far past any timeout, ``"raise"`` raises, ``"exit"`` kills the process from inside,
    anything else echoes; the episode ends after 5 steps.
    """

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s
        self.task: Task | None = None
        self.t = 0
        self.resets = 0

    def reset(self, task: Task) -> Observation:
        self.task, self.t = task, 0
        self.resets += 1
        text = f"start {task.task_id} resets {self.resets} pid {os.getpid()}"
        return Observation(text, ("a", "b"), "echo", task.task_type)

    def step(self, action: str):
        if action == "sleep":
            time.sleep(self.sleep_s)
        elif action == "raise":
            raise ValueError("scripted failure")
        elif action == "exit":
            os._exit(3)
        self.t += 1
        obs = Observation(f"{action} {self.t}", ("a", "b"), "echo", self.task.task_type)
        return obs, 0.0, self.t >= 5, StepInfo(extra={"pid": os.getpid()})

    def expert_action(self) -> str:
        return "a"

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ScriptedFactory:
    sleep_s: float = 60.0

    def __call__(self) -> ScriptedEnv:
        return ScriptedEnv(self.sleep_s)


def _tasks(n: int) -> list[Task]:
    return [Task(task_id=f"t{i}", task_type="echo") for i in range(n)]


def _our_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running() and p.status() != "zombie"]


def _play(pool: EnvPool, tasks: list[Task], limit: int = 60) -> list[list[tuple]]:
    """Follow the expert in every env; returns each env's transcript (obs text, reward, done, won)."""
    obs = pool.reset(tasks)
    transcripts = [[(o.text,)] for o in obs]
    active = set(range(len(tasks)))
    for _ in range(limit):
        if not active:
            break
        actions = pool.expert_actions(sorted(active))
        assert all(a is not None for a in actions.values())
        for i, (o, r, done, info) in pool.step(actions).items():
            transcripts[i].append((o.text, r, done, info.won))
            if done:
                active.discard(i)
    assert not active
    return transcripts


@pytest.mark.slow
def test_pool_plays_alfworld_like_in_process(alfworld_root):
    games = find_games(alfworld_root, "valid", TASK_TYPES)[:3]
    tasks = [games[i // 2] for i in range(6)]  # 3 tasks x 2 rollouts, as the collector lays them out
    factory = AlfWorldEnvFactory(max_steps=30)
    with EnvPool(factory, num_envs=6, num_workers=2) as pool:
        assert len(set(pool.worker_pids)) == 2
        parallel = _play(pool, tasks)
        again = _play(pool, tasks)  # second reset on the same games: cached, identical
    with EnvPool(factory, num_envs=6, num_workers=0) as local:
        sequential = _play(local, tasks)
    assert parallel == sequential == again
    assert all(t[-1][3] for t in parallel)  # every episode won
    assert parallel[0] == parallel[1]  # rollouts of one task with the same actions agree across envs


@pytest.mark.slow
def test_resized_pool_plays_alfworld_as_fresh_pools_do(alfworld_root):
    games = find_games(alfworld_root, "valid", TASK_TYPES)[:5]
    six = [games[i // 2] for i in range(6)]
    four = [games[3 + i // 2] for i in range(4)]  # other games, another batch size (the held-out set's)
    factory = AlfWorldEnvFactory(max_steps=30)
    with EnvPool(factory, num_envs=4, num_workers=2) as pool:
        pids = pool.worker_pids
        first = _play(pool, four)
        pool.resize(6)
        resized = _play(pool, six)
        pool.resize(4)
        back = _play(pool, four)
        assert pool.worker_pids == pids
    with EnvPool(factory, num_envs=6, num_workers=0) as local:
        fresh_six = _play(local, six)
    with EnvPool(factory, num_envs=4, num_workers=0) as local:
        fresh_four = _play(local, four)
    assert resized == fresh_six and first == back == fresh_four


def test_step_only_touches_named_envs_and_validates_input():
    with EnvPool(ScriptedFactory(), num_envs=4, num_workers=2) as pool:
        obs = pool.reset(_tasks(4))
        assert [o.text.split()[1] for o in obs] == ["t0", "t1", "t2", "t3"]
        assert obs[0].text.split()[-1] != obs[3].text.split()[-1]  # envs 0 and 3 live in different workers
        out = pool.step({3: "b", 0: "a"})
        assert list(out) == [3, 0] and out[3][0].text == "b 1" and out[0][0].text == "a 1"
        assert pool.step({1: "a"})[1][0].text == "a 1"  # env 1 was not stepped before
        assert pool.expert_actions([0, 2]) == {0: "a", 2: "a"}
        with pytest.raises(ValueError, match="one task per env"):
            pool.reset(_tasks(3))
        with pytest.raises(IndexError):
            pool.step({7: "a"})
        for _ in range(4):
            pool.step({0: "a"})
        with pytest.raises(RuntimeError, match="not in an episode"):
            pool.step({0: "a"})  # env 0 finished after 5 steps
    with pytest.raises(TypeError, match="picklable"):
        EnvPool(lambda: ScriptedEnv(0.0), num_envs=2, num_workers=1)


def _pid(obs: Observation) -> str:
    return obs.text.split()[-1]


def _resets(obs: Observation) -> int:
    return int(obs.text.split()[3])


def test_resize_keeps_the_workers_and_splits_envs_into_contiguous_blocks():
    with EnvPool(ScriptedFactory(), num_envs=4, num_workers=2) as pool:
        first = pool.reset(_tasks(4))
        pids = pool.worker_pids
        pool.step({0: "a"})
        pool.resize(7)
        assert pool.num_envs == 7 and pool.worker_pids == pids  # no new processes
        with pytest.raises(RuntimeError, match="not in an episode"):
            pool.step({0: "a"})  # resizing abandons the episodes in progress
        with pytest.raises(ValueError, match="one task per env"):
            pool.reset(_tasks(4))
        obs = pool.reset(_tasks(7))
        assert [o.text.split()[1] for o in obs] == [f"t{i}" for i in range(7)]
        # envs 0-3 in the first worker, 4-6 in the second (round(7/2) = 4)
        assert {_pid(o) for o in obs[:4]} == {_pid(first[0])} and {_pid(o) for o in obs[4:]} == {_pid(first[3])}
        assert pool.step({6: "b", 1: "a"})[6][0].text == "b 1"
        # an index keeps its env object while its worker owns it: 0-1 stayed in the first worker, 2-3 moved
        assert [_resets(o) for o in obs] == [2, 2, 1, 1, 1, 1, 1]
        pool.resize(4)
        assert [_resets(o) for o in pool.reset(_tasks(4))] == [3, 3, 2, 2]  # 2-3 back in the second worker
        pool.resize(1)
        with pytest.raises(IndexError):
            pool.step({1: "a"})
        assert pool.reset(_tasks(1))[0].text.startswith("start t0")
        assert pool.step({0: "a"})[0][0].text == "a 1"
        with pytest.raises(ValueError, match="num_envs must be >= 1"):
            pool.resize(0)
    with pytest.raises(RuntimeError, match="closed"):
        pool.resize(3)


def test_resize_up_starts_the_workers_a_small_pool_left_out_and_close_stops_them():
    pool = EnvPool(ScriptedFactory(), num_envs=1, num_workers=3)
    try:
        assert len(pool.worker_pids) == 1
        pool.reset(_tasks(1))
        pool.resize(6)
        pids = pool.worker_pids
        assert len(set(pids)) == 3 and pids[0] == pool.worker_pids[0]
        obs = pool.reset(_tasks(6))
        assert [_pid(o) for o in obs] == [str(p) for p in pids for _ in range(2)]
        assert {p.pid for p in _our_children()} >= set(pids)
    finally:
        pool.close()
    assert not set(pids) & {p.pid for p in _our_children()}


def test_in_process_pool_resizes():
    with EnvPool(ScriptedFactory(), num_envs=2, num_workers=0) as pool:
        pool.reset(_tasks(2))
        pool.resize(5)
        assert [o.text.split()[1] for o in pool.reset(_tasks(5))] == [f"t{i}" for i in range(5)]
        assert pool.step({4: "a"})[4][0].text == "a 1"


def test_env_exception_ends_only_that_episode():
    with EnvPool(ScriptedFactory(), num_envs=4, num_workers=2) as pool:
        pool.reset(_tasks(4))
        pids = pool.worker_pids
        out = pool.step({0: "raise", 1: "a", 2: "a"})
        obs, reward, done, info = out[0]
        assert done and reward == 0.0 and "ValueError: scripted failure" in info.extra["error"]
        assert obs.task_type == "echo" and obs.admissible_actions == ()
        assert not out[1][2] and not out[2][2] and "error" not in out[1][3].extra
        assert pool.worker_pids == pids  # the worker survived


def test_killed_worker_is_restarted_and_the_batch_goes_on():
    with EnvPool(ScriptedFactory(), num_envs=4, num_workers=2) as pool:
        pool.reset(_tasks(4))
        pool.step({i: "a" for i in range(4)})
        victim = pool.worker_pids[0]  # holds envs 0 and 1
        os.kill(victim, signal.SIGKILL)
        out = pool.step({0: "a", 2: "a", 3: "a"})
        assert out[0][2] and "died" in out[0][3].extra["error"] and out[0][1] == 0.0
        assert out[2][0].text == "a 2" and out[3][0].text == "a 2"  # the other worker's envs go on
        assert pool.worker_pids[0] != victim and psutil.pid_exists(pool.worker_pids[0])
        # Env 1 lived in the dead worker but was not in that call: it ends the next time it is stepped.
        lost = pool.step({1: "a"})[1]
        assert lost[2] and "died" in lost[3].extra["error"]
        # Exiting from inside a step is a crash too.
        crash = pool.step({2: "exit", 3: "a"})
        assert (
            crash[2][2] and "exit code 3" in crash[2][3].extra["error"] and crash[3][2]
        )  # 3 shared the worker
        obs = pool.reset(_tasks(4))  # restarted workers re-create their envs
        assert len(obs) == 4 and pool.step({0: "a", 1: "a"})[1][0].text == "a 1"


def test_hung_worker_times_out_without_stalling_the_others():
    with EnvPool(ScriptedFactory(sleep_s=60.0), num_envs=4, num_workers=2, step_timeout=1.5) as pool:
        pool.reset(_tasks(4))
        hung = pool.worker_pids[1]  # envs 2 and 3
        t0 = time.monotonic()
        out = pool.step({0: "a", 1: "a", 2: "sleep"})
        assert time.monotonic() - t0 < 15.0
        assert out[2][2] and "hung" in out[2][3].extra["error"]
        assert out[0][0].text == "a 1" and out[1][0].text == "a 1"
        assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == psutil.STATUS_ZOMBIE
        assert pool.step({3: "a"})[3][2]  # env 3 shared the hung worker: its episode is over
        pool.reset(_tasks(4))
        assert pool.step({2: "a", 3: "b"})[3][0].text == "b 1"


def test_close_leaves_no_process_behind():
    pool = EnvPool(ScriptedFactory(), num_envs=6, num_workers=3)
    pool.reset(_tasks(6))
    pids = pool.worker_pids
    assert {p.pid for p in _our_children()} >= set(pids)
    pool.close()
    pool.close()  # idempotent
    assert not mp.active_children()
    assert not set(pids) & {p.pid for p in _our_children()}
    with pytest.raises(RuntimeError, match="closed"):
        pool.reset(_tasks(6))
    # Also when the with-block raises, and when a worker hangs at that moment.
    with pytest.raises(KeyError):
        with EnvPool(ScriptedFactory(), num_envs=2, num_workers=2, step_timeout=0.5) as pool:
            pool.reset(_tasks(2))
            pids = pool.worker_pids
            pool.step({0: "sleep"})
            raise KeyError("boom")
    assert not mp.active_children()
    assert not (set(pids) | set(pool.worker_pids)) & {p.pid for p in _our_children()}


def test_in_process_mode_runs_without_workers():
    with EnvPool(ScriptedFactory(), num_envs=3, num_workers=0) as pool:
        obs = pool.reset(_tasks(3))
        assert pool.worker_pids == [] and all(o.text.endswith(str(os.getpid())) for o in obs)
        out = pool.step({0: "raise", 1: "a"})
        assert out[0][2] and "scripted failure" in out[0][3].extra["error"] and out[1][0].text == "a 1"


@pytest.mark.slow
def test_bench_runs(tmp_path, monkeypatch):
    from envs.bench import run

    monkeypatch.setenv("PROGPO_CACHE_DIR", str(tmp_path))
    res = run(n_envs=4, workers=1, rounds=1, group=2, seed=0, max_steps=4)
    assert 4 <= res["steps"] <= 16 and res["steps_per_s"] > 0  # 4 envs, at most 4 steps each
    assert res["first_reset_s"] > 0 and res["new_games_reset_s"] > 0
    assert not mp.active_children()


def _play_in_this_process(n_envs: int) -> tuple[str | None, list[str]]:
    with EnvPool(ScriptedFactory(), num_envs=n_envs, num_workers=2) as pool:
        obs = pool.reset(_tasks(n_envs))
    return mp.get_start_method(allow_none=True), [o.text for o in obs]


def test_pool_starts_inside_a_loky_worker():
    """Hydra's joblib launcher runs each job in a loky worker, whose start method is "loky", which a child cannot
    look up: the pool must start its env workers there all the same. Two jobs at once, as the launcher."""
    from joblib import Parallel, delayed

    results = Parallel(n_jobs=2, backend="loky")(delayed(_play_in_this_process)(2) for _ in range(2))
    for method, texts in results:
        assert method == "spawn"
        assert [t.split(" resets ")[0] for t in texts] == ["start t0", "start t1"]
