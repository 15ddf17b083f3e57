import pytest

from vkgraph.graph.windows import row_windows


@pytest.mark.parametrize("rows,row_nbytes,max_nbytes,align,unit", [
    (10, (40,), 1000, 16, 1), (100, (40,), 1000, 16, 1), (100, (360,), 1000, 16, 1), (1000, (360,), 20000, 256, 1),
    (103, (16, 36), 1000, 64, 4), (8200, (16400, 16400), 1 << 27, 16, 4), (7, (1,), 3, 1, 1), (5, (800,), 4096, 16, 4)])
def test_windows_cover_rows_at_legal_offsets(rows, row_nbytes, max_nbytes, align, unit):
    wins = row_windows(rows, row_nbytes, max_nbytes, align, unit)
    assert wins[0][0] == 0 and wins[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(wins, wins[1:]))
    for r0, r1 in wins:
        assert r0 % unit == 0 and r1 > r0
        for nb in row_nbytes:
            padded = (r1 - r0 + unit - 1) // unit * unit
            assert (r0 * nb) % align == 0 and padded * nb <= max_nbytes


def test_granule_too_big():
    with pytest.raises(ValueError, match="32 rows of 360 bytes exceed one 1000-byte binding"):
        row_windows(100, (360,), 1000, 256)
