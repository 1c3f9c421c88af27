"""The GEMM stride law: recovered from synthetic triples, taken off a grid of costly widths and
priced back only where a width has such a stride."""

from __future__ import annotations

import itertools

import pytest

from calibration.gemm_alias import AliasLaw, stride_class_bytes
from calibration.gemm_regimes import SmallGemm
from calibration.kernel_tables import GemmTable
from microbench.kernelbench import GEMM_ALIAS_SHIFT, KernelPlan, Pool, _units

PEAK = 1e11
C_S = {256: 0.0, 1024: 5e-11, 4096: 2e-10}  # seconds per element of B, by stride class


def smooth(m: float, n: float, k: float) -> float:
    return 1e-6 + 2 * m * n * k / PEAK


def truth_c(n: float) -> float:
    cls = stride_class_bytes(n)
    return C_S[max(c for c in C_S if c <= cls)] if cls >= min(C_S) else 0.0


def measured(m: float, n: float, k: float) -> float:
    """A machine whose GEMMs pay C_S per element of B at a costly stride."""
    return smooth(m, n, k) + truth_c(n) * k * n


def synthetic_law(ks=(256, 2048)) -> AliasLaw:
    triples = [
        (m, n, k, measured(m, n, k), (measured(m, n - 8, k) + measured(m, n + 8, k)) / 2)
        for m, n, k in itertools.product((16, 128), (64, 256, 1024), ks)
    ]
    return AliasLaw.fit(triples)


def test_the_stride_class_is_the_largest_power_of_two_dividing_the_rows_bytes():
    assert [stride_class_bytes(n) for n in (64, 96, 554, 1024, 3000)] == [256, 128, 8, 4096, 32]


def test_the_law_is_recovered_from_triples_and_holds_above_and_below_what_was_measured():
    law = synthetic_law()
    for n, k in [(64, 256), (256, 2048), (1024, 700), (2048, 300), (4096, 5000)]:
        assert law.extra_s(n, k) == pytest.approx(truth_c(n) * k * n, rel=1e-6, abs=1e-12)
    assert law.extra_s(96, 1024) == 0.0  # 128 B: below the smallest class measured
    assert law.extra_s(554, 3072) == 0.0  # an 8-byte stride costs nothing


def test_the_law_interpolates_in_log_k_and_takes_noise_below_zero_as_nothing():
    law = AliasLaw({1024: ((256, 1e-10), (4096, 3e-10))})
    assert law.c_s(256, 1024) == pytest.approx(2e-10)  # halfway in log k
    assert law.c_s(256, 10**5) == pytest.approx(3e-10)  # held outside
    noisy = AliasLaw.fit([(16, 256, 512, 1.0e-3, 1.2e-3)])  # aligned ran faster
    assert noisy.extra_s(256, 512) == 0.0
    again = AliasLaw.from_dict(law.to_dict())
    assert again.c_s(256, 1024) == pytest.approx(law.c_s(256, 1024), rel=1e-3)
    with pytest.raises(ValueError, match="positive"):
        AliasLaw.fit([(16, 0, 512, 1e-3, 1e-3)])


def _grid(alias: AliasLaw | None, small: SmallGemm | None = None) -> GemmTable:
    dims = (16, 64, 256, 1024, 4096)
    points = {key: measured(*key) for key in itertools.product(dims, repeat=3)}
    return GemmTable.from_points(points, small=small, alias=alias)


def test_a_grid_of_costly_widths_prices_other_widths_without_the_cost():
    with_law, without = _grid(synthetic_law()), _grid(None)
    for m, n, k in [(128, 552, 3072), (64, 1000, 2000), (200, 3000, 700)]:
        assert with_law.time_s(m, n, k) == pytest.approx(smooth(m, n, k), rel=0.03)
        assert without.time_s(m, n, k) > 1.04 * smooth(m, n, k)  # the grid's cost, spread
    for key in [(64, 1024, 1024), (16, 4096, 256), (256, 256, 4096)]:  # costly widths
        assert with_law.time_s(*key) == pytest.approx(measured(*key), rel=1e-6)
    again = GemmTable.from_dict(with_law.to_dict())
    assert again.time_s(128, 552, 3072) == pytest.approx(with_law.time_s(128, 552, 3072), 1e-3)


def test_the_small_matrix_kernel_packs_nothing_and_pays_nothing():
    table = _grid(synthetic_law(), small=SmallGemm(max_mnk=2**20))
    assert table._alias_s(16, 1024, 16) == 0.0  # small kernel
    assert table._alias_s(1024, 1024, 1024) > 0.0


def test_the_sweep_times_each_triple_side_by_side_in_every_layout():
    plan = KernelPlan(threads=(1,), gemm_dims=(), gemm_ragged_dims=(), loop_elements=(),
                      im2col_shapes=(), step_networks=0, gemm_alias_n=(64, 512),
                      gemm_alias_mk=((16, 2048),))  # fmt: skip
    units = _units(plan, 1, Pool(2**22, 3, 0))
    triples = [unit for unit in units if unit[0][0] == "gemm_alias"]
    assert all(len(unit) == 3 for unit in triples)  # one unit: its blocks never split it
    timed = [params for unit in triples for name, params, _ in unit if name == "gemm_alias"]
    assert len(timed) == 3 * 2 * 3  # layouts x widths x (n - 8, n, n + 8)
    s = GEMM_ALIAS_SHIFT
    for below, at, above in zip(timed[::3], timed[1::3], timed[2::3], strict=True):
        assert [p["shift"] for p in (below, at, above)] == [-s, 0, s]
        assert [p["n"] for p in (below, at, above)] == [
            at["base_n"] - s,
            at["base_n"],
            at["base_n"] + s,
        ]
        assert len({(p["layout"], p["m"], p["k"], p["base_n"]) for p in (below, at, above)}) == 1
    assert {p["layout"] for p in timed} == {"nn", "tn", "nt"}
    assert {p["base_n"] % 64 for p in timed} == {0}


@pytest.mark.parametrize(
    "doc", [[1, 2], {"abc": [[512, 1e-10]]}, {"1000": [[512, 1e-10]]}, {"1024": [[0, 1e-10]]},
            {"1024": [[512, -1e-10]]}, {"1024": []}, {"1024": [[512, float("inf")]]}],
)  # fmt: skip
def test_a_malformed_law_is_refused_naming_the_form(doc):
    with pytest.raises(ValueError, match="stride class in bytes"):
        AliasLaw.from_dict(doc)


def test_a_profile_with_a_malformed_law_is_a_one_line_error(tmp_path):
    import json
    from pathlib import Path

    from tests.conftest import pdlsim_here

    packaged = Path(__file__).resolve().parents[2] / "calibration" / "profiles" / "xeon-2core.json"
    doc = json.loads(packaged.read_text())
    doc["models"]["kernels"]["gemm"]["nn"]["1"]["alias_s_per_element"] = {"1024": [[512, -1.0]]}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    done = pdlsim_here("predict", "--nodes", "1", "--procs-per-node", "1", "--profile", str(bad))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "alias_s_per_element['1024']" in done.stderr and "stride class" in done.stderr
