"""Bounds of the whole sandbox and the host's distrust of what comes out of it.

A 3 GiB write through /testbed meets the task's disk quota, a 5 GiB allocation spread over five
processes meets the total memory limit, no host path shows in the sandbox's mount table, and the
host refuses a results file that is a link, a FIFO or too large without opening what it points to.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from aml_ray.coding.fixtures import generate_bench
from aml_ray.coding.sandbox import SandboxConfig, SandboxJob, SubprocessSandbox
from tests.test_coding_sandbox_probes import _new_file


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return generate_bench(tmp_path_factory.mktemp("bounds-bench"), n_repos=1, seed=5)


def _hidden(bench, source: str, config: SandboxConfig):
    """Run the fix plus one hidden test file ``tests/test_bound.py``; returns (report, node ids)."""
    bench, keys = bench
    task, key = bench.tasks[0], keys[0]
    body = textwrap.dedent(source).strip("\n").splitlines()
    patch = _new_file("tests/test_bound.py", source)
    names = [line[4:].split("(")[0] for line in body if line.startswith("def test_")]
    nodes = tuple(f"tests/test_bound.py::{n}" for n in names)
    job = SandboxJob(instance_id=task.instance_id, snapshot=task.snapshot, diff=key.fix_diff,
                     test_patch=task.test_patch + patch, fail_to_pass=nodes, pass_to_pass=task.fail_to_pass)
    return SubprocessSandbox(config).run(job), nodes


def test_a_3_gib_write_meets_the_disk_quota(bench):
    report, (node,) = _hidden(bench, '''
        def test_write_3_gib():
            block = b"x" * (64 * 1024 * 1024)
            for i in range(6):  # 6 files of 512 MiB, each just under RLIMIT_FSIZE
                with open(f"/testbed/fill-{i}.bin", "wb") as fh:
                    for _ in range(8):
                        fh.write(block)
        ''', SandboxConfig(wall_clock_s=120, file_size_mb=513))
    assert report.tests[node] == "failed", report.output_tail
    assert "No space left on device" in report.output_tail and report.config["disk_mb"] == 2048
    assert report.cross_check == "agree"


def test_a_5_gib_allocation_over_five_processes_is_stopped(bench):
    report, (node,) = _hidden(bench, '''
        import os, time


        def test_allocate_5_gib():
            children = []
            for _ in range(5):
                pid = os.fork()
                if pid == 0:
                    block = bytearray(1024 ** 3)  # 1 GiB, every page touched
                    time.sleep(60)
                    os._exit(0)
                children.append(pid)
            assert all(os.waitpid(pid, 0)[1] == 0 for pid in children)
        ''', SandboxConfig(wall_clock_s=600, memory_mb=4096))  # a loaded machine starts the sandbox slowly
    # killed: left to sleep out its minute, every child would exit 0 and the test pass
    assert report.status == "memory_limit", (report.status, report.output_tail)
    assert "above memory_mb=4,096" in report.detail
    assert report.tests[node] == "error" and report.returncode == 137


def test_the_mount_table_shows_no_host_path_and_no_results_folder(bench):
    report, nodes = _hidden(bench, f'''
        import os

        HOST_TMP = {os.path.realpath("/tmp")!r}


        def test_host_path_in_mountinfo():
            assert HOST_TMP + "/aml-sandbox-" in open("/proc/self/mountinfo").read()


        def test_results_folder_writable():
            os.symlink("/proc/kmsg", "/sandbox/out/results.jsonl")
        ''', SandboxConfig(wall_clock_s=60))
    assert [report.tests[n] for n in nodes] == ["failed", "failed"], report.output_tail
    assert report.cross_check == "agree"


def test_the_results_reader_refuses_links_fifos_and_floods(tmp_path):
    from aml_ray.coding.verdict import UnsafeOutput, read_capped, unsafe_entries

    target = tmp_path / "host-file"
    target.write_bytes(b"host data")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    out.mkdir()
    (out / "to-file.jsonl").symlink_to(target)
    (out / "to-fifo.jsonl").symlink_to(fifo)
    (out / "big.jsonl").write_bytes(b"x" * 101)
    (out / "ok.jsonl").write_bytes(b"fine")
    for name in ("to-file.jsonl", "to-fifo.jsonl"):
        with pytest.raises(UnsafeOutput, match="symlink; not followed"):
            read_capped(out / name)
    with pytest.raises(UnsafeOutput, match="not a regular file"):
        read_capped(fifo)  # opened without blocking, refused by its type
    with pytest.raises(UnsafeOutput, match="more than 100 bytes"):
        read_capped(out / "big.jsonl", cap=100)
    assert read_capped(out / "ok.jsonl") == b"fine" and read_capped(out / "missing.jsonl") is None
    assert unsafe_entries(out) == ["to-fifo.jsonl", "to-file.jsonl"]
    assert Path(target).read_bytes() == b"host data"
