"""pyarrow without pandas (aml_ray.run.no_pandas, issue 29's CPU footprint): the tables aml-ray builds from
Python objects no longer import pandas (0.24 s of CPU a process), and a conversion that needs pandas still
gets it. Each case in a fresh interpreter: the check is once per process. The actors' side (tune_actor_gc):
tests/test_ray_runtime.py."""

from __future__ import annotations

import json
import subprocess
import sys

BUILD = ("import json, sys\n"
         "import pyarrow as pa\n"
         "{before}"
         "from aml_ray.run.inputs import SAMPLE_INPUT_SCHEMA\n"
         "pa.Table.from_pylist([{{'sample_id': 's', 'adds_json': '[]', 'add_meta_json': '[]', 'questions': []}}],\n"
         "                     schema=SAMPLE_INPUT_SCHEMA)\n"
         "pa.table({{'path': ['a', 'b'], 'n': [1.5, None]}})\n"
         "seen = 'pandas' in sys.modules\n"
         "frame = pa.table({{'x': [1, 2]}}).to_pandas()\n"
         "print(json.dumps([seen, type(frame).__name__, int(frame['x'].sum())]))\n")


def _run(code: str) -> list:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tables_from_python_objects_import_no_pandas_and_to_pandas_still_works():
    before = "from aml_ray.run.no_pandas import keep_pandas_out_of_pyarrow\nassert keep_pandas_out_of_pyarrow()\n"
    assert _run(BUILD.format(before=before)) == [False, "DataFrame", 3]


def test_without_it_pyarrow_imports_pandas_for_the_same_tables():
    """The control: what the first test saves (pandas installed, as Ray Data needs it)."""
    assert _run(BUILD.format(before="")) == [True, "DataFrame", 3]


def test_once_pandas_is_imported_it_does_nothing():
    code = ("import pandas, json\n"
            "from aml_ray.run.no_pandas import keep_pandas_out_of_pyarrow\n"
            "print(json.dumps([keep_pandas_out_of_pyarrow()]))\n")
    assert _run(code) == [False]
