#!/usr/bin/env python3
"""Lay the files of a folder out in parts that each fit under a byte limit, and put them back together.

The device tool carries at most 64 MiB a call, the working tree included, so what a bare GPU machine
lacks (tools/gpu_pack.sh) travels in parts, one a call, and is put back together there
(tools/gpu_run.sh setup). A file goes whole into a part with room for it; a file that fits in no part's
room is cut into pieces that fill the room left in the parts, then new parts. A part is only opened when
the others are full, so every part but the last is full, the parts are as few as the bytes allow, and no
piece is empty.

    python3 tools/gpu_parts.py layout --limit BYTES SOURCE OUT [--last-command CMD]
        SOURCE/<path> → OUT/a, OUT/b, …: whole files at their path, pieces under pieces/, and each part's
        record parts-<name>.json (its pieces, and each file's size and sha256); prints one device call a part
    python3 tools/gpu_parts.py assemble HOME
        HOME holds the parts' contents copied together: each cut file is rebuilt from its pieces, every file
        is checked against its sha256, the pieces are removed; names the parts still missing, if any

Standard library only: it runs on the GPU machine's own Python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import string
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

PIECES = "pieces"  # where a part keeps the pieces of cut files
RECORD_PREFIX = "parts-"
CHUNK = 8 * 1024 * 1024  # bytes read at a time when copying or hashing
RECORD_ROOM = 64 * 1024  # bytes of a part left for its record (about 200 a piece)


@dataclass(frozen=True)
class Piece:
    """Bytes [offset, offset + length) of the file at `path` (relative, POSIX), whose whole size is `size`."""

    path: str
    offset: int
    length: int
    size: int

    @property
    def whole(self) -> bool:
        return self.length == self.size

    @property
    def stored(self) -> str:
        """Where the piece lies inside its part: the file's own path when whole, else under pieces/."""
        return self.path if self.whole else f"{PIECES}/{self.path}.{self.offset:012d}"


@dataclass
class Part:
    """One call's load: its name (a, b, …) and its pieces."""

    name: str
    pieces: list[Piece] = field(default_factory=list)

    @property
    def used(self) -> int:
        return sum(piece.length for piece in self.pieces)


