"""Input files that are no usable JSON for a reason outside the JSON itself: saved with a
byte-order mark or in another encoding, named with a trailing slash, or a link that leads
nowhere. Every reader (workloads, profiles, data sheets, layer times) says what is wrong and
how to fix it in one line, exit status 2, in the same words."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import pdlsim_here

LAYERS = [{"kind": "dense", "units": 2}, {"kind": "softmax_cross_entropy"}]
MLP = {"name": "tiny", "input_shape": [8], "layers": LAYERS}
FLAGS = ("--model", "--profile", "--gpu-preset", "--node", "--hardware", "--layer-times")


def _refused(flag: str, path: str) -> str:
    result = pdlsim_here("predict", "--nodes", "1", "--gpus", "8", "--iterations", "2",
                         "--samples", "2", flag, path)  # fmt: skip
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and path in result.stderr
    return result.stderr


@pytest.mark.parametrize("flag", FLAGS)
def test_a_byte_order_mark_is_named_with_its_fix(tmp_path, flag):
    """Was "Unexpected UTF-8 BOM (decode using utf-8-sig)", the decoder's advice."""
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(MLP).encode())
    assert "byte-order mark (BOM); save it as UTF-8 without one" in _refused(flag, str(path))


@pytest.mark.parametrize("flag", FLAGS)
def test_text_in_another_encoding_is_named_with_its_fix(tmp_path, flag):
    """Was "cannot read it ('utf-8' codec can't decode byte 0xe9 ...)"."""
    path = tmp_path / "latin1.json"
    path.write_bytes(
        json.dumps({**MLP, "name": "r\u00e9seau"}, ensure_ascii=False).encode("latin-1")
    )
    assert "not UTF-8 text (byte b'\\xe9' at offset" in _refused(flag, str(path))


@pytest.mark.parametrize("flag", FLAGS)
def test_a_file_named_with_a_trailing_slash_is_not_read(tmp_path, flag):
    """``file.json/`` is no path the system opens (ENOTDIR), but pathlib drops the slash: the
    file was read, and a typo for a directory went unnoticed."""
    path = tmp_path / "w.json"
    path.write_text(json.dumps(MLP))
    assert "ends in '/' but is a file, not a directory" in _refused(flag, f"{path}/")


@pytest.mark.parametrize("flag", [f for f in FLAGS if f != "--model"])
def test_a_loop_of_links_is_named(tmp_path, flag):
    """A loop made the shared check of what a path is raise ELOOP: a traceback for the data
    sheets; now it is the link it is."""
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    assert "a link that leads to no file" in _refused(flag, str(loop))


def test_a_folder_or_fifo_given_as_the_profile_says_what_to_give(tmp_path):
    assert "is a directory, not a profile file; give a profile.json in it" in _refused(
        "--profile", str(tmp_path)
    )
    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    assert "is a FIFO, not a profile file; give a profile file" in _refused("--profile", str(fifo))


def test_a_fifo_given_as_the_records_of_calibrate_is_named_a_fifo(tmp_path):
    """Was "a file, not a directory of records"."""
    fifo = tmp_path / "run"
    os.mkfifo(fifo)
    result = pdlsim_here("calibrate", "--from", str(fifo))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert f"--from {fifo}: a FIFO, not a directory of records" in result.stderr
