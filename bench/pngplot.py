# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small line plot written as a PNG with the standard library only (zlib, struct).

The benchmark's one picture - seconds per host against the number of hosts - does not justify a
plotting library and its dozen pinned dependencies in requirements-dev.txt. Text is drawn with a
built-in 5x7 bitmap font (upper case, digits and a little punctuation).
"""

from __future__ import annotations

import math
import struct
import typing as t
import zlib

Color = t.Tuple[int, int, int]

WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
GRID: Color = (225, 225, 225)

_GLYPHS = {
    'A': '01110 10001 10001 11111 10001 10001 10001', 'B': '11110 10001 10001 11110 10001 10001 11110',
    'C': '01110 10001 10000 10000 10000 10001 01110', 'D': '11100 10010 10001 10001 10001 10010 11100',
    'E': '11111 10000 10000 11110 10000 10000 11111', 'F': '11111 10000 10000 11110 10000 10000 10000',
    'G': '01110 10001 10000 10111 10001 10001 01111', 'H': '10001 10001 10001 11111 10001 10001 10001',
    'I': '01110 00100 00100 00100 00100 00100 01110', 'J': '00111 00010 00010 00010 00010 10010 01100',
    'K': '10001 10010 10100 11000 10100 10010 10001', 'L': '10000 10000 10000 10000 10000 10000 11111',
    'M': '10001 11011 10101 10101 10001 10001 10001', 'N': '10001 10001 11001 10101 10011 10001 10001',
    'O': '01110 10001 10001 10001 10001 10001 01110', 'P': '11110 10001 10001 11110 10000 10000 10000',
    'Q': '01110 10001 10001 10001 10101 10010 01101', 'R': '11110 10001 10001 11110 10100 10010 10001',
    'S': '01111 10000 10000 01110 00001 00001 11110', 'T': '11111 00100 00100 00100 00100 00100 00100',
    'U': '10001 10001 10001 10001 10001 10001 01110', 'V': '10001 10001 10001 10001 10001 01010 00100',
    'W': '10001 10001 10001 10101 10101 10101 01010', 'X': '10001 10001 01010 00100 01010 10001 10001',
    'Y': '10001 10001 10001 01010 00100 00100 00100', 'Z': '11111 00001 00010 00100 01000 10000 11111',
    '0': '01110 10001 10011 10101 11001 10001 01110', '1': '00100 01100 00100 00100 00100 00100 01110',
    '2': '01110 10001 00001 00010 00100 01000 11111', '3': '11111 00010 00100 00010 00001 10001 01110',
    '4': '00010 00110 01010 10010 11111 00010 00010', '5': '11111 10000 11110 00001 00001 10001 01110',
    '6': '00110 01000 10000 11110 10001 10001 01110', '7': '11111 00001 00010 00100 01000 01000 01000',
    '8': '01110 10001 10001 01110 10001 10001 01110', '9': '01110 10001 10001 01111 00001 00010 01100',
    '.': '00000 00000 00000 00000 00000 01100 01100', ',': '00000 00000 00000 00000 01100 00100 01000',
    '(': '00010 00100 01000 01000 01000 00100 00010', ')': '01000 00100 00010 00010 00010 00100 01000',
    '/': '00000 00001 00010 00100 01000 10000 00000', '-': '00000 00000 00000 11111 00000 00000 00000',
    ':': '00000 01100 01100 00000 01100 01100 00000', '=': '00000 00000 11111 00000 11111 00000 00000',
    '%': '11000 11001 00010 00100 01000 10011 00011', '+': '00000 00100 00100 11111 00100 00100 00000',
    '_': '00000 00000 00000 00000 00000 00000 11111', ' ': '00000 00000 00000 00000 00000 00000 00000',
    '<': '00010 00100 01000 10000 01000 00100 00010', '>': '01000 00100 00010 00001 00010 00100 01000',
    '?': '01110 10001 00001 00010 00100 00000 00100', "'": '00100 00100 01000 00000 00000 00000 00000',
}
GLYPH_W = 5
GLYPH_H = 7


class Canvas:
    """An RGB image in memory."""

    def __init__(self, width: int, height: int, background: Color = WHITE) -> None:
        self.width = width
        self.height = height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            offset = 3 * (y * self.width + x)
            self.pixels[offset:offset + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        for y in range(max(0, y0), min(self.height, y1 + 1)):
            for x in range(max(0, x0), min(self.width, x1 + 1)):
                self.set(x, y, color)

    def line(self, x0: float, y0: float, x1: float, y1: float, color: Color, width: int = 1, dash: int = 0) -> None:
        """A line of ``width`` pixels; ``dash`` > 0 draws dashes of that many pixels."""
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        half = width // 2
        for step in range(steps + 1):
            if dash and (step // dash) % 2:
                continue
            x = round(x0 + (x1 - x0) * step / steps)
            y = round(y0 + (y1 - y0) * step / steps)
            self.rect(x - half, y - half, x - half + width - 1, y - half + width - 1, color)

    def disc(self, cx: float, cy: float, radius: int, color: Color) -> None:
        for dy in range(-radius, radius + 1):
            for dx in range(-radius, radius + 1):
                if dx * dx + dy * dy <= radius * radius:
                    self.set(round(cx) + dx, round(cy) + dy, color)

    def text(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 2, vertical: bool = False) -> None:
        """Draw ``text`` with its top-left corner at (x, y); ``vertical`` runs it bottom to top."""
        for position, char in enumerate(text.upper()):
            rows = _GLYPHS.get(char, _GLYPHS['?']).split()
            for row, bits in enumerate(rows):
                for col, bit in enumerate(bits):
                    if bit != '1':
                        continue
                    advance = position * (GLYPH_W + 1) * scale
                    for sy in range(scale):
                        for sx in range(scale):
                            if vertical:
                                self.set(x + row * scale + sy, y - advance - col * scale - sx, color)
                            else:
                                self.set(x + advance + col * scale + sx, y + row * scale + sy, color)

    def png(self) -> bytes:
        raw = b''.join(b'\x00' + bytes(self.pixels[3 * self.width * y:3 * self.width * (y + 1)]) for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack('>IIBBBBB', self.width, self.height, 8, 2, 0, 0, 0)
        return b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(raw, 9)) + chunk(b'IEND', b'')


def text_width(text: str, scale: int = 2) -> int:
    return len(text) * (GLYPH_W + 1) * scale


def _nice_step(span: float, ticks: int) -> float:
    raw = span / max(1, ticks)
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _label(value: float) -> str:
    return ('%.2f' % value).rstrip('0').rstrip('.') if value else '0'


class Series(t.NamedTuple):
    label: str
    color: Color
    points: t.Sequence[t.Tuple[float, float]]
    dash: int = 0


def line_plot(path: str, title: str, xlabel: str, ylabel: str, series: t.Sequence[Series], log2_x: bool = True,
              width: int = 1100, height: int = 560) -> None:
    """Write a line plot of ``series`` to ``path``; x on a log2 axis (ticks at the data's x values)."""
    canvas = Canvas(width, height)
    legend_w = max(text_width(s.label) for s in series) + 60 if series else 0
    left, right, top, bottom = 110, legend_w + 50, 60, 80
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = sorted({x for s in series for x, _y in s.points})
    ymax = max([y for s in series for _x, y in s.points] + [1e-9])
    step = _nice_step(ymax * 1.1, 6)
    ytop = step * math.ceil(ymax * 1.1 / step)

    def xpos(x: float) -> float:
        if len(xs) == 1:
            return left + plot_w / 2
        lo, hi = (math.log2(xs[0]), math.log2(xs[-1])) if log2_x else (xs[0], xs[-1])
        value = math.log2(x) if log2_x else x
        return left + 20 + (plot_w - 40) * (value - lo) / (hi - lo)

    def ypos(y: float) -> float:
        return top + plot_h - plot_h * y / ytop

    tick = 0.0
    while tick <= ytop + step / 2:
        y = round(ypos(tick))
        canvas.line(left, y, left + plot_w, y, GRID)
        label = _label(tick)
        canvas.text(left - 10 - text_width(label), y - GLYPH_H, label)
        tick += step
    for x in xs:
        px = round(xpos(x))
        canvas.line(px, top, px, top + plot_h, GRID)
        label = _label(x)
        canvas.text(px - text_width(label) // 2, top + plot_h + 10, label)
    canvas.line(left, top, left, top + plot_h, BLACK, 2)
    canvas.line(left, top + plot_h, left + plot_w, top + plot_h, BLACK, 2)
    for serie in series:
        points = sorted(serie.points)
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            canvas.line(xpos(x0), ypos(y0), xpos(x1), ypos(y1), serie.color, 3, serie.dash)
        for x, y in points:
            canvas.disc(xpos(x), ypos(y), 5, serie.color)
    canvas.text((width - text_width(title, 3)) // 2, 15, title, scale=3)
    canvas.text(left + (plot_w - text_width(xlabel)) // 2, height - 35, xlabel)
    canvas.text(14, top + (plot_h + text_width(ylabel)) // 2, ylabel, vertical=True)
    legend_x, legend_y = left + plot_w + 30, top + 12
    canvas.rect(legend_x - 8, legend_y - 8, legend_x + legend_w, legend_y + 26 * len(series) - 4, (250, 250, 250))
    for row, serie in enumerate(series):
        y = legend_y + 26 * row + GLYPH_H
        canvas.line(legend_x, y, legend_x + 36, y, serie.color, 3, serie.dash)
        canvas.text(legend_x + 46, y - GLYPH_H, serie.label)
    with open(path, 'wb') as handle:
        handle.write(canvas.png())
