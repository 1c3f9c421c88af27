"""``pdlsim predict --trace FILE`` writes the trace last, once the prediction is made, in one
rename: a run that fails on the way leaves an existing file as it was; a timeline holding NaN or
infinity (which JSON cannot hold) is refused in one line, not written as ``"dur": Infinity``."""

from __future__ import annotations

import json

import pytest

from microbench.errors import UserError
from pdlsim.cli.main import main
from pdlsim.sim import Timeline, write_chrome_trace
from pdlsim.sim.trace import TraceEvent
from tests.costmodel.test_model import write_synthetic_profile


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trace") / "profile.json"
    write_synthetic_profile(path)
    return str(path)


def _predict(profile: str, trace, *mode: str) -> list[str]:
    return ["predict", "--nodes", "2", "--gpus", "1", "--profile", profile, "--samples", "2",
            "--iterations", "2", *mode, "--trace", str(trace)]  # fmt: skip


MODES = [(), ("--inference",)]  # the data-parallel path and the layer-wise one


@pytest.mark.parametrize("mode", MODES)
def test_an_existing_trace_keeps_its_content_when_the_run_fails(profile, tmp_path, capsys,
                                                                monkeypatch, mode):  # fmt: skip
    """The simulation ran (so its timeline exists), then the prediction failed: the old trace
    is still there, byte for byte, and no temporary file is left beside it."""
    import pdlsim.prediction.core
    import pdlsim.prediction.document

    def fails(*args, **kwargs):
        raise UserError("the prediction failed after the simulation")

    monkeypatch.setattr(pdlsim.prediction.core, "prediction_document", fails)
    monkeypatch.setattr(pdlsim.prediction.document, "prediction_document", fails)
    trace = tmp_path / "k.json"
    trace.write_text("KEEP\n")
    assert main(_predict(profile, trace, *mode)) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert trace.read_text() == "KEEP\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json"]


@pytest.mark.parametrize("mode", MODES)
def test_a_run_that_succeeds_replaces_it_with_the_trace(profile, tmp_path, capsys, mode):
    trace = tmp_path / "k.json"
    trace.write_text("KEEP\n")
    assert main(_predict(profile, trace, *mode)) == 0
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.parametrize("start, duration, field", [(0.0, float("inf"), "dur inf"),
                                               (float("nan"), 1.0, "ts nan")])  # fmt: skip
def test_a_non_finite_time_is_refused_and_the_file_kept(tmp_path, start, duration, field):
    timeline = Timeline()
    timeline.add(timeline.track("rank 0", "ranks"), "forward", 0.0, 1e-3)
    timeline.events.append(TraceEvent("rank 0", "backward", start, duration))
    trace = tmp_path / "k.json"
    trace.write_text("KEEP\n")
    with pytest.raises(UserError, match=f"^--trace k.json: not written: the event 'backward' "
                                        f"has {field}, and JSON has no NaN"):  # fmt: skip
        write_chrome_trace(trace, timeline, "--trace k.json")
    assert trace.read_text() == "KEEP\n"


def test_a_non_finite_arg_is_refused_too(tmp_path):
    timeline = Timeline()
    timeline.add(timeline.track("link", "links"), "send", 0.0, 1.0, args={"bytes": float("inf")})
    with pytest.raises(UserError, match="has args.bytes inf"):
        write_chrome_trace(tmp_path / "t.json", timeline)
    assert not (tmp_path / "t.json").exists()
