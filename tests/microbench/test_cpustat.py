"""CPU steal from /proc/stat: parsing, the share between two readings, and no figure where
there is no counter."""

from __future__ import annotations

from microbench.cpustat import CpuTimes, cpu_times, steal_fraction


def test_reads_the_aggregate_line_and_its_steal_column(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n")
    assert cpu_times(stat) == CpuTimes(total_ticks=1000, steal_ticks=35)


def test_steal_share_between_two_readings():
    before, after = CpuTimes(1000, 35), CpuTimes(1400, 135)
    assert steal_fraction(before, after) == 0.25
    assert steal_fraction(before, before) == 0.0
    assert steal_fraction(None, after) is None


def test_no_figure_without_a_steal_column_or_a_file(tmp_path):
    old = tmp_path / "old"
    old.write_text("cpu  100 0 50 800\n")  # kernels before 2.6.11
    assert cpu_times(old) is None
    assert cpu_times(tmp_path / "missing") is None


def test_this_machine_reads_or_says_it_cannot():
    reading = cpu_times()
    assert reading is None or reading.total_ticks >= reading.steal_ticks >= 0
