"""The analysis of a comparison, as pure functions of its trials: speed-ups, bootstrap intervals, verdicts.

One orientation everywhere: a **speed-up of A over B** is `median(B's seconds) / median(A's seconds)`:
above 1, A (the side named first) did the same work faster.

An interval says how far the speed-up could move if the trials were drawn again: a percentile
bootstrap of the ratio of medians. Interleaved trials (A B A B ...) are resampled as pairs (trial i
of A with trial i of B, run back to back), so slow drift of the machine moves both sides of a pair
together instead of widening the interval. A verdict against a target is `met` or `missed` only
when the whole interval lies on one side of it; otherwise `not resolved`.
"""
from __future__ import annotations

import random
import statistics

MET, MISSED, UNRESOLVED = "met", "missed", "not resolved"
LEVEL = 0.95
RESAMPLES = 10_000


def speedup(first_s: list[float], second_s: list[float]) -> float:
    """How many times faster the first side did the same work: median(second) / median(first)."""
    if not first_s or not second_s:
        raise ValueError("a speed-up needs at least one trial on each side")
    if min(first_s) <= 0 or min(second_s) <= 0:
        raise ValueError(f"trial seconds must be positive: {first_s} vs {second_s}")
    return statistics.median(second_s) / statistics.median(first_s)


def bootstrap_interval(first_s: list[float], second_s: list[float], level: float = LEVEL,
                       resamples: int = RESAMPLES, seed: int = 0, paired: bool | None = None) -> tuple[float, float]:
    """The `level` percentile-bootstrap interval of `speedup(first_s, second_s)`.

    `paired` (default: when both sides have as many trials) resamples trial indices, keeping each
    interleaved pair together; otherwise each side is resampled on its own. Seeded: the same trials
    give the same interval."""
    paired = len(first_s) == len(second_s) if paired is None else paired
    if paired and len(first_s) != len(second_s):
        raise ValueError(f"paired trials need as many on each side: {len(first_s)} vs {len(second_s)}")
    rng = random.Random(seed)
    n_a, n_b = len(first_s), len(second_s)
    draws = []
    for _ in range(resamples):
        if paired:
            idx = [rng.randrange(n_a) for _ in range(n_a)]
            a, b = [first_s[i] for i in idx], [second_s[i] for i in idx]
        else:
            a = [first_s[rng.randrange(n_a)] for _ in range(n_a)]
            b = [second_s[rng.randrange(n_b)] for _ in range(n_b)]
        draws.append(speedup(a, b))
    draws.sort()
    tail = (1 - level) / 2
    lo = draws[int(tail * (resamples - 1))]
    hi = draws[int(round((1 - tail) * (resamples - 1)))]
    return lo, hi


def rounds_speedup(runs: list[tuple[list[float], list[float]]]) -> float:
    """The speed-up of the first side over several runs: the median over every round of every run
    of the round's ratio (second's seconds / first's), so a run on a faster machine weighs no more
    than one on a slower machine. `runs`: per run, each side's trials in round order."""
    rounds = [(a, b) for first_s, second_s in runs for a, b in zip(first_s, second_s, strict=True)]
    if not rounds or min(min(r) for r in rounds) <= 0:
        raise ValueError("a speed-up over runs needs positive trials, at least one round")
    return statistics.median(b / a for a, b in rounds)


def runs_interval(runs: list[tuple[list[float], list[float]]], level: float = LEVEL, resamples: int = RESAMPLES,
                  seed: int = 0) -> tuple[float, float]:
    """The `level` interval of `rounds_speedup` by a two-level bootstrap: draw runs with
    replacement, then each drawn run's rounds. A run's own interval covers the noise between its
    rounds; this one also covers the noise between runs (a new process on a new machine)."""
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        drawn = []
        for first_s, second_s in (runs[rng.randrange(len(runs))] for _ in runs):
            idx = [rng.randrange(len(first_s)) for _ in first_s]
            drawn.append(([first_s[i] for i in idx], [second_s[i] for i in idx]))
        draws.append(rounds_speedup(drawn))
    draws.sort()
    tail = (1 - level) / 2
    return draws[int(tail * (resamples - 1))], draws[int(round((1 - tail) * (resamples - 1)))]


def verdict(interval: tuple[float, float], target: float) -> str:
    """`met` when the whole interval is at or above `target` (a speed-up the first side must reach),
    `missed` when it is wholly below, else `not resolved` (the trials cannot tell)."""
    lo, hi = interval
    if lo >= target:
        return MET
    if hi < target:
        return MISSED
    return UNRESOLVED


def beside_one(interval: tuple[float, float]) -> int:
    """Where an interval of a speed-up lies against 1 (the two sides equally fast): +1 wholly above
    (the first side measurably faster), -1 wholly below (measurably slower), 0 when it holds 1."""
    lo, hi = interval
    return 1 if lo > 1 else -1 if hi < 1 else 0


def interval_text(speedup: float, interval) -> str:
    """'1.02x [0.98, 1.05]': a speed-up and its interval, as tables and sentences show them."""
    return f"{speedup:.2f}x [{interval[0]:.2f}, {interval[1]:.2f}]"


def and_text(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c': a list as a sentence names it."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def rollouts_text(n: int) -> str:
    """'1 rollout' / '128 rollouts': a block's batch, as tables, titles and sentences name it."""
    return "1 rollout" if n == 1 else f"{n} rollouts"


def rollouts_list_text(batches: list[int]) -> str:
    """'1 rollout' / '32 and 128 rollouts': several blocks' batches in one phrase."""
    return and_text([str(b) for b in batches]) + (" rollout" if list(batches) == [1] else " rollouts")


def compare(first_s: list[float], second_s: list[float], target: float | None = None) -> dict:
    """The speed-up of the first side over the second, its 95% interval, its verdict against `target`."""
    interval = bootstrap_interval(first_s, second_s)
    return dict(speedup=speedup(first_s, second_s), interval=interval,
                verdict=None if target is None else verdict(interval, target))
