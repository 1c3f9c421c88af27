"""GPU collectives as NCCL runs them: each algorithm's bottleneck, latency growth and choice,
checked against the closed forms the module states."""

from __future__ import annotations

import pytest

from pdlsim.sim.nccl import EFFICIENCIES, Fabric, bus_factor, estimate

EFF = dict.fromkeys(EFFICIENCIES, 0.8) | {"nvls_efficiency": 0.6, "network_efficiency": 0.9}
GB = 1e9


def fabric(nodes=1, gpus=8, nvls=False, nics=8, link=300 * GB, nic=25 * GB, **kw) -> Fabric:
    return Fabric(nodes, gpus, "nvlink", link, nvls, nics, nic, 1e-6, **kw)


def test_a_ring_inside_a_node_moves_at_the_links_efficiency():
    big = estimate("allreduce", 2**36, fabric(), EFF)
    assert (big.algorithm, big.protocol) == ("ring", "simple")
    assert big.busbw_bytes_per_s == pytest.approx(300 * GB * 0.8, rel=1e-3)
    assert bus_factor("allreduce", 8) == 2 * 7 / 8 and bus_factor("allgather", 8) == 7 / 8


def test_a_ring_across_nodes_is_held_to_the_nodes_nics():
    f = fabric(nodes=4)
    ring = estimate("allreduce", 2**36, f, EFF, algorithm="ring")
    assert ring.busbw_bytes_per_s == pytest.approx(8 * 25 * GB * 0.9, rel=1e-3)
    half = estimate("allreduce", 2**36, fabric(nodes=4, nics=4), EFF, algorithm="ring")
    assert half.busbw_bytes_per_s == pytest.approx(ring.busbw_bytes_per_s / 2, rel=1e-3)


def test_nvls_reduces_in_the_switch_and_wins_large_messages():
    f = fabric(nvls=True, link=450 * GB)
    big = estimate("allreduce", 2**36, f, EFF)
    assert big.algorithm == "nvls"
    assert big.algbw_bytes_per_s == pytest.approx(450 * GB * 0.6, rel=1e-3)
    assert estimate("allreduce", 8, f, EFF).algorithm == "ring"  # latency-bound: not NVLS


def test_nvls_tree_is_the_slower_of_the_switch_and_the_nics():
    """Across nodes a double binary tree's busiest node moves the message twice through its
    NICs; with two nodes, once."""
    nics = 8 * 50 * GB * 0.9
    for nodes, volume in ((2, 1.0), (3, 2.0), (16, 2.0)):
        f = fabric(nodes=nodes, nvls=True, link=450 * GB, nic=50 * GB)
        tree = estimate("allreduce", 2**36, f, EFF, algorithm="nvls_tree")
        expected = min(450 * GB * 0.6, nics / volume)
        assert tree.algbw_bytes_per_s == pytest.approx(expected, rel=1e-2)


def test_small_messages_pay_the_protocols_latency_per_hop():
    """8 bytes on one node of 8: LL ring, 6.6 us base + 14 hops of 0.6 us (NCCL's figures)."""
    tiny = estimate("allreduce", 8, fabric(), EFF)
    assert (tiny.algorithm, tiny.protocol) == ("ring", "ll")
    assert tiny.time_s == pytest.approx(6.6e-6 + 14 * 0.6e-6, rel=1e-3)


def test_ring_latency_grows_with_nodes_tree_latency_with_their_log():
    def tiny(nodes, algorithm):
        return estimate("allreduce", 8, fabric(nodes=nodes), EFF, algorithm=algorithm).time_s

    ring = tiny(64, "ring") - tiny(2, "ring")
    tree = tiny(64, "tree") - tiny(2, "tree")
    assert ring > 10 * tree > 0
    assert estimate("allreduce", 8, fabric(nodes=64), EFF).algorithm == "tree"


def test_the_choice_is_the_fastest_of_what_the_fabric_allows():
    f = fabric(nodes=4, nvls=True)
    for size in (8, 2**16, 2**22, 2**28, 2**34):
        chosen = estimate("allreduce", size, f, EFF)
        for algorithm in ("ring", "tree", "nvls_tree"):
            assert chosen.time_s <= estimate("allreduce", size, f, EFF, algorithm).time_s


def test_time_grows_with_the_message():
    f = fabric(nodes=2)
    times = [estimate("allreduce", 2**k, f, EFF).time_s for k in range(3, 36)]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))


def test_reduce_scatter_and_allgather_move_half_an_allreduce_on_a_ring():
    f = fabric()
    size = 2**34
    rs = estimate("reduce_scatter", size, f, EFF)
    ag = estimate("allgather", size, f, EFF)
    ar = estimate("allreduce", size, f, EFF, algorithm="ring")
    assert rs.time_s == pytest.approx(ag.time_s) and rs.algorithm == "ring"
    assert rs.busbw_bytes_per_s == pytest.approx(ar.busbw_bytes_per_s, rel=1e-3)
    assert rs.time_s == pytest.approx(ar.time_s / 2, rel=1e-3)


def test_oversubscribed_leaves_slow_only_when_their_uplinks_are_fewer_than_the_rings():
    base = estimate("allreduce", 2**34, fabric(nodes=16), EFF, algorithm="ring")
    mild = estimate("allreduce", 2**34, fabric(nodes=16, oversubscription=2, leaf_nodes=4), EFF,
                    algorithm="ring")  # fmt: skip
    harsh = estimate("allreduce", 2**34, fabric(nodes=16, oversubscription=8, leaf_nodes=4), EFF,
                     algorithm="ring")  # fmt: skip
    inside = estimate("allreduce", 2**34, fabric(nodes=4, oversubscription=8, leaf_nodes=4), EFF,
                      algorithm="ring")  # fmt: skip
    assert mild.time_s == pytest.approx(base.time_s)
    assert harsh.busbw_bytes_per_s == pytest.approx(base.busbw_bytes_per_s / 2, rel=1e-2)
    assert inside.busbw_bytes_per_s == pytest.approx(base.busbw_bytes_per_s, rel=1e-2)


def test_one_gpu_has_nothing_to_send():
    alone = estimate("allreduce", 2**20, fabric(gpus=1), EFF)
    assert alone.time_s == 0.0 and alone.algbw_bytes_per_s == alone.busbw_bytes_per_s == 0.0


@pytest.mark.parametrize(
    "op, kwargs, match",
    [
        ("allreduce", {"algorithm": "nvls"}, "it allows ring, tree"),
        ("allgather", {"algorithm": "tree"}, "it allows ring"),
        ("alltoall", {}, "unknown collective 'alltoall'"),
    ],
)
def test_what_cannot_run_is_refused_naming_what_can(op, kwargs, match):
    with pytest.raises(ValueError, match=match):
        estimate(op, 2**20, fabric(nodes=2), EFF, **kwargs)
