"""The GPU kit's parts (tools/gpu_parts.py, called by tools/gpu_pack.sh and tools/gpu_run.sh setup): every part
within the device tool's limit whatever the sizes, as few parts as the bytes allow, and the files back byte
for byte where the parts are staged together."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_parts.py"
_spec = importlib.util.spec_from_file_location("gpu_parts", SCRIPT)
gpu_parts = importlib.util.module_from_spec(_spec)
sys.modules["gpu_parts"] = gpu_parts  # dataclasses look their module up by name
_spec.loader.exec_module(gpu_parts)

MIB = 1024 * 1024
# what tools/gpu_pack.sh packs today, at today's sizes (bytes): the shipped reader, the wheels the image lacks,
# DeepSpeed's source and the one need of it the image lacks, the data, the MiniLM package with its metadata, the
# bf16 NaN probe
TODAY = {
    "reader.safetensors": 33_700_000,
    "whl/faiss_cpu-1.15.1-cp312-cp312-manylinux_2_28_x86_64.whl": 13_900_000,
    "whl/pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl": 2_100_000,
    "whl/datasets-5.2.0-py3-none-any.whl": 620_000,
    "whl/multiprocess-0.70.18-py312-none-any.whl": 150_000,
    "whl/dill-0.4.0-py3-none-any.whl": 120_000,
    "whl/pydantic-2.14.4-py3-none-any.whl": 480_000,
    "whl/fastapi-0.165.0-py3-none-any.whl": 110_000,
    "whl/starlette-0.52.0-py3-none-any.whl": 75_000,
    "whl/uvicorn-0.54.0-py3-none-any.whl": 68_000,
    "whl/opentelemetry_api-1.40.0-py3-none-any.whl": 66_000,
    "whl/importlib_metadata-8.8.0-py3-none-any.whl": 27_000,
    "whl/annotated_types-0.7.0-py3-none-any.whl": 13_000,
    "whl/typing_inspection-0.4.2-py3-none-any.whl": 14_000,
    "whl/hjson-3.1.0-py3-none-any.whl": 54_018,
    "whl/big-wheels-of-today.whl": 5_102_982,  # the rest of today's 22.9 MB of wheels
    "sdist/deepspeed-0.19.8.tar.gz": 2_020_482,
    "data.tar.xz": 7_700_000,
    "minilm.tar": 90_900_000,
    "bf16_nan_probe.py": 3_600,
}
TREE = 9_000_000  # about what travels with every call besides its part (the working tree as a tar stream, no reader)
TODAY_LIMIT = 64 * MIB - TREE - 1_000_000  # tools/gpu_pack.sh's limit: 64 MiB less the tree and a margin


def write_files(root: Path, sizes: dict[str, int], seed: int = 0) -> dict[str, str]:
    """Random bytes of each size at its path under `root` → {path: sha256}."""
    generator = random.Random(seed)
    digests = {}
    for path, size in sizes.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        data = generator.randbytes(size)
        target.write_bytes(data)
        digests[path] = hashlib.sha256(data).hexdigest()
    return digests


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def assert_laid_out(parts, sizes: dict[str, int], limit: int) -> None:
    """Every byte of every file in exactly one piece, pieces of positive length at offsets ≥ 0, every part
    within `limit` and all but the last full: ceil(total / limit) parts."""
    total = sum(sizes.values())
    assert len(parts) == max(1, math.ceil(total / limit))
    assert all(part.used <= limit for part in parts)
    assert all(part.used == limit for part in parts[:-1])
    assert all(part.pieces for part in parts)
    for path, size in sizes.items():
        pieces = sorted((p for part in parts for p in part.pieces if p.path == path), key=lambda p: p.offset)
        assert pieces and pieces[0].offset == 0
        assert all(p.length > 0 or p.size == 0 for p in pieces)
        assert all(a.offset + a.length == b.offset for a, b in itertools.pairwise(pieces)), path
        assert pieces[-1].offset + pieces[-1].length == size and all(p.size == size for p in pieces)


def test_todays_kit_fits_in_parts_within_the_limit_and_comes_back_byte_for_byte(tmp_path):
    source, out, home = tmp_path / "stage", tmp_path / "gpu", tmp_path / "home"
    digests = write_files(source, TODAY)
    printed = subprocess.run(
        [sys.executable, str(SCRIPT), "layout", "--limit", str(TODAY_LIMIT), str(source), str(out)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    parts = sorted(out.iterdir())
    # 157 MB in parts of ~57 MB: three calls, each within the limit with its record, none empty
    assert [part.name for part in parts] == ["a", "b", "c"]
    assert all(0 < folder_bytes(part) <= TODAY_LIMIT for part in parts)
    assert len(printed) == 3
    assert printed[0].startswith(f"call 1 of 3: carry [{str(out / 'a')!r}], command 'tools/gpu_run.sh stage'")
    assert printed[2].startswith(f"call 3 of 3: carry [{str(out / 'c')!r}], command 'tools/gpu_run.sh stage setup'")
    # gpu_run.sh stage: each part's contents copied into one folder, in any order; then setup assembles
    for part in reversed(parts):
        shutil.copytree(part, home, dirs_exist_ok=True)
    assert gpu_parts.main(["assemble", str(home)]) == 0
    assert not (home / gpu_parts.PIECES).exists()
    back = {path: hashlib.sha256((home / path).read_bytes()).hexdigest() for path in TODAY}
    assert back == digests
    assert gpu_parts.main(["assemble", str(home)]) == 0  # a second setup only checks


@pytest.mark.parametrize("limit", [TODAY_LIMIT, 40_000_000, 33_700_000, 20 * MIB, 7_700_001, 6_100_000])
def test_the_layout_holds_whatever_the_limit(limit):
    assert_laid_out(gpu_parts.layout(TODAY, limit), TODAY, limit)


def test_the_layout_holds_whatever_the_sizes():
    generator = random.Random(7)
    for _ in range(300):
        count = generator.randrange(1, 12)
        sizes = {f"f{n}": generator.choice([0, 1, generator.randrange(1, 5000)]) for n in range(count)}
        limit = generator.randrange(1, 3000)
        if sum(sizes.values()) > 26 * limit:
            continue
        assert_laid_out(gpu_parts.layout(sizes, limit), sizes, limit)


def test_a_file_that_fits_goes_whole_into_the_part_with_least_room_for_it():
    parts = gpu_parts.layout({"big": 70, "mid": 20, "small": 10}, 100)
    assert [[(p.path, p.offset, p.length) for p in part.pieces] for part in parts] == [
        [("big", 0, 70), ("mid", 0, 20), ("small", 0, 10)]
    ]
    parts = gpu_parts.layout({"big": 250, "small": 30}, 100)  # big in parts a, b, c; small fills c
    assert [[(p.path, p.offset, p.length) for p in part.pieces] for part in parts] == [
        [("big", 0, 100)],
        [("big", 100, 100)],
        [("big", 200, 50), ("small", 0, 30)],
    ]


def test_a_part_not_staged_yet_or_a_changed_byte_is_named(tmp_path):
    source, out = tmp_path / "stage", tmp_path / "gpu"
    write_files(source, {"one.bin": 3000, "two/two.bin": 1000})
    assert gpu_parts.main(["layout", "--limit", str(gpu_parts.RECORD_ROOM + 1500), str(source), str(out)]) == 0
    home = tmp_path / "home"
    shutil.copytree(out / "a", home)
    with pytest.raises(RuntimeError, match=r"parts b, c not staged in .*home yet"):
        gpu_parts.assemble(home)
    for name in "bc":
        shutil.copytree(out / name, home, dirs_exist_ok=True)
    piece = next((home / gpu_parts.PIECES).rglob("one.bin.*"))
    data = piece.read_bytes()
    piece.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(RuntimeError, match=r"one.bin: not the file that was packed"):
        gpu_parts.assemble(home)


def test_a_limit_the_tree_already_fills_or_more_than_26_parts_are_refused():
    with pytest.raises(ValueError, match="a part may hold -5 bytes: nothing fits"):
        gpu_parts.layout({"a": 1}, -5)
    with pytest.raises(ValueError, match="more than 26 parts of 6000000 bytes"):
        gpu_parts.layout(TODAY, 6_000_000)
