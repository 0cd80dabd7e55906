"""`loom compare --traces`: the policy × trace matrix, its `compare.json`, its self-contained
`report.html`, the `TRACE@CLUSTER` syntax and its errors; `loom compare --trace` unchanged."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from loom.cli import main
from loom.compare_traces import parse_traces
from tests.traces.production_builders import write_helios

POLICIES = ("fifo", "srtf")
# srtf on Muri's trace3 on n8g8, as `loom sim` decides it: the matrix runs the same services.
TRACE3_SRTF_DIGEST = "f1677f5fc8230a1d28ffff2c616f7668b35f62bb7357bbff5a3c64818fc6ca20"


def helios_log(directory: Path, jobs: int = 24) -> Path:
    """A small Helios-format log: a job a minute, 1 to 8 GPUs, three VCs of unequal use."""
    rows = [{"submit_time": f"2020-04-01 00:{m:02d}:00",
             "start_time": f"2020-04-01 00:{m:02d}:05",
             "duration": str(300 + 40 * m), "gpu_num": str((1, 2, 4, 8)[m % 4]),
             "vc": ("vcA", "vcA", "vcB", "vcC")[m % 4 if m % 3 else 0]} for m in range(jobs)]
    directory.mkdir(parents=True, exist_ok=True)
    return write_helios(directory, rows)


@dataclass
class Matrix:
    """One matrix run, shared by the tests that read its outputs."""

    dest: Path
    entries: list[str]
    code: int
    rows: list[dict[str, object]] = field(default_factory=list)
    html: str = ""


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    base = tmp_path_factory.mktemp("matrix")
    helios = helios_log(base / "helios")
    dest = base / "out"
    # trace3 and the Helios log on --cluster n8g8; the Tiresias trace on a cluster of its own.
    code = main(["compare", "--traces", f"muri/trace3,{helios},tiresias/60_job@n1g4",
                 "--cluster", "n8g8", "--policies", ",".join(POLICIES), "--out", str(dest),
                 "--processes", "2", "--no-plot", "--quiet"])
    done = Matrix(dest=dest, entries=["muri/trace3", str(helios), "tiresias/60_job@n1g4"],
                  code=code)
    if (dest / "compare.json").exists():
        done.rows = json.loads((dest / "compare.json").read_text())
    if (dest / "report.html").exists():
        done.html = (dest / "report.html").read_text(encoding="utf-8")
    return done


def test_the_matrix_runs_every_policy_on_every_trace(matrix: Matrix) -> None:
    assert matrix.code == 0
    cells = {(r["entry"], r["policy"]) for r in matrix.rows}
    assert cells == {(e, p) for e in matrix.entries for p in POLICIES}
    assert len(matrix.rows) == len(cells)
    for row in matrix.rows:
        assert isinstance(row["avg_jct_s"], float) and row["avg_jct_s"] > 0
        assert isinstance(row["finished"], int) and row["finished"] > 0
        assert isinstance(row["gpu_util"], float) and 0 < row["gpu_util"] <= 1
        run = matrix.dest / str(row["out"])
        assert json.loads((run / "summary.json").read_text())["decision_digest"] \
            == row["decision_digest"]
        assert (run / "jobs.csv").exists()
    # an entry without @CLUSTER runs on --cluster; one with it, on its own
    clusters = {r["entry"]: r["cluster"] for r in matrix.rows}
    assert clusters == {"muri/trace3": "n8g8", matrix.entries[1]: "n8g8",
                        "tiresias/60_job@n1g4": "n1g4"}


def test_the_matrix_decides_as_loom_sim_does(matrix: Matrix) -> None:
    srtf = next(r for r in matrix.rows if r["entry"] == "muri/trace3" and r["policy"] == "srtf")
    assert srtf["decision_digest"] == TRACE3_SRTF_DIGEST


def test_production_trace_cells_say_how_the_trace_was_read(matrix: Matrix) -> None:
    helios = [r for r in matrix.rows if r["entry"] == matrix.entries[1]]
    assert helios and all(r["trace_format"] == "helios" for r in helios)
    for row in helios:
        tenants = row["tenants"]
        assert isinstance(tenants, dict) and set(tenants) == {"vcA", "vcB", "vcC"}


VOID = {"meta", "br", "img", "hr", "input", "link", "col", "area", "base", "wbr", "source"}
# SVG elements written self-closed (<line/>, <path/>)
SELF_CLOSED_OK = {"line", "path", "rect", "circle", "polyline"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element] = field(default_factory=list)
    text: str = ""

    def find_all(self, tag: str, **attrs: str) -> list[Element]:
        found = [self] if self.tag == tag and all(
            self.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items()) else []
        for child in self.children:
            found += child.find_all(tag, **attrs)
        return found

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)


class TreeBuilder(HTMLParser):
    """A strict tree of the page: every element closed, in order (no browser repair)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {})
        self.stack = [self.root]
        self.problems: list[str] = []
        self.doctype = ""

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID and tag not in SELF_CLOSED_OK:
            self.problems.append(f"<{tag}/> self-closed")
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if len(self.stack) == 1 or self.stack[-1].tag != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1].tag}>")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].text += data


def parse(page: str) -> TreeBuilder:
    tree = TreeBuilder()
    tree.feed(page)
    tree.close()
    return tree


def test_the_report_is_well_formed_and_self_contained(matrix: Matrix) -> None:
    tree = parse(matrix.html)
    assert tree.doctype.lower() == "doctype html"
    assert tree.problems == [] and len(tree.stack) == 1, tree.problems[:5]
    lowered = matrix.html.lower()
    for external in ("http://", "https://", "//cdn", "<script", "<link", "@import", "url(",
                     " src=", "<iframe", "<object", "<embed"):
        assert external not in lowered, external
    assert tree.root.find_all("style")  # the CSS is inline