def layout(files: dict[str, int], limit: int) -> list[Part]:
    """Parts of at most `limit` bytes holding every byte of `files` ({relative path: size}) exactly once.

    Largest files first; a file goes whole into the part with the least room that holds it, else it is cut
    across the room left in the parts (most room first) and then new parts of `limit` bytes. ValueError
    for a limit that is not positive. No piece has zero length (an empty file is one whole piece of zero
    bytes), a part is opened only when the others are full: ceil(total / limit) parts.
    """
    if limit <= 0:
        raise ValueError(f"a part may hold {limit} bytes: nothing fits (the working tree alone fills a call?)")
    parts: list[Part] = []

    def new_part() -> Part:
        names = string.ascii_lowercase
        if len(parts) == len(names):
            raise ValueError(f"more than {len(names)} parts of {limit} bytes")
        parts.append(Part(names[len(parts)]))
        return parts[-1]

    for path, size in sorted(files.items(), key=lambda item: (-item[1], item[0])):
        room = [part for part in parts if limit - part.used >= size]
        if room or size == 0:
            target = min(room, key=lambda part: limit - part.used) if room else new_part()
            target.pieces.append(Piece(path, 0, size, size))
            continue
        offset = 0
        for part in sorted(parts, key=lambda part: part.used):
            length = min(limit - part.used, size - offset)
            if length > 0:
                part.pieces.append(Piece(path, offset, length, size))
                offset += length
        while offset < size:
            length = min(limit, size - offset)
            new_part().pieces.append(Piece(path, offset, length, size))
            offset += length
    return parts


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def files_under(source: Path) -> dict[str, int]:
    """{path relative to `source`, POSIX: size} of every regular file under `source`."""
    return {
        path.relative_to(source).as_posix(): path.stat().st_size
        for path in sorted(source.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def write_parts(source: Path, out: Path, parts: list[Part]) -> None:
    """The parts as folders out/<name>: whole files hard-linked (or copied), pieces copied, and the record
    parts-<name>.json: {"part", "parts" (every part's name), "files" {path: {size, sha256}}, "pieces"}."""
    digests = {path: sha256(source / path) for path in {piece.path for part in parts for piece in part.pieces}}
    names = [part.name for part in parts]
    for part in parts:
        folder = out / part.name
        if folder.exists():
            shutil.rmtree(folder)
        for piece in part.pieces:
            target = folder / piece.stored
            target.parent.mkdir(parents=True, exist_ok=True)
            if piece.whole:
                try:
                    os.link(source / piece.path, target)
                except OSError:  # another file system
                    shutil.copyfile(source / piece.path, target)
                continue
            with (source / piece.path).open("rb") as reader, target.open("wb") as writer:
                reader.seek(piece.offset)
                left = piece.length
                while left:
                    block = reader.read(min(CHUNK, left))
                    writer.write(block)
                    left -= len(block)
        record = {
            "part": part.name,
            "parts": names,
            "files": {p: {"size": piece.size, "sha256": digests[p]} for piece in part.pieces for p in [piece.path]},
            "pieces": [asdict(piece) for piece in part.pieces],
        }
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{RECORD_PREFIX}{part.name}.json").write_text(json.dumps(record, indent=1))


def assemble(home: Path) -> list[str]:
    """Rebuild every cut file under `home` from its pieces and check every file of the records against its
    sha256 (→ the files' paths); again after that, it checks them only. RuntimeError naming the parts not yet
    there, or the file whose bytes differ."""
    records = [json.loads(path.read_text()) for path in sorted(home.glob(f"{RECORD_PREFIX}*.json"))]
    if not records:
        raise RuntimeError(f"no {RECORD_PREFIX}*.json in {home}: no part has been staged there")
    missing = sorted(set(records[0]["parts"]) - {record["part"] for record in records})
    if missing:
        raise RuntimeError(f"parts {', '.join(missing)} not staged in {home} yet: carry .gpu/<part> and run `stage`")
    files = {path: info for record in records for path, info in record["files"].items()}
    pieces = sorted((Piece(**piece) for record in records for piece in record["pieces"]), key=lambda p: p.offset)
    for path, info in sorted(files.items()):
        target = home / path
        cut = [piece for piece in pieces if piece.path == path and not piece.whole]
        present = [(home / piece.stored).exists() for piece in cut]
        if any(present) or (cut and not target.exists()):  # else rebuilt by an earlier call
            if not all(present):
                raise RuntimeError(f"{target}: pieces missing in {home}/{PIECES} (stage every part again)")
            partial = target.with_name(target.name + ".assembling")
            with partial.open("wb") as writer:
                for piece in cut:
                    with (home / piece.stored).open("rb") as reader:
                        shutil.copyfileobj(reader, writer, CHUNK)
            partial.replace(target)
            for piece in cut:
                (home / piece.stored).unlink()
        if target.stat().st_size != info["size"] or sha256(target) != info["sha256"]:
            raise RuntimeError(f"{target}: not the file that was packed (size or sha256 differs)")
    shutil.rmtree(home / PIECES, ignore_errors=True)
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    lay = commands.add_parser("layout", help="SOURCE's files → OUT/a, OUT/b, … each of at most --limit bytes")
    lay.add_argument("source", type=Path)
    lay.add_argument("out", type=Path)
    lay.add_argument("--limit", type=int, required=True, help="bytes a part may hold, its record included")
    lay.add_argument("--last-command", default="tools/gpu_run.sh stage setup", help="the last call's command")
    put = commands.add_parser("assemble", help="rebuild and check the files of the parts staged in HOME")
    put.add_argument("home", type=Path)
    args = parser.parse_args(argv)
    if args.command == "assemble":
        try:
            paths = assemble(args.home)
        except RuntimeError as error:
            print(f"gpu_parts: {error}", file=sys.stderr)
            return 1
        print(f"gpu_parts: {len(paths)} files checked in {args.home}")
        return 0
    parts = layout(files_under(args.source), args.limit - RECORD_ROOM)
    if not parts:
        print(f"gpu_parts: nothing to pack in {args.source}", file=sys.stderr)
        return 1
    write_parts(args.source, args.out, parts)
    for number, part in enumerate(parts, 1):
        command = args.last_command if number == len(parts) else "tools/gpu_run.sh stage"
        cut = sum(not piece.whole for piece in part.pieces)
        print(
            f"call {number} of {len(parts)}: carry [{str(args.out / part.name)!r}], command {command!r}"
            f"    # {part.used / 1e6:.1f} MB of {args.limit / 1e6:.1f}: {len(part.pieces) - cut} files, {cut} pieces"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
