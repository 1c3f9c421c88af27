"""Measured energy: RAPL from a powercap tree (a fake one here), NVML through a fake pynvml,
the meter's arithmetic (wrap-around, trapezoids, totals) and ``python -m microbench power``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from microbench.commands.power import sample_energy
from microbench.power import (
    EnergyMeter,
    counter_delta,
    find_nvml,
    find_rapl,
)

RANGE_UJ = 262_143_328_850  # a real package's max_energy_range_uj


def make_zone(root: Path, zone: str, name: str, energy_uj: int, range_uj: int = RANGE_UJ) -> Path:
    d = root / zone
    d.mkdir(parents=True)
    (d / "name").write_text(f"{name}\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{range_uj}\n")
    return d / "energy_uj"


@pytest.fixture
def powercap(tmp_path: Path) -> dict[str, Path]:
    """Two sockets; socket 0 with core and dram sub-zones; a psys zone; the control type dir."""
    root = tmp_path / "powercap"
    (root / "intel-rapl").mkdir(parents=True)  # the control type itself: no colon, not a zone
    return {
        "root": root,
        "package-0": make_zone(root, "intel-rapl:0", "package-0", 1_000_000),
        "package-0/core": make_zone(root, "intel-rapl:0:0", "core", 500_000),
        "package-0/dram": make_zone(root, "intel-rapl:0:1", "dram", 0),
        "package-1": make_zone(root, "intel-rapl:1", "package-1", RANGE_UJ - 1_000_000),
        "psys": make_zone(root, "intel-rapl:2", "psys", 7),
    }


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_counter_delta_handles_one_wrap():
    assert counter_delta(100, 350, 1000) == 250
    assert counter_delta(900, 50, 1000) == 150  # 900 -> 1000 -> wrap to 0 -> 50
    assert counter_delta(5, 5, 1000) == 0
    with pytest.raises(ValueError, match="no range"):
        counter_delta(10, 5, 0)


def test_zones_are_named_by_socket_and_only_packages_and_dram_add_up(powercap):
    source, problems = find_rapl(powercap["root"])
    assert problems == []
    assert source.domains == ("package-0", "package-0/core", "package-0/dram", "package-1", "psys")
    assert source.in_total == {
        "package-0": True,
        "package-0/core": False,  # inside the package
        "package-0/dram": True,
        "package-1": True,
        "psys": False,  # the whole platform: overlaps everything
    }


def test_meter_joules_with_a_wrapping_counter(powercap):
    clock = FakeClock()
    source, _ = find_rapl(powercap["root"])
    meter = EnergyMeter([source], clock=clock)
    meter.start()
    clock.t = 2.0
    powercap["package-0"].write_text("3000000\n")  # +2 J
    powercap["package-0/core"].write_text("1500000\n")  # +1 J
    powercap["package-0/dram"].write_text("400000\n")  # +0.4 J
    powercap["package-1"].write_text("2000000\n")  # wrapped: +1 J to the range, +2 J after
    first = meter.poll()
    assert first.elapsed_s == 2.0
    assert first.joules == pytest.approx(
        {"package-0": 2.0, "package-0/core": 1.0, "package-0/dram": 0.4, "package-1": 3.0,
         "psys": 0.0}, abs=1e-12
    )  # fmt: skip
    assert first.total_j == pytest.approx(5.4, abs=1e-12)  # core and psys left out
    assert first.watts["package-1"] == pytest.approx(1.5)
    clock.t = 3.0
    powercap["package-1"].write_text("3000000\n")  # +1 J
    reading = meter.stop()
    assert reading.elapsed_s == 3.0
    assert reading.joules["package-1"] == pytest.approx(4.0, abs=1e-12)
    assert reading.total_j == pytest.approx(6.4, abs=1e-12)


def test_context_manager_leaves_the_reading(powercap):
    clock = FakeClock()
    source, _ = find_rapl(powercap["root"])
    with EnergyMeter([source], clock=clock) as meter:
        clock.t = 0.5
        powercap["package-0"].write_text("1250000\n")
    assert meter.reading.joules["package-0"] == pytest.approx(0.25, abs=1e-12)
    assert meter.reading.watts["package-0"] == pytest.approx(0.5)


def test_no_tree_says_so(tmp_path):
    meter = EnergyMeter.open(tmp_path / "missing", use_nvml=False)
    assert not meter.available and meter.domains == ()
    assert "does not exist" in meter.explain()
    assert meter.explain().startswith("no readable energy counters: RAPL:")
    (tmp_path / "empty").mkdir()
    _, problems = find_rapl(tmp_path / "empty")
    assert "holds no intel-rapl:* zone" in problems[0]


def test_permission_denied_is_explained_and_readable_zones_still_used(powercap, monkeypatch):
    original = Path.read_text
    denied = powercap["package-1"]

    def read_text(self, *args, **kwargs):
        if self == denied:
            raise PermissionError(13, "Permission denied")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    source, problems = find_rapl(powercap["root"])
    assert "package-1" not in source.domains and "package-0" in source.domains
    assert len(problems) == 1
    assert "permission denied" in problems[0] and "root" in problems[0]


class FakeNvml:
    """GPU 0 has an energy counter (mJ); GPU 1 only reports power (mW)."""

    class NVMLError(Exception):
        pass

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.energy_mj = 1000
        self.power_mw = [100_000, 100_000]
        self.shut = False

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if h == 1:
            raise self.NVMLError("Not Supported")
        return self.energy_mj

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power_mw[h]


def test_nvml_counter_and_power_samples():
    nvml, clock = FakeNvml(), FakeClock()
    source, problems = find_nvml(nvml)
    assert problems == [] and source.domains == ("gpu-0", "gpu-1")
    assert source.methods["gpu-0"] == "nvml energy counter"
    assert "power samples" in source.methods["gpu-1"]
    meter = EnergyMeter([source], clock=clock)
    meter.start()
    clock.t, nvml.energy_mj, nvml.power_mw[1] = 2.0, 401_000, 300_000
    interval = meter.poll()
    assert interval.joules == pytest.approx({"gpu-0": 400.0, "gpu-1": 400.0})  # (100+300)/2 x 2
    assert interval.total_j == pytest.approx(800.0)
    meter.stop()
    meter.close()
    assert nvml.shut


def test_nvml_problems_are_reported():
    assert find_nvml(FakeNvml(fail_init=True))[0] is None
    assert "nvmlInit failed" in find_nvml(FakeNvml(fail_init=True))[1][0]
    meter = EnergyMeter.open("/nonexistent-powercap", nvml=FakeNvml())
    assert meter.available and meter.methods == {
        "gpu-0": "nvml energy counter",
        "gpu-1": "nvml power samples (trapezoid)",
    }
    assert len(meter.problems) == 1 and meter.problems[0].startswith("RAPL: ")
    assert meter.explain().startswith("energy counters: gpu-0 (nvml energy counter)")


class RampSource:
    """One domain whose counter rises at ``watts[0]`` W of the clock it is given."""

    kind = "fake"
    domains = ("package-0",)
    in_total = {"package-0": True}
    methods = {"package-0": "fake ramp"}

    def __init__(self, clock, watts: list[float]) -> None:
        self.clock, self.watts, self.energy_j, self.t = clock, watts, 0.0, clock()

    def read(self):
        now = self.clock()
        self.energy_j += self.watts[0] * (now - self.t)
        self.t = now
        return {"package-0": self.energy_j}

    def joules(self, before, after, interval_s):
        return {"package-0": after["package-0"] - before["package-0"]}

    def close(self):
        pass


def test_sample_energy_idle_and_busy_intervals():
    clock, watts = FakeClock(), [50.0]
    source = RampSource(clock, watts)
    meter = EnergyMeter([source], clock=clock)

    def sleep(seconds):
        clock.t += seconds

    idle = sample_energy(meter, 3.0, 1.0, sleep=sleep)
    assert [s.calls for s in idle] == [0, 0, 0]
    assert [s.reading.watts["package-0"] for s in idle] == [50.0, 50.0, 50.0]

    def step():
        source.read()  # energy so far at the old power, then the step runs at 200 W
        watts[0] = 200.0
        clock.t += 0.25

    busy = sample_energy(meter, 2.0, 1.0, work=step)
    assert [s.calls for s in busy] == [4, 4]
    assert [s.reading.watts["package-0"] for s in busy] == [200.0, 200.0]
    assert meter.reading.elapsed_s == 2.0 and meter.reading.joules["package-0"] == 400.0


# ---------------------------------------------------------------------------- the command


def test_command_without_counters_writes_nothing(tmp_path, capsys, no_inherited_rank):
    from microbench.__main__ import main

    out = tmp_path / "run"
    args = ["power", "--powercap-root", str(tmp_path / "none"), "--no-nvml", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("power: no readable energy counters: RAPL:")
    assert "nothing written" in printed and not out.exists()


def test_command_refuses_several_processes(monkeypatch, capsys, no_inherited_rank):
    from microbench.__main__ import main

    monkeypatch.setenv("PMI_SIZE", "2")
    assert main(["power", "--no-nvml"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "one process" in err[0] and "--threads" in err[0]


def test_command_records_watts_and_joules_per_sample(tmp_path, monkeypatch, no_inherited_rank):
    import microbench.power as power
    import microbench.threads as threads
    from microbench.__main__ import main
    from microbench.records import read_records

    last = [0.0]

    def meter_clock() -> float:  # the real clock; the source sees the meter's last reading
        last[0] = time.perf_counter()
        return last[0]

    def fake_open(cls, *args, **kwargs):
        return cls([RampSource(lambda: last[0], [100.0])], [], clock=meter_clock)

    monkeypatch.setattr(threads, "set_threads", lambda n: None)  # keep this process's pools
    monkeypatch.setattr(power.EnergyMeter, "open", classmethod(fake_open))
    out = tmp_path / "run"
    args = ["power", "--idle-seconds", "0.3", "--busy-seconds", "0.4", "--interval", "0.1",
            "--batch", "8", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    header, records = read_records(out / "power.jsonl")
    assert header["machine"]["energy_counters"]["domains"] == {"package-0": "fake ramp"}
    assert header["run"]["settings"]["busy_seconds"] == 0.4
    by_name = {(r.get("name"), r.get("params", {}).get("domain")): r for r in records}
    assert set(by_name) == {
        ("idle_power", "package-0"), ("idle_power", "total"),
        ("busy_power", "package-0"), ("busy_power", "total"),
        ("busy_energy_per_sample", "total"), (None, None),
    }  # fmt: skip
    for key in [("idle_power", "package-0"), ("busy_power", "total")]:
        record = by_name[key]
        assert record["unit"] == "W" and len(record["samples"]) in (3, 4)
        assert record["samples"] == pytest.approx([100.0] * len(record["samples"]), rel=1e-9)
    per_sample = by_name[("busy_energy_per_sample", "total")]
    busy = by_name[("busy_power", "total")]
    joules = [
        j * steps * 8 for j, steps in zip(per_sample["samples"], per_sample["steps"], strict=True)
    ]
    assert joules == pytest.approx([100.0 * s for s in busy["intervals_s"]], rel=1e-9)
    summary = by_name[(None, None)]
    assert summary["type"] == "summary" and summary["busy_w"] == pytest.approx(100.0, rel=1e-9)
    assert summary["busy_steps"] == sum(per_sample["steps"]) > 0
    json.dumps(summary)


def test_summary_medians_totals_and_the_gpu_note():
    from microbench.commands.power import IntervalSample, format_power, power_summary
    from microbench.power import EnergyReading

    in_total = {"package-0": True, "package-0/core": False, "gpu-0": True}

    def sample(seconds, pkg_j, core_j, gpu_j, calls):
        joules = {"package-0": pkg_j, "package-0/core": core_j, "gpu-0": gpu_j}
        return IntervalSample(EnergyReading(seconds, joules, in_total), calls)

    idle = [sample(1.0, 50.0, 10.0, 70.0, 0), sample(1.0, 60.0, 10.0, 70.0, 0)]
    busy = [sample(2.0, 300.0, 200.0, 140.0, 4), sample(2.0, 320.0, 220.0, 140.0, 5)]
    methods = {"package-0": "rapl", "package-0/core": "rapl", "gpu-0": "nvml"}
    params = {"model": "mlp", "batch": 10, "threads": 2}
    summary = power_summary(idle, busy, params, 10, methods)
    assert summary["domains"]["package-0"] == {
        "method": "rapl", "in_total": True, "idle_w": 55.0, "busy_w": 155.0
    }  # fmt: skip
    assert summary["idle_w"] == 125.0  # (50 + 70, 60 + 70): the core is inside the package
    assert summary["busy_w"] == 225.0  # (440 / 2, 460 / 2)
    assert summary["busy_j_per_sample"] == pytest.approx((440 / 40 + 460 / 50) / 2)
    assert summary["busy_steps"] == 9 and summary["busy_samples_per_s"] == 90 / 4.0
    text = format_power(summary)
    assert "total                   125.00    225.00       100.00" in text
    assert "GPUs: the step runs on the CPU" in text
