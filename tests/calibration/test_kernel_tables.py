"""Kernel tables: interpolation in log space, the stated law beyond the grid, recovery of
known costs from synthetic sweeps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from calibration.kernel_tables import VECTOR_FLOATS, GemmTable, edge_tiles
from calibration.loop_table import LoopTable

DIMS = (1, 2, 4, 8, 16, 64, 256, 1024)
PEAK = 1e11
CALL_S = 1e-6


def gemm_law(m, n, k):
    """A machine whose GEMMs reach PEAK after a fixed cost per call."""
    return CALL_S + 2 * m * n * k / PEAK


def gemm_table(max_flops: float = 2**40) -> GemmTable:
    points = {
        (m, n, k): gemm_law(m, n, k)
        for m, n, k in itertools.product(DIMS, repeat=3)
        if 2 * m * n * k <= max_flops
    }
    return GemmTable.from_points(points)


def test_grid_points_come_back_exactly():
    table = gemm_table()
    for key in [(1, 1, 1), (8, 256, 4), (1024, 1024, 1024)]:
        assert table.time_s(*key) == pytest.approx(gemm_law(*key), rel=1e-9)


def test_off_grid_shapes_interpolate_within_the_laws_curvature():
    table = gemm_table()
    for m, n, k in [(3, 100, 700), (50, 50, 50), (500, 12, 200)]:
        assert table.time_s(m, n, k) == pytest.approx(gemm_law(m, n, k), rel=0.15)


def test_beyond_the_grid_time_grows_in_proportion_and_below_it_holds():
    table = gemm_table()
    edge = table.time_s(1024, 64, 16)
    assert table.time_s(4096, 64, 16) == pytest.approx(4 * edge, rel=1e-9)
    assert table.time_s(4096, 64, 32) == pytest.approx(4 * table.time_s(1024, 64, 32), rel=1e-9)
    assert table.time_s(0.5, 1, 1) == pytest.approx(table.time_s(1, 1, 1))


def test_skipped_grid_points_keep_the_efficiency_of_their_measured_neighbour():
    table = gemm_table(max_flops=2**20)  # 1024^3 and the like were not timed
    assert (1024, 1024, 1024) not in table.points
    measured = table.time_s(1024, 16, 16)  # 2^19 FLOPs: on the grid
    assert table.time_s(1024, 1024, 1024) == pytest.approx(measured * 64 * 64, rel=1e-9)


def test_neighbour_residuals_are_small_on_a_smooth_law_and_json_round_trips():
    table = gemm_table()
    assert np.median(np.abs(table.neighbour_residuals())) < 0.2
    again = GemmTable.from_dict(table.to_dict())  # five significant digits kept
    assert again.time_s(37, 5, 900) == pytest.approx(table.time_s(37, 5, 900), rel=1e-4)


def test_gemm_tables_refuse_nonsense():
    with pytest.raises(ValueError):
        GemmTable.from_points({})
    with pytest.raises(ValueError):
        GemmTable.from_points({(1, 1, 1): -1.0})


# A BLAS whose edge tiles of 4, 2 and 1 columns cost as much as this many more whole columns:
# along m the register tile is 4 wide, so a 4-column edge costs nothing there.
EDGE_COLUMNS = {"m": (0.0, 3.0, 2.0), "n": (4.0, 2.5, 1.5)}


def ragged_law(m, n, k):
    return gemm_law(
        m + np.dot(EDGE_COLUMNS["m"], edge_tiles(m)),
        n + np.dot(EDGE_COLUMNS["n"], edge_tiles(n)),
        k,
    )


WHOLE = sorted({*DIMS, 24, 32, 48, 128})  # whole widths around the ragged ones


def ragged_table(ragged=(12, 14, 15, 63)) -> GemmTable:
    points = {key: ragged_law(*key) for key in itertools.product(WHOLE, repeat=3)}
    partners = (16, 64, 256, 1024)
    for d, other, k in itertools.product(ragged, partners, partners):
        points[(d, other, k)] = ragged_law(d, other, k)
        points[(other, d, k)] = ragged_law(other, d, k)
    return GemmTable.from_points(points)


def test_edge_tiles_are_the_set_bits_of_a_dimensions_remainder_past_whole_vectors():
    assert list(edge_tiles(47)) == [1, 1, 1]
    assert list(edge_tiles(12)) == [1, 0, 0]
    assert list(edge_tiles(66)) == [0, 1, 0]
    assert not edge_tiles(64).any() and not edge_tiles(7).any()  # whole, or within one vector


def test_the_edge_tiles_widths_are_recovered_from_ragged_shapes():
    table = ragged_table()
    widths_m, widths_n = table.edge_width
    assert widths_m == pytest.approx(EDGE_COLUMNS["m"], abs=0.5)
    assert widths_n == pytest.approx(EDGE_COLUMNS["n"], abs=0.5)


@pytest.mark.parametrize("key", [(256, 47, 512), (47, 256, 512), (99, 207, 300), (1000, 9, 64)])
def test_ragged_shapes_never_measured_are_priced_by_their_edge_tiles(key):
    with_law = ragged_table()
    assert with_law.time_s(*key) == pytest.approx(ragged_law(*key), rel=0.05)
    # without ragged shapes in the sweep the law has nothing to go by, and a 47 costs like 47
    blind = GemmTable.from_points({k: ragged_law(*k) for k in itertools.product(WHOLE, repeat=3)})
    assert blind.edge_width[1] == pytest.approx([0, 0, 0])
    assert blind.time_s(*key) < 0.97 * ragged_law(*key)


def test_ragged_points_count_in_the_tables_residuals():
    table = ragged_table()
    whole = GemmTable.from_points({k: ragged_law(*k) for k in itertools.product(WHOLE, repeat=3)})
    assert table.neighbour_residuals().size > whole.neighbour_residuals().size


def row_cost_s(run: int) -> float:
    """A loop whose rows cost a fixed 5 ns, 0.1 ns per vectorized value, 2 ns per scalar
    remainder value: the sawtooth of a SIMD inner loop."""
    vector, rest = divmod(run, VECTOR_FLOATS)
    return 5e-9 + 0.1e-9 * vector * VECTOR_FLOATS + 2e-9 * rest


def loop_law(elements: float, run: int) -> float:
    return 2e-6 + elements / run * row_cost_s(run)


RUNS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23, 24, 31, 32, 48, 63, 64, 128, 512)
ELEMENTS = tuple(8**e for e in range(2, 8))


def loop_table(runs=RUNS) -> LoopTable:
    return LoopTable.from_points((e, r, loop_law(e, r)) for e in ELEMENTS for r in runs)


@pytest.mark.parametrize("run", [21, 39, 47, 100, 127, 200, 501])
def test_a_runs_vector_body_and_remainder_are_interpolated_apart(run):
    elements = 10**6
    table = loop_table()
    assert table.time_s(elements, run) == pytest.approx(loop_law(elements, run), rel=0.12)


def test_without_remainder_classes_runs_interpolate_plainly_and_get_the_sawtooth_wrong():
    plain = loop_table(runs=(1, 8, 64, 512))  # no runs with a remainder: the plain rule
    assert plain.time_s(10**6, 23) < 0.5 * loop_law(10**6, 23)


def test_loops_hold_below_the_smallest_size_and_grow_in_proportion_beyond_the_largest():
    table = loop_table()
    top = ELEMENTS[-1]
    assert table.time_s(top * 8, 8) == pytest.approx(8 * table.time_s(top, 8))
    assert table.time_s(1, 8) == pytest.approx(table.time_s(ELEMENTS[0], 8))
    again = LoopTable.from_dict(table.to_dict())
    assert again.time_s(12345, 23) == pytest.approx(table.time_s(12345, 23), rel=1e-4)
    assert np.median(np.abs(table.neighbour_residuals())) < 0.3


@pytest.mark.parametrize("excess", [0.0, 0.15])
def test_the_laws_error_beyond_the_grid_is_recovered_per_log_unit_of_distance(excess):
    """On a machine whose time grows as size^(1 + excess) past the fixed cost, a table's
    largest sizes priced from the rest are off by ``excess`` per natural-log unit beyond."""
    points = {
        (m, n, k): (2 * m * n * k / PEAK) ** (1 + excess)
        for m, n, k in itertools.product(DIMS[3:], repeat=3)
    }
    table = GemmTable.from_points(points)
    rows = table.beyond_residuals()
    assert len(rows) == 3 * len(DIMS[3:]) ** 2  # each axis's largest size, left out in turn
    assert rows[:, 1] == pytest.approx(np.log(1024 / 256))
    assert rows[:, 0] / rows[:, 1] == pytest.approx(excess, abs=1e-9)
    loops = LoopTable.from_points(
        (e, r, (e * 1e-9) ** (1 + excess)) for e in (64, 4096, 2**18) for r in (1, 8)
    )
    rows = loops.beyond_residuals()
    assert len(rows) == 2 and rows[:, 1] == pytest.approx(np.log(64))
    assert rows[:, 0] / rows[:, 1] == pytest.approx(excess, abs=1e-9)


def test_a_calls_distance_beyond_the_grid_is_summed_over_axes_and_zero_inside():
    table = gemm_table()
    assert table.beyond_log(500, 3, 1024) == 0.0
    assert table.beyond_log(4096, 1024, 2048) == pytest.approx(np.log(4) + np.log(2))
    loops = LoopTable.from_points((e, r, e * 1e-9) for e in (64, 4096) for r in (1, 64))
    assert loops.beyond_log(4096, 1) == 0.0 and loops.beyond_log(10, 1) == 0.0
    assert loops.beyond_log(4096 * 8, 40) == pytest.approx(np.log(8))  # nearest run: 64
