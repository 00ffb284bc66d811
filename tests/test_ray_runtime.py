"""Arrow tables cross Ray's object store as one IPC stream (aml_ray.ray_runtime.use_arrow_ipc_serialization);
hot-path actors tune the garbage collector (tune_actor_gc)."""

from __future__ import annotations

import pyarrow as pa

from aml_ray.evidence import QUESTION_SCHEMA, empty_question_row, to_table
from aml_ray.ray_runtime import ACTOR_GC_THRESHOLDS, _table_to_ipc, tune_actor_gc, use_arrow_ipc_serialization


def _questions(n: int) -> pa.Table:
    return to_table([empty_question_row() | {"question_id": f"q{i}", "question": "When did Caroline go? " * 4,
                                             "memories": [{"id": f"m{k}", "content": "memory " * 20, "score": 0.5}
                                                          for k in range(10)]}
                     for i in range(n)], QUESTION_SCHEMA)


def test_a_slice_is_serialized_without_the_rest_of_its_buffers():
    whole = _questions(1_000)
    part = whole.slice(500, 10)
    assert _table_to_ipc(part).size < _table_to_ipc(whole).size / 50  # ARROW-10739 stays worked around


def test_tables_round_trip_through_the_object_store(ray_session):
    import ray

    use_arrow_ipc_serialization()
    use_arrow_ipc_serialization()  # idempotent
    table = _questions(300)
    part = table.slice(100, 7)
    assert ray.get(ray.put(part)).equals(part)

    @ray.remote(num_cpus=0)
    def stage_output(n: int) -> pa.Table:
        use_arrow_ipc_serialization()
        return _questions(n).slice(2, n - 3)  # a stage actor's block, as the pipeline's stages return them

    back = ray.get(stage_output.remote(20))
    assert back.schema.equals(QUESTION_SCHEMA) and back.num_rows == 17
    assert back.column("question_id").to_pylist() == [f"q{i}" for i in range(2, 19)]
    assert back.column("memories")[0].as_py()[3] == {"id": "m3", "content": "memory " * 20, "score": 0.5,
                                                     "created_at": None, "parts": None}
    assert ray.get(ray.put(QUESTION_SCHEMA.empty_table())).num_rows == 0


def test_gc_is_tuned_in_an_actor_and_left_alone_in_the_driver(ray_session):
    import gc

    import ray

    before = gc.get_threshold(), gc.get_freeze_count()
    assert tune_actor_gc() is False  # the driver (here: the test process) keeps its own settings
    assert (gc.get_threshold(), gc.get_freeze_count()) == before

    @ray.remote(num_cpus=0)
    class Probe:
        def __init__(self):
            import sys

            self.pandas_before = "pandas" in sys.modules
            self.tuned = tune_actor_gc()
            self.pandas_after = "pandas" in sys.modules

        def state(self):
            return self.tuned, gc.get_threshold(), gc.get_freeze_count(), self.pandas_before, self.pandas_after

    probe = Probe.remote()
    tuned, thresholds, frozen, pandas_before, pandas_after = ray.get(probe.state.remote())
    ray.kill(probe)
    assert tuned is True and thresholds == ACTOR_GC_THRESHOLDS
    assert frozen > 10_000  # the start-up objects (Ray's own modules) are out of the collector's reach
    # pyarrow's pandas shim is loaded at start, not by the actor's first Arrow table
    assert (pandas_before, pandas_after) == (False, True)


def test_ray_data_map_tasks_run_without_the_memory_poll_thread(ray_session):
    # init_ray turns Ray Data's per-task memory poll off: no thread reading the process's memory beside
    # every map task (Ray's default, 1 s, starts one named after its target, poll_uss)
    import threading

    import ray.data

    assert ray.data.DataContext.get_current().memory_usage_poll_interval_s is None

    def polling(batch: dict) -> dict:
        return {"poll": [any("poll_uss" in t.name for t in threading.enumerate())] * len(batch["id"])}

    rows = ray.data.range(4, override_num_blocks=2).map_batches(polling, num_cpus=0.1).take_all()
    assert [r["poll"] for r in rows] == [False] * 4
