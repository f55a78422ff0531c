"""CSV/TSV cells and rows (``read --csv``/``--tsv`` and every table command): RFC 4180
quoting on every Python, read back by a CSV reader as the values written."""

from __future__ import annotations

import csv
import io

from hypothesis import given
from hypothesis import strategies as st

from rmqstore.documents import delimited_row, document_cells

CELL_TEXT = st.text(alphabet=st.sampled_from(list('ab ,\t"\n\r\x00é😀')), max_size=8)


@given(st.lists(CELL_TEXT, min_size=1, max_size=5), st.sampled_from([",", "\t"]))
def test_a_row_reads_back_as_its_cells(cells: list[str], delimiter: str) -> None:
    text = delimited_row(cells, delimiter)
    assert text.endswith("\n")
    (row,) = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    assert row == cells


@given(st.lists(CELL_TEXT, min_size=1, max_size=5), st.sampled_from([",", "\t"]))
def test_a_row_is_what_the_csv_module_writes_but_for_carriage_returns(
    cells: list[str], delimiter: str
) -> None:
    """The csv module's text, save that a cell holding a carriage return is quoted: Python
    before 3.11.9/3.12.3 left it bare, and a CSV reader then split the row."""
    text = io.StringIO()
    csv.writer(text, delimiter=delimiter, lineterminator="\n").writerow(cells)
    if not any("\r" in cell for cell in cells):
        assert delimited_row(cells, delimiter) == text.getvalue()


def test_quoting() -> None:
    assert delimited_row(["a", "b c", "1"], ",") == "a,b c,1\n"
    assert delimited_row(["a,b", 'say "hi"', "x\ny", "cr\rhere"], ",") == (
        '"a,b","say ""hi""","x\ny","cr\rhere"\n'
    )
    assert delimited_row(["a,b", "tab\there"], "\t") == 'a,b\t"tab\there"\n'
    assert delimited_row([""], ",") == '""\n'  # a row of one empty cell is not an empty line
    assert delimited_row(["", ""], ",") == ",\n"


def test_cells_of_a_document() -> None:
    document = {"n": 3, "t": "x", "b": True, "f": False, "o": {"k": "é"}, "l": [1], "z": None}
    assert document_cells(document, ["n", "t", "b", "f", "o", "l", "z", "missing"]) == [
        "3", "x", "true", "false", '{"k":"é"}', "[1]", "", "",
    ]  # fmt: skip