def test_the_report_has_each_traces_table_and_charts(matrix: Matrix) -> None:
    root = parse(matrix.html).root
    sections = {s.attrs["data-trace"]: s for s in root.find_all("section")}
    assert list(sections) == matrix.entries
    for entry, section in sections.items():
        charts = {svg.attrs["data-chart"]: svg for svg in section.find_all("svg")}
        assert set(charts) == {"cdf", "waits", "utilisation", "tenants"}, entry
        cdf_lines = [p.attrs["data-policy"] for p in charts["cdf"].find_all("path")
                     if "data-policy" in p.attrs]
        assert cdf_lines == list(POLICIES), entry
        util_lines = [p.attrs["data-policy"] for p in charts["utilisation"].find_all("path")
                      if "data-policy" in p.attrs]
        assert util_lines == list(POLICIES), entry
        assert {r.attrs["data-policy"] for r in charts["waits"].find_all("rect")} \
            == set(POLICIES), entry
        results = section.find_all("table", **{"class": "results"})
        assert len(results) == 1
        first_column = [row.children[0].all_text() for row in results[0].find_all("tr")[1:]]
        assert first_column == list(POLICIES), entry
    # job sizes of the Helios log: 1, 2, 3–4 and 5–8 GPUs
    helios = sections[matrix.entries[1]]
    waits = helios.find_all("table", **{"class": "waits"})[0].all_text()
    for bucket in ("1 GPU", "2 GPUs", "3–4 GPUs", "5–8 GPUs"):
        assert bucket in waits
    tenants = helios.find_all("table", **{"class": "tenants"})[0].all_text()
    assert all(vc in tenants for vc in ("vcA", "vcB", "vcC"))
    overview = root.find_all("table", **{"class": "overview"})[0].all_text()
    assert all(entry in overview for entry in matrix.entries)


@pytest.mark.parametrize(("traces", "extra", "message"), [
    ("muri/trace3@", [], "--traces entry 'muri/trace3@' names no cluster after @"),
    ("@n8g8", [], "--traces entry '@n8g8' names no trace before @"),
    ("muri/trace3,,tiresias/60_job", ["--cluster", "n8g8"], "entry 2 is empty"),
    ("muri/trace3@n8g8,tiresias/60_job", [],
     "--traces entry 'tiresias/60_job' names no cluster: write tiresias/60_job@CLUSTER"),
    ("muri/trace3@n8g8,muri/trace3", ["--cluster", "n8g8"],
     "--traces lists muri/trace3 on n8g8 twice ('muri/trace3@n8g8' and 'muri/trace3')"),
    ("tiresias/60_job@n1g4,muri/nope@n8g8", [],
     "--traces entry 'muri/nope@n8g8': muri/nope: no bundled trace"),
    ("muri/trace3@n99g99", [], "--traces entry 'muri/trace3@n99g99': "),
])
def test_bad_traces_exit_2_naming_the_entry(traces: str, extra: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--traces", traces, *extra, "--policies", "fifo", "--no-plot",
                 "--quiet"]) == 2
    assert message in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(("argv", "message"), [
    (["--trace", "muri/trace3", "--traces", "muri/trace3@n8g8"], "not allowed with argument"),
    ([], "one of the arguments --trace --traces is required"),
])
def test_trace_and_traces_are_one_or_the_other(argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["compare", *argv, "--policies", "fifo"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_one_trace_still_needs_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--trace", "muri/trace3", "--policies", "fifo"]) == 2
    assert "--cluster is required with --trace" in capsys.readouterr().err


def test_one_trace_writes_what_it_always_wrote(tmp_path: Path) -> None:
    assert main(["compare", "--trace", "tiresias/60_job", "--cluster", "n1g4", "--policies",
                 "fifo", "--out", str(tmp_path), "--no-plot", "--quiet"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.json", "fifo"]
    combined = json.loads((tmp_path / "compare.json").read_text())
    assert [s["policy"] for s in combined] == ["fifo"] and "entry" not in combined[0]


@pytest.mark.parametrize(("text", "cluster", "expected"), [
    # (trace, cluster, own cluster, folder, label) per entry
    ("muri/trace3", "n8g8", [("muri/trace3", "n8g8", False, "trace3", "muri/trace3")]),
    (" muri/trace2@n8g8 , helios_log.csv@helios/venus ", None,
     [("muri/trace2", "n8g8", True, "trace2@n8g8", "muri/trace2@n8g8"),
      ("helios_log.csv", "helios/venus", True, "helios_log@venus",
       "helios_log.csv@helios/venus")]),
    ("runs@2020/log.csv@36:36:36", None,  # the last @ splits
     [("runs@2020/log.csv", "36:36:36", True, "log@36_36_36", "runs@2020/log.csv@36:36:36")]),
    ("a/x.csv,b/x.csv", "n1g4",  # the same file name twice: the second folder is numbered
     [("a/x.csv", "n1g4", False, "x", "a/x.csv"), ("b/x.csv", "n1g4", False, "x-2", "b/x.csv")]),
    ("muri/trace3@n8g8,muri/trace3@n4g8", None,  # one trace on two clusters
     [("muri/trace3", "n8g8", True, "trace3@n8g8", "muri/trace3@n8g8"),
      ("muri/trace3", "n4g8", True, "trace3@n4g8", "muri/trace3@n4g8")]),
])
def test_traces_syntax(text: str, cluster: str | None,
                       expected: list[tuple[str, str, bool, str, str]]) -> None:
    entries = parse_traces(text, cluster)
    assert [(e.trace, e.cluster, e.own_cluster, e.folder, e.label) for e in entries] == expected
