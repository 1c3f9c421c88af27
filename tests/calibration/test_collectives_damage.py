"""Collectives in a profile that a hand edit broke: the ranks per node their fits were
measured at (which hold the pace of a busy node's collectives), a regime's algorithm and sizes,
a model filed under another collective's key. Each is exit 2 and one line naming the field,
never a prediction that silently takes it."""

from __future__ import annotations

import pytest

from calibration.communication import CollectiveModels
from calibration.profile import load_profile
from calibration.profile_checks import FieldError
from tests.profiles import refused_edit


@pytest.fixture(scope="module")
def profile():
    return load_profile("h200-16core")


_HOCKNEY = ("collectives", "collectives", "allreduce", "hockney")


@pytest.mark.parametrize(
    ("edit", "field", "problem"),
    [
        (lambda h: h[0].update(ranks_per_node=0), "[0].ranks_per_node", "whole number >= 1, got 0"),
        (lambda h: h[0].update(ranks_per_node=-2), "[0].ranks_per_node", ">= 1, got -2"),
        (lambda h: h[0].update(ranks_per_node=2.5), "[0].ranks_per_node", ">= 1, got 2.5"),
        (lambda h: h[0].update(ranks_per_node=None), "[0].ranks_per_node", ">= 1, got null"),
        (lambda h: h[0].update(ranks_per_node=16), "[0].ranks_per_node", "16 ranks per node of 2"),
        (lambda h: h[0].update(ranks=0), "[0].ranks", "whole number >= 1, got 0"),
        (lambda h: h.__setitem__(0, [2, 2]), "[0]", "must be an object, got list"),
    ],
)
def test_a_damaged_ranks_per_node_of_the_collectives_is_named_in_one_line(
    tmp_path, capsys, edit, field, problem
):
    """The ranks per node the collectives were measured at hold their pace: a hand edit that
    makes it nonsense (zero, negative, fractional, more than the ranks) is exit 2 and one line
    naming the field, never a pace silently carried from a count no benchmark ran (nor, for a
    null, another collective's field named as the fault)."""
    path, err = refused_edit(tmp_path, capsys, _HOCKNEY, edit)
    where = f"{path}: models.{'.'.join(_HOCKNEY)}{field}: "
    assert where in err and problem in err, err


def test_a_hockney_list_that_is_not_one_is_named(profile):
    doc = profile.to_dict()["models"]["collectives"]
    doc["collectives"]["allreduce"]["hockney"] = "x"
    with pytest.raises(FieldError, match=r"^collectives\.allreduce\.hockney: must be a list"):
        CollectiveModels.from_dict(doc)


_ALLREDUCE = ("collectives", "collectives", "allreduce")


@pytest.mark.parametrize(
    ("edit", "field", "problem"),
    [
        (lambda c: c["regimes"][0].update(algorithm="magic"), ".regimes[0].algorithm",
         '"magic" is not an algorithm of allreduce'),
        (lambda c: c["regimes"][0].update(min_bytes=-5), ".regimes[0].min_bytes",
         "must be >= 0, got -5"),
        (lambda c: c["regimes"][-1].update(max_bytes=0), ".regimes[2].max_bytes",
         "0 is below min_bytes"),
        (lambda c: c.update(op="bcast"), ".op", "'bcast' under the key 'allreduce'"),
    ],
)  # fmt: skip
def test_a_collectives_regime_a_hand_edit_broke_is_named_in_one_line(
    tmp_path, capsys, edit, field, problem
):
    """An algorithm that is not the collective's, sizes that are no range, a model filed
    under another collective's key: each would extrapolate by another law or send sizes to the
    wrong regime, so each is exit 2 and one line naming the field."""
    path, err = refused_edit(tmp_path, capsys, _ALLREDUCE, edit)
    assert f"{path}: models.{'.'.join(_ALLREDUCE)}{field}: {problem}" in err, err
