"""Row windows: how to cover a tensor larger than one storage-buffer binding
(``maxStorageBufferRange``) with several bindings of the same buffer at legal offsets."""

from __future__ import annotations

from math import gcd


def row_windows(rows: int, row_nbytes: tuple[int, ...], max_nbytes: int, alignment: int,
                unit: int = 1) -> list[tuple[int, int]]:
    """``[(r0, r1), ...]`` covering ``rows``. For every buffer involved (bytes per row in
    ``row_nbytes``) a window must start at a multiple of ``alignment`` bytes
    (minStorageBufferOffsetAlignment) and span at most ``max_nbytes``; ``r0`` is a multiple of
    ``unit`` (rows that are packed together). One window when everything fits."""
    padded_rows = (rows + unit - 1) // unit * unit  # a partial last unit is packed whole
    if max(row_nbytes) * padded_rows <= max_nbytes:
        return [(0, rows)]
    # r0 * nbytes is a multiple of alignment <=> r0 is a multiple of alignment / gcd(nbytes, alignment)
    step = unit
    for nbytes in row_nbytes:
        need = alignment // gcd(nbytes, alignment)
        step = step * need // gcd(step, need)
    per = max_nbytes // max(row_nbytes) // step * step
    if per == 0:
        raise ValueError(f"{step} rows of {max(row_nbytes)} bytes exceed one {max_nbytes}-byte binding")
    return [(r, min(r + per, rows)) for r in range(0, rows, per)]
