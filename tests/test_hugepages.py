"""genai.runtime.hugepages: which memory gets collapsed into 2 MiB pages, and that the kernel
does it."""

from __future__ import annotations

import gc
import mmap
import sys
from pathlib import Path

import numpy as np
import pytest

from genai.runtime import hugepages
from genai.runtime.hugepages import HUGE_PAGE

MAPS = """\
55d0c0000000-55d0c0021000 r--p 00000000 08:01 123 /usr/bin/python3.11
55d0c0021000-55d0c0400000 rw-p 00021000 08:01 123 /usr/bin/python3.11
55d0c1000000-55d0c1800000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000200000 rw-p 00000000 00:00 0
7f0000200000-7f0000600000 rw-p 00000000 00:00 0
7f0000600000-7f0000601000 ---p 00000000 00:00 0
7f0000601000-7f0000e01000 rw-p 00000000 00:00 0
7f0001000000-7f0001400000 rw-s 00000000 00:05 77 /dev/shm/x
7f0002000000-7f0002400000 r--p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
"""


def test_anonymous_ranges_keeps_private_writable_anonymous_and_heap() -> None:
    assert hugepages.anonymous_ranges(MAPS) == [
        (0x55D0C1000000, 0x55D0C1800000),  # [heap]
        (0x7F0000000000, 0x7F0000600000),  # two touching mappings, merged
        (0x7F0000601000, 0x7F0000E01000),  # after a guard page: separate
    ]


def test_merge_chunks_joins_touching_chunks() -> None:
    h = HUGE_PAGE
    assert hugepages.merge_chunks({5 * h, 2 * h, 3 * h, 9 * h}) == [
        (2 * h, 4 * h),
        (5 * h, 6 * h),
        (9 * h, 10 * h),
    ]
    assert hugepages.merge_chunks(set()) == []


linux_thp = pytest.mark.skipif(
    hugepages._unavailable() is not None or not Path("/proc/self/smaps").exists(),
    reason=f"transparent huge pages unavailable here: {hugepages._unavailable()}",
)


def _private(size: int) -> mmap.mmap:
    """Anonymous private memory (Python's default anonymous map is shared)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _address(buffer: mmap.mmap) -> int:
    return np.frombuffer(buffer, dtype=np.uint8).ctypes.data


@linux_thp
def test_filled_chunks_are_the_wholly_resident_ones() -> None:
    size = 4 * HUGE_PAGE
    with _private(size + HUGE_PAGE) as buffer:
        base = -(-_address(buffer) // HUGE_PAGE) * HUGE_PAGE
        offset = base - _address(buffer)
        view = np.frombuffer(buffer, dtype=np.uint8)
        view[offset : offset + HUGE_PAGE] = 1  # chunk 0 filled
        view[offset + 2 * HUGE_PAGE : offset + 3 * HUGE_PAGE : 4096] = 1  # chunk 2: every page
        view[offset + 3 * HUGE_PAGE] = 1  # chunk 3: one page only
        # the range's unaligned ends are not whole chunks of it
        got = hugepages.filled_chunks([(base - 4096, base + size + 4096)])
        del view
    assert got == {base, base + 2 * HUGE_PAGE}


def _anon_huge_kb(start: int, end: int) -> int:
    """AnonHugePages (kB) of the mappings overlapping [start, end), from /proc/self/smaps."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < end and hi > start
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


def _errors_within(report: hugepages.HugePageReport, start: int, end: int) -> list[str]:
    """The report's errors about chunks inside [start, end) (other threads of the test process
    may map, fill and free memory of their own meanwhile: not the test's concern)."""
    return [e for e in report.errors if start <= int(e.split("+")[0], 16) < end]


