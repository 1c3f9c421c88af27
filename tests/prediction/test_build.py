"""Which inter-node link a prediction takes: the profile's fit, a preset, or given figures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pdlsim.costmodel.presets import NETWORK_PRESETS
from pdlsim.prediction.build import resolve_network
from pdlsim.prediction.config import PredictConfig

FITTED = SimpleNamespace(a_s=7e-6, b_s_per_byte=1 / 5e9)  # a profile's inter-node fit


def test_the_profiles_fit_unless_a_flag_names_another_link():
    assert resolve_network(PredictConfig(), FITTED) is None
    assert resolve_network(PredictConfig(), None) == NETWORK_PRESETS["ib-hdr"]
    assert resolve_network(PredictConfig(network="eth-25g"), FITTED) == NETWORK_PRESETS["eth-25g"]


@pytest.mark.parametrize(
    "flags, fitted, latency_s, bandwidth",
    [
        ({"inter_bw": "10GB/s"}, FITTED, 7e-6, 10e9),  # the fit's latency, not a preset's
        ({"inter_lat": "3us"}, FITTED, 3e-6, 5e9),  # the fit's bandwidth
        ({"inter_bw": "10GB/s"}, None, 1e-6, 10e9),  # no fit: the default preset's latency
        ({"inter_bw": "10GB/s", "network": "roce-100g"}, FITTED, 2e-6, 10e9),  # named preset
    ],
)
def test_one_figure_given_keeps_the_other_from_where_the_link_came(
    flags, fitted, latency_s, bandwidth
):
    link = resolve_network(PredictConfig(**flags), fitted)
    assert link.latency_s == pytest.approx(latency_s)
    assert link.bandwidth_bytes_per_s == pytest.approx(bandwidth)
