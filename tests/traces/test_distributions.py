"""traces.distributions: Tiresias' empirical job-size (GPU-time) distributions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from traces import TraceError
from traces.distributions import (
    bundled_distributions,
    load_size_distribution,
    resolve_distribution,
)

DATA = Path(__file__).resolve().parents[2] / "traces" / "data" / "tiresias"
SHARED = Path("/work/shared/data/tiresias")

# Sample counts of the published files; all three share the smallest (121 s) and largest
# (53,294,624 s) job and hold whole seconds only.
EXPECTED = {"yarn-gput1000": 1001, "yarn-gput5000": 5000, "yarn-gput10000": 9999}


def write(tmp_path: Path, text: str, name: str = "sizes.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def test_bundled_names() -> None:
    assert bundled_distributions() == list(EXPECTED)


@pytest.mark.parametrize(("name", "count"), EXPECTED.items())
def test_bundled_distribution_loads_sorted(name: str, count: int) -> None:
    sizes = load_size_distribution(name)
    assert sizes.dtype == np.float64 and sizes.shape == (count,)
    assert (sizes[0], sizes[-1]) == (121.0, 53_294_624.0)
    assert np.all(np.diff(sizes) >= 0)
    assert np.array_equal(sizes, np.round(sizes))
    assert not sizes.flags.writeable
    with pytest.raises(ValueError):
        sizes[0] = 1.0


def test_yarn_gput1000_spot_values() -> None:
    # First data lines of the file (already ascending): 121, 122, 124, 126, 128.
    sizes = load_size_distribution("yarn-gput1000")
    assert sizes[:5].tolist() == [121.0, 122.0, 124.0, 126.0, 128.0]
    assert int((sizes < 3250).sum()) == 607  # 607 of 1001 jobs would finish inside Q0


def test_tiresias_prefix_is_an_alias() -> None:
    assert resolve_distribution("tiresias/yarn-gput5000") == DATA / "yarn-gput5000.csv"
    assert np.array_equal(load_size_distribution("tiresias/yarn-gput5000"),
                          load_size_distribution("yarn-gput5000"))


@pytest.mark.skipif(not SHARED.is_dir(), reason="reference data folder not present")
@pytest.mark.parametrize("name", EXPECTED)
def test_bundled_files_are_byte_identical_to_the_reference_copies(name: str) -> None:
    ours = DATA / f"{name}.csv"
    assert ours.read_bytes() == (SHARED / f"{name}.csv").read_bytes()
    assert ours.read_bytes().startswith(b"duration\r\n")  # CRLF, as published


def test_file_is_sorted_on_load_and_accepts_decimals(tmp_path: Path) -> None:
    path = write(tmp_path, "duration\r\n30\r\n1.5\r\n\r\n7e2\r\n10\r\n")  # blank line skipped
    for arg in (path, str(path)):
        assert load_size_distribution(arg).tolist() == [1.5, 10.0, 30.0, 700.0]


def test_a_path_object_is_never_a_bundled_name() -> None:
    with pytest.raises(TraceError) as exc:
        load_size_distribution(Path("yarn-gput1000"))
    assert exc.value.line is None


def test_unknown_name_suggests_close_matches() -> None:
    with pytest.raises(TraceError) as exc:
        load_size_distribution("yarn-gput100")
    assert exc.value.line is None
    text = str(exc.value)
    assert "no bundled size distribution or file of that name" in text
    assert "close matches: yarn-gput1000" in text


# (file text, line, column, fragment of the message)
BAD_FILES: list[tuple[str, int | None, str | None, str]] = [
    ("duration\n5\nabc\n", 3, "duration", "expected a positive number, got 'abc'"),
    ("duration\n5\n0\n", 3, "duration", "expected a positive number, got '0'"),
    ("duration\n-5\n", 2, "duration", "expected a positive number, got '-5'"),
    ("duration\n5\n6\nnan\n", 4, "duration", "got 'nan'"),
    ("duration\ninf\n", 2, "duration", "got 'inf'"),
    ("duration\n5\n6,7\n", 3, None, "expected 1 fields, got 2"),
    ("size\n5\n", 1, None, "expected the single column 'duration'; got 'size'"),
    ("job_id,duration\n1,5\n", 1, None, "got 'job_id', 'duration'"),
    ("duration\n", None, None, "no job sizes"),
    ("", 1, None, "expected a header row"),
]


@pytest.mark.parametrize(("text", "line", "column", "fragment"), BAD_FILES,
                         ids=[repr(t[:24]) for t, *_ in BAD_FILES])
def test_bad_file_names_file_line_and_column(
    tmp_path: Path, text: str, line: int | None, column: str | None, fragment: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TraceError) as exc:
        load_size_distribution(path)
    err = exc.value
    assert (err.path, err.line, err.field) == (path, line, column)
    assert fragment in str(err)
    if line is not None:
        assert str(err).startswith(f"sizes.csv line {line}")


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "sizes.csv"
    path.write_bytes(b"duration\n\xff\xfe\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        load_size_distribution(path)
