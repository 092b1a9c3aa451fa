"""Animated GIFs written one frame at a time: a film of any length takes the memory of one frame.

Pillow writes a GIF only once it holds every frame (it compares each frame with the ones before it),
and imageio's default GIF writer collects the frames for Pillow until it closes: an episode of
DoorKey-16x16 (2,561 frames of 512 x 512) then takes gigabytes. imageio's streaming legacy writer
(format "GIF-PIL") assumes 256-colour palettes, which Pillow no longer always writes, and its frames
then cannot be read back. So here Pillow encodes each frame alone (a one-frame GIF in memory), and
the file receives, per frame, a graphic control block of our own (the frame's delay) and that GIF's
image block with its colour table made local to the frame (GIF89a specification). Only the rectangle
that changed since the previous frame is encoded; the rest stays on screen.

A small frame is enlarged by an integer factor (nearest neighbour: each pixel becomes a block, so
cells and lines stay sharp and no colour is added) after its colours are reduced to a palette, which
is then done on the small frame: 25 times fewer pixels for Ballet's 108 x 99 px, enlarged 5 times.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
from PIL import Image

MIN_GIF_SIDE = 400  # px: a smaller frame is enlarged (Ballet renders 108 x 99 px, too small to watch)


def scale_factor(height: int, width: int, min_side: int = MIN_GIF_SIDE) -> int:
    """The smallest integer factor that makes the short side at least ``min_side`` px (1: large enough)."""
    return max(1, -(-min_side // min(height, width)))


class GifWriter:
    """``append(frame)`` encodes an RGB frame ``[H, W, 3]`` uint8 and writes it to ``path`` at once;
    ``close()`` ends the file (a context manager closes it even after an error, so what was written
    plays). Frames are enlarged by ``scale_factor`` of the first one (``min_side``; 0 keeps them as
    they are). The animation loops forever; each frame shows for ``round(100 / fps)`` hundredths of
    a second, the unit a GIF stores (8 fps: 0.12 s)."""

    def __init__(self, path: str | Path, fps: float = 8, min_side: int = MIN_GIF_SIDE):
        if not 0 < fps <= 50:  # browsers show a delay under 0.02 s as 0.1 s
            raise ValueError(f"fps must be in (0, 50], got {fps}")
        self.delay, self.min_side = round(100 / fps), min_side
        self.file = open(path, "wb")
        self.size: tuple[int, int] | None = None  # of the frames appended, before enlarging
        self.scale = 1
        self.previous: np.ndarray | None = None
        self.frames = 0

    def append(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(f"a GIF frame must be RGB [H, W, 3] uint8, got {frame.shape} {frame.dtype}")
        height, width = frame.shape[:2]
        if self.size is None:
            self.size, self.scale = (width, height), scale_factor(height, width, self.min_side)
            # Header, logical screen (no global colour table: every frame brings its own), loop forever.
            self.file.write(b"GIF89a" + struct.pack("<HHBBB", width * self.scale, height * self.scale, 0x70, 0, 0))
            self.file.write(b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00")
        elif (width, height) != self.size:
            raise ValueError(f"every frame of a GIF has the first one's size {self.size[1]}x{self.size[0]}, "
                             f"got {height}x{width}")
        left, top, region = self._changed(frame)
        # Graphic control: disposal 1 (leave the frame in place: the next one covers only what changed).
        self.file.write(struct.pack("<BBBBHBB", 0x21, 0xF9, 4, 1 << 2, self.delay, 0, 0))
        self.file.write(_image_block(region, left, top, self.scale))
        self.file.flush()  # on disk now: a viewer (or a crash) finds every frame played so far
        self.previous = frame
        self.frames += 1

    def _changed(self, frame: np.ndarray) -> tuple[int, int, np.ndarray]:
        """``(left, top, region)``: the smallest rectangle that differs from the previous frame."""
        if self.previous is None:
            return 0, 0, frame
        changed = (frame != self.previous).reshape(frame.shape[0], -1)  # [H, W * 3]: fast reductions
        rows = np.flatnonzero(changed.any(axis=1))
        if rows.size == 0:  # the same picture: one pixel redrawn as it was keeps the frame's delay
            return 0, 0, frame[:1, :1]
        cols = np.flatnonzero(changed[rows[0]:rows[-1] + 1].any(axis=0).reshape(-1, 3).any(axis=1))
        return int(cols[0]), int(rows[0]), frame[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]

    def close(self) -> None:
        if not self.file.closed:
            self.file.write(b";")  # the trailer
            self.file.close()

    def __enter__(self) -> GifWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _image_block(region: np.ndarray, left: int, top: int, scale: int) -> bytes:
    """Pillow's encoding of ``region`` enlarged ``scale`` times as the image block of one frame placed at
    ``(left, top) * scale``: image descriptor, local colour table, LZW data."""
    # The palette Pillow's GIF writer would make of an RGB image (its _normalize_mode), made here
    # before enlarging; a palette image is enlarged without new colours.
    image = Image.fromarray(np.ascontiguousarray(region)).convert("P", palette=Image.Palette.ADAPTIVE)
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    image.save(buffer, format="GIF")
    data = buffer.getvalue()
    flags = data[10]  # of the logical screen descriptor: is there a global colour table, and its size
    table = data[13:13 + (3 << ((flags & 7) + 1))] if flags & 0x80 else b""
    pos = 13 + len(table)
    while data[pos] == 0x21:  # an extension Pillow wrote (comment, its own control block): skipped
        pos += 2
        while data[pos]:
            pos += data[pos] + 1
        pos += 1
    if data[pos] != 0x2C or data[-1] != 0x3B:
        raise RuntimeError("Pillow wrote a GIF of an unexpected layout")
    _, _, _, width, height, packed = struct.unpack_from("<BHHHHB", data, pos)
    rest = data[pos + 10:-1]  # its own colour table if any, LZW code size, data sub-blocks (no trailer)
    if not packed & 0x80 and table:  # the global colour table becomes the frame's local one
        packed |= 0x80 | (flags & 7)
        rest = table + rest
    return struct.pack("<BHHHHB", 0x2C, left * scale, top * scale, width, height, packed) + rest
