"""bench/_interleave.py: what the per-step benches share (interleaving, timing, ratios and their spread)."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from bench import _interleave as bench


def test_every_loop_leads_in_turn_and_every_block_is_kept():
    order: list[str] = []

    def loop(name: str, wall: float):
        def run() -> list[bench.Sample]:
            order.append(name)
            return [(wall, wall / 2)] * 3

        return run

    runs = bench.interleave({"a": loop("a", 2.0), "b": loop("b", 1.0), "c": loop("c", 4.0)}, blocks=3, warmup=1)
    assert order == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]  # a warm-up round, then rotated
    assert runs.names == ("a", "b", "c") and len(runs.blocks) == 3 and len(runs.samples["a"]) == 9
    assert runs.blocks[1] == {"b": (1.0, 0.5), "c": (4.0, 2.0), "a": (2.0, 1.0)}


def test_the_comparison_is_of_medians_with_the_block_spread_and_the_added_microseconds():
    runs = bench.Runs(("ours", "raw"))
    runs.add_block({"raw": [(1.0e-3, 0.8e-3)] * 5, "ours": [(1.01e-3, 0.81e-3)] * 5})
    runs.add_block({"ours": [(1.05e-3, 0.9e-3)] * 3 + [(9.0, 9.0)], "raw": [(1.0e-3, 0.8e-3)] * 4})  # one outlier step
    comparison = bench.Summary(runs.names, runs.vector()).compare("ours", "raw")
    assert comparison.ratio == pytest.approx(1.01)  # the median of 9 ours steps: 5 at 1.01 ms
    assert comparison.cpu_ratio == pytest.approx(0.81 / 0.8)
    assert (comparison.low, comparison.high) == (pytest.approx(1.01), pytest.approx(1.05))
    assert comparison.added_us == pytest.approx(10.0) and comparison.added_cpu_us == pytest.approx(10.0)
    first, second = comparison.lines("ratio ours/raw", 1.02)
    assert first == "ratio ours/raw: wall 1.0100 (blocks 1.010-1.050), CPU 1.0125  (target <= 1.02, wall and CPU: met)"
    assert second.endswith("added per step: +10.0 us wall, +10.0 us CPU")
    assert "NOT met" in comparison.lines("x", 1.011)[0]  # the wall ratio is under it, the CPU ratio is not
    # one rank: judged by the microseconds added, the larger of wall and CPU
    first, second = comparison.added_lines("one rank", 10.5)
    assert first == "one rank: wall 1.0100 (blocks 1.010-1.050) of a step without communication"
    assert second.endswith("added per step: +10.0 us wall, +10.0 us CPU  (target <= 10.5 us: met)")
    assert comparison.added_lines("one rank", 9.5)[1].endswith("(target <= 9.5 us: NOT met)")


def test_a_step_is_timed_in_wall_and_cpu_time_with_its_batch_fetched():
    def slow_batches():
        for i in range(3):
            time.sleep(0.01)  # waiting: wall time, not CPU time
            yield i

    seen: list[int] = []
    samples = bench.timed_steps(slow_batches(), seen.append)
    assert seen == [0, 1, 2] and len(samples) == 3
    assert all(wall >= 0.01 and cpu < wall for wall, cpu in samples)
    wall, cpu = bench.timed(lambda: sum(range(200_000)))
    assert wall > 0 and cpu > 0


def test_values_are_averaged_over_the_ranks_with_a_real_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert bench.mean_over_ranks([2.0, 4.5], dist.all_reduce, 1) == [2.0, 4.5]
    finally:
        dist.destroy_process_group()