@linux_thp
@pytest.mark.parametrize("background", [False, True])
def test_memory_mapped_in_the_block_is_collapsed(background: bool) -> None:
    size = 8 * HUGE_PAGE
    pattern = np.arange(size // 4096, dtype=np.uint8)
    with hugepages.backing_new_memory(background=background) as report:
        buffer = _private(size)
        view = np.frombuffer(buffer, dtype=np.uint8)
        view[:] = 7
        view[::4096] = pattern
    report.wait(60)
    start = _address(buffer)
    assert report.done and report.skipped is None
    assert not _errors_within(report, start, start + size)
    assert report.collapsed >= 6 * HUGE_PAGE  # the aligned whole chunks of 8 MiB
    assert _anon_huge_kb(start, start + size) >= 6 * HUGE_PAGE // 1024
    assert np.array_equal(view[::4096], pattern)
    assert np.count_nonzero(view != 7) == np.count_nonzero(pattern != 7)
    del view
    buffer.close()


@linux_thp
def test_memory_mapped_before_but_filled_in_the_block_is_collapsed() -> None:
    """Memory reused by the block (here: mapped earlier, first touched inside) counts."""
    size = 8 * HUGE_PAGE
    buffer = _private(size)
    view = np.frombuffer(buffer, dtype=np.uint8)
    start = _address(buffer)
    with hugepages.backing_new_memory(background=False) as report:
        view[:] = 5
    assert report.collapsed >= 6 * HUGE_PAGE
    assert not _errors_within(report, start, start + size)
    assert _anon_huge_kb(start, start + size) >= 6 * HUGE_PAGE // 1024
    assert np.count_nonzero(view != 5) == 0
    del view
    buffer.close()


@linux_thp
def test_chunks_only_read_are_refused_not_errors() -> None:
    """Memory only ever read maps the shared zero page: resident to ``mincore``, but the kernel
    refuses to collapse a range of it (EINVAL), which is no error (it happened to a heap chunk
    in a full test run)."""
    size = 8 * HUGE_PAGE
    with hugepages.backing_new_memory(background=False) as report:
        buffer = _private(size)
        view = np.frombuffer(buffer, dtype=np.uint8)
        read = int(view[::4096].sum())
    start = _address(buffer)
    assert read == 0 and not _errors_within(report, start, start + size)
    assert report.refused >= 6 * HUGE_PAGE  # the aligned whole chunks of 8 MiB
    assert _anon_huge_kb(start, start + size) == 0
    del view
    buffer.close()


@linux_thp
def test_memory_filled_before_the_block_is_left_alone() -> None:
    size = 8 * HUGE_PAGE
    buffer = _private(size)
    view = np.frombuffer(buffer, dtype=np.uint8)
    view[:] = 3
    start = _address(buffer)
    with hugepages.backing_new_memory(background=False):
        pass
    # The buffer's own pages stay small. (The report may count memory another thread of the
    # process filled meanwhile, e.g. a server of an earlier test shutting down: not this
    # test's concern.)
    assert _anon_huge_kb(start, start + size) == 0
    del view
    buffer.close()


def test_switched_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENAI_HUGEPAGES", "0")
    with hugepages.backing_new_memory() as report:
        pass
    assert report.done and report.collapsed == 0
    assert "GENAI_HUGEPAGES=0" in report.skipped


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux-only check")
def test_model_session_memory_is_collapsed(tmp_path: Path) -> None:
    from genai import Model
    from genai.testing.models import write_gqa_decoder

    if hugepages._unavailable() is not None:
        pytest.skip(f"transparent huge pages unavailable here: {hugepages._unavailable()}")
    folder = write_gqa_decoder(
        tmp_path, vocab_size=32000, hidden_size=256, context_length=64, name="hp"
    )
    for _ in range(3):  # later loads reuse the heap the earlier ones freed
        model = Model(folder)
        report = model.huge_pages.wait(60)
        assert report.skipped is None and not report.errors
        assert report.collapsed >= 8 * HUGE_PAGE  # of the 32 MB embedding/lm_head weights
        del model
        gc.collect()
