"""rmqstore.pipeline.arrowcalls: pyarrow imported without numpy for a process of its own."""

from __future__ import annotations

import json
from pathlib import Path

from rmqstore.fixtures import generate

from support import fresh_python, parquet_rows

# in a fresh interpreter: pyarrow loaded without numpy, an export and stats, then numpy
_WITHOUT_NUMPY = """
import json, sys
from rmqstore.pipeline.arrowcalls import import_pyarrow_without_numpy
from rmqstore.pipeline.local import LocalPipeline, PipelineOptions
loaded = import_pyarrow_without_numpy()
assert "pyarrow.parquet" in sys.modules and "numpy" not in sys.modules
pipeline = LocalPipeline(sys.argv[1], PipelineOptions(split=9000))
exported = pipeline.export(sys.argv[2], "parquet").messages
numpy_after_export = "numpy" in sys.modules
stats = pipeline.stats()  # imports numpy itself, and reads Arrow buffers through it
import numpy
print(json.dumps({
    "loaded": loaded,
    "exported": exported,
    "numpyAfterExport": numpy_after_export,
    "stats": stats.to_dict(),
    "numpy": numpy.__name__,
}))
"""


def test_without_numpy_an_export_writes_the_same_files_and_stats_still_count(
    tmp_path: Path,
) -> None:
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    found = json.loads(fresh_python(_WITHOUT_NUMPY, store_dir, tmp_path / "alone"))
    assert found["loaded"] is True
    assert found["numpyAfterExport"] is False  # nothing in the export asked for numpy
    assert found["numpy"] == "numpy"  # and numpy is importable afterwards
    from rmqstore.pipeline.local import LocalPipeline, PipelineOptions

    # the same store exported and counted here, where pyarrow has numpy
    pipeline = LocalPipeline(str(store_dir), PipelineOptions(split=9000))
    expected = pipeline.export(str(tmp_path / "with"), "parquet")
    assert found["exported"] == expected.messages > 0
    assert found["stats"] == pipeline.stats().to_dict()
    assert parquet_rows(tmp_path / "alone") == parquet_rows(tmp_path / "with")
    parts = sorted(path.name for path in (tmp_path / "with").iterdir())
    assert parts == sorted(path.name for path in (tmp_path / "alone").iterdir())
    for name in parts:  # byte for byte
        assert (tmp_path / "alone" / name).read_bytes() == (tmp_path / "with" / name).read_bytes()


def test_nothing_changes_where_numpy_or_pyarrow_is_already_loaded() -> None:
    code = (
        "import sys\n"
        "import {first}\n"
        "from rmqstore.pipeline.arrowcalls import import_pyarrow_without_numpy\n"
        "print(import_pyarrow_without_numpy(), 'numpy' in sys.modules)\n"
    )
    assert fresh_python(code.format(first="numpy")).split() == ["False", "True"]
    # pyarrow first: it brought numpy in, as where rmqstore is not the process's owner
    assert fresh_python(code.format(first="pyarrow")).split() == ["False", "True"]
