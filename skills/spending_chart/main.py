"""spending_chart: a customer's orders to a PNG bar chart of spending by ISO week.

Runs inside the turn's sandbox with the system Python and nothing else: no network, no
project packages, so the PNG is drawn here with the standard library (zlib + struct).

    python3 main.py INPUT.json OUT_DIR

INPUT holds {"arguments": {...}, "data": {"orders": [{"placed", "total", "status"}, ...]}},
the orders put there by the server from its own tools. Writes OUT_DIR/spending_by_week.png
and prints a JSON summary (the weeks and their totals) on stdout.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from datetime import date
from decimal import Decimal
from pathlib import Path

WIDTH, HEIGHT = 640, 360
MARGIN = 40
BACKGROUND = (255, 255, 255)
AXIS = (60, 60, 60)
BAR = (46, 110, 190)

# 3x5 digits, one row of three bits per line: enough to label each bar with its week number.
DIGITS = {
    "0": ("111", "101", "101", "101", "111"),
    "1": ("010", "110", "010", "010", "111"),
    "2": ("111", "001", "111", "100", "111"),
    "3": ("111", "001", "111", "001", "111"),
    "4": ("101", "101", "111", "001", "001"),
    "5": ("111", "100", "111", "001", "111"),
    "6": ("111", "100", "111", "101", "111"),
    "7": ("111", "001", "010", "010", "010"),
    "8": ("111", "101", "111", "101", "111"),
    "9": ("111", "101", "111", "001", "111"),
}


def weekly_totals(orders: list[dict[str, object]]) -> list[tuple[str, Decimal]]:
    """Spending per ISO week, from the first week with an order to the last one, weeks
    without orders included as zero; cancelled orders are not spending."""
    totals: dict[tuple[int, int], Decimal] = {}
    for order in orders:
        if order.get("status") == "cancelled":
            continue
        year, week, _ = date.fromisoformat(str(order["placed"])).isocalendar()
        totals[(year, week)] = totals.get((year, week), Decimal(0)) + Decimal(str(order["total"]))
    if not totals:
        return []
    first, last = min(totals), max(totals)
    weeks: list[tuple[str, Decimal]] = []
    monday = date.fromisocalendar(first[0], first[1], 1)
    while monday.isocalendar()[:2] <= last:
        key = monday.isocalendar()[:2]
        weeks.append((f"{key[0]}-W{key[1]:02d}", totals.get(key, Decimal(0))))
        monday = date.fromordinal(monday.toordinal() + 7)
    return weeks


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.rows = [bytearray(bytes(BACKGROUND) * width) for _ in range(height)]

    def fill(self, x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(self.height, y1)):
            row = self.rows[y]
            for x in range(max(0, x0), min(self.width, x1)):
                row[3 * x : 3 * x + 3] = bytes(colour)

    def text(self, x: int, y: int, digits: str, scale: int = 2) -> None:
        for i, ch in enumerate(digits):
            for dy, line in enumerate(DIGITS.get(ch, ("000",) * 5)):
                for dx, bit in enumerate(line):
                    if bit == "1":
                        left = x + (4 * i + dx) * scale
                        self.fill(left, y + dy * scale, left + scale, y + (dy + 1) * scale, AXIS)

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(row) for row in self.rows)  # filter type 0 per row

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def draw(weeks: list[tuple[str, Decimal]]) -> bytes:
    canvas = Canvas(WIDTH, HEIGHT)
    base, top = HEIGHT - MARGIN, MARGIN
    canvas.fill(MARGIN, top, MARGIN + 2, base + 1, AXIS)  # y axis
    canvas.fill(MARGIN, base, WIDTH - MARGIN, base + 2, AXIS)  # x axis
    highest = max((total for _, total in weeks), default=Decimal(0)) or Decimal(1)
    slot = (WIDTH - 2 * MARGIN) // max(1, len(weeks))
    for i, (label, total) in enumerate(weeks):
        height = int((base - top) * total / highest)
        left = MARGIN + i * slot + slot // 5
        canvas.fill(left, base - height, left + slot * 3 // 5, base, BAR)
        canvas.text(left, base + 8, label.rsplit("W", 1)[1])
    return canvas.png()


def main(argv: list[str]) -> int:
    payload = json.loads(Path(argv[1]).read_text())
    weeks = weekly_totals(list(payload.get("data", {}).get("orders", [])))
    out = Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    (out / "spending_by_week.png").write_bytes(draw(weeks))
    summary = {"weeks": [{"week": w, "total": f"{t:.2f}"} for w, t in weeks]}
    sys.stdout.write(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
