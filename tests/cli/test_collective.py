"""``pdlsim collective``: nccl-tests' answer per size, with the band of the assumptions, and
one-line refusals."""

from __future__ import annotations

import json

import pytest

from pdlsim.cli.main import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["collective", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_one_size_as_json_is_what_nccl_tests_reports(capsys):
    status, out, _ = run(capsys, "allreduce", "--nodes", "2", "--node", "dgx-h100",
                         "--size", "8GiB", "--json")  # fmt: skip
    assert status == 0
    doc = json.loads(out)
    assert (doc["ranks"], doc["nics_per_node"], doc["network"]) == (16, 8, "ib-ndr")
    (row,) = doc["rows"]
    assert row["size_bytes"] == 8 * 2**30
    assert row["algbw_GBps"] == pytest.approx(row["size_bytes"] / row["time_s"] / 1e9)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * 15 / 16)
    assert row["busbw_GBps_low"] < row["busbw_GBps"] < row["busbw_GBps_high"]
    assert row["time_s_low"] < row["time_s"] < row["time_s_high"]
    assert row["algorithm"] in ("ring", "tree", "nvls_tree")


def test_a_size_range_like_nccl_tests_b_e_f(capsys):
    status, out, _ = run(capsys, "reduce-scatter", "-b", "8", "-e", "128M", "-f", "2",
                         "--gpus", "4", "--json")  # fmt: skip
    rows = json.loads(out)["rows"]
    assert status == 0 and [r["size_bytes"] for r in rows] == [2**k for k in range(3, 28)]
    assert all(r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 3 / 4) for r in rows)


def test_the_text_table_names_the_cluster_and_its_sources(capsys):
    status, out, _ = run(capsys, "allgather", "--node", "dgx-a100", "--size", "1G")
    assert status == 0
    assert out.startswith("allgather on 1 x dgx-a100 (8 GPUs each, 8 ranks; 8 NICs per node")
    assert "ring/simple" in out and "sources:" in out and "DGX A100 data sheet" in out


def test_a_slower_network_file_slows_only_what_crosses_nodes(capsys, tmp_path):
    main(["hardware", "show", "ib-ndr"])
    doc = json.loads(capsys.readouterr().out)
    path = tmp_path / "slow.json"
    path.write_text(json.dumps({**doc, "bandwidth_bytes_per_s": doc["bandwidth_bytes_per_s"] / 4}))

    rows = {}
    for nodes in ("1", "2"):
        for network in ("ib-ndr", str(path)):
            _, out, _ = run(capsys, "allreduce", "--size", "4G", "--algorithm", "ring",
                            "--nodes", nodes, "--network", network, "--json")  # fmt: skip
            rows[nodes, network] = json.loads(out)["rows"][0]["busbw_GBps"]
    assert rows["1", "ib-ndr"] == pytest.approx(rows["1", str(path)])
    assert rows["2", str(path)] < rows["2", "ib-ndr"] / 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["allreduce", "--gpus", "9"], "node 'dgx-h100' holds 8 GPUs"),
        (["allreduce", "--gpus", "1"], "one GPU has nothing to allreduce"),
        (["allreduce", "--size", "3X"], "bad size '3X'"),
        (["allreduce", "--node", "nope"], "unknown node preset 'nope'"),
        (["allreduce", "--nodes", "2", "--algorithm", "nvls"], "it allows ring, tree, nvls_tree"),
        (["allreduce", "-b", "1G", "-e", "1K"], "ends below its start"),
        (["allreduce", "--network", "missing.json"], "missing.json"),
        (["allgather", "--size", "1M", "--protocol", "ll128", "--node", "pcie-l40s"],
         "protocol 'll128' cannot run"),
        (["allreduce", "--size", str(10**31)], "must be at most 1,099,511,627,776 bytes"),
        (["allreduce", "--nodes", "100000000"], "--nodes must be 1 to 1,000,000"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_status_2(capsys, argv, message):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert message in err and err.count("\n") == 1
