"""preflight: the bus-bandwidth arithmetic, the node-pair schedule, finding one slow node, the verdict."""

from __future__ import annotations

from itertools import combinations

import pytest

from hpc_train.config.loader import load_site
from hpc_train.config.models import Preflight
from hpc_train.fabric.preflight import (
    evaluate,
    expected_for,
    find_slow_nodes,
    format_table,
    human,
    max_size_for,
)
from hpc_train.runtime.preflight_job import (
    bandwidth,
    parse_size,
    sizes_up_to,
    tournament,
)


def test_busbw_is_nccl_tests_definition():
    algbw, busbw = bandwidth(1 << 30, 0.1, 16)
    assert algbw == pytest.approx((1 << 30) / 0.1 / 1e9)
    assert busbw == pytest.approx(algbw * 2 * 15 / 16)
    assert bandwidth(1000, 1.0, 2)[1] == pytest.approx(1e-6)  # 2 ranks: busbw == algbw


def test_sizes_start_at_1mb_and_end_at_the_largest():
    assert sizes_up_to(parse_size("16M")) == [1 << 20, 4 << 20, 16 << 20]
    assert sizes_up_to(parse_size("2G"))[-1] == 2 << 30 and sizes_up_to(parse_size("2G"))[0] == 1 << 20
    assert [human(s) for s in sizes_up_to(parse_size("100M"))] == ["1M", "4M", "16M", "64M", "100M"]


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
def test_tournament_covers_every_pair_once_in_disjoint_rounds(n):
    nodes = [f"n{i}" for i in range(n)]
    rounds = tournament(nodes)
    seen = [pair for round_ in rounds for pair in round_]
    assert sorted(seen) == sorted(tuple(sorted(p)) for p in combinations(nodes, 2))
    for round_ in rounds:
        flat = [node for pair in round_ for node in pair]
        assert len(flat) == len(set(flat))  # a node is in one pair per round


def pairs_with(slow_node: str | None, nodes=("n1", "n2", "n3", "n4"), good=40.0, bad=9.0):
    return [{"nodes": list(p), "busbw_gbs": bad if slow_node in p else good} for p in combinations(nodes, 2)]


def test_one_slow_node_is_found_among_four():
    slow, suspects, threshold = find_slow_nodes(pairs_with("n3"), None)
    assert suspects == ["n3"] and len(slow) == 3 and threshold == pytest.approx(20.0)
    assert find_slow_nodes(pairs_with(None), None)[:2] == ([], [])


def test_site_pair_figure_overrides_the_relative_rule():
    slow, suspects, _ = find_slow_nodes(pairs_with(None, good=30.0), 35.0)
    assert len(slow) == 6 and suspects == ["n1", "n2", "n3", "n4"]  # every pair under the bar: blame all


RESULT = {
    "backend": "gloo",
    "world_size": 2,
    "nodes": ["n1", "n2"],
    "device": "cpu",
    "sizes": [
        {"bytes": 1 << 20, "time_us": 9000.0, "algbw_gbs": 0.12, "busbw_gbs": 0.12},
        {"bytes": 16 << 20, "time_us": 40000.0, "algbw_gbs": 0.42, "busbw_gbs": 0.42},
    ],
    "pairs": [{"nodes": ["n1", "n2"], "ranks": 2, "bytes": 16 << 20, "time_us": 40000.0, "busbw_gbs": 0.44}],
}


def test_verdict_against_the_site_figure():
    assert evaluate(RESULT, Preflight(busbw_gbs=0.1)).passed
    failed = evaluate(RESULT, Preflight(busbw_gbs=5.0))
    assert not failed.passed and "< expected 5 GB/s" in failed.lines[0]
    pair_fail = evaluate(RESULT, Preflight(busbw_gbs=0.1, pair_busbw_gbs=1.0))
    assert not pair_fail.passed and pair_fail.slow_pairs == [("n1", "n2")]
    assert "no expected figure" in evaluate(RESULT, Preflight()).lines[0]


def test_table_has_a_row_per_size_and_the_pairs():
    text = format_table(RESULT, evaluate(RESULT, Preflight(busbw_gbs=0.1)))
    assert "      1M" in text and "     16M" in text and "n1-n2" in text and text.rstrip().endswith("PASS")


def test_site_figures_per_partition():
    bluecloud = load_site("bluecloud").config
    assert expected_for(bluecloud, "h100").busbw_gbs == 400 and expected_for(bluecloud, None).pair_busbw_gbs == 35
    assert max_size_for(bluecloud, "h100") == "8G"
    sandbox = load_site("sandbox").config
    assert max_size_for(sandbox, "cpu") == "16M" and max_size_for(sandbox, "gpu") == "1G"
    assert max_size_for(load_site("local").config, None) == "64M"
