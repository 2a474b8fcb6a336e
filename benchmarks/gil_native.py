"""GIL pressure of a decode loop: onnxruntime's Python IOBinding vs NativeSession (C API, nogil).

Each step of a shared-KV decoder (SmolLM2-135M int4 by default: input_ids [1, 1], attention_mask
[1, total], past_key_values.%d.key/value [1, kv_heads, max_len, head] bound as both past and
present) writes the next mask column, re-binds the mask as a growing prefix of one buffer and
runs. The loops compared:

  ort-py     onnxruntime's Python API: io_binding.bind_input(mask ptr) + run_with_iobinding
  native-py  NativeSession's Python methods: bind_input(mask, shape=...) + run()
  native     one Cython call per step, the whole step (mask write, bind, run) inside `nogil`
  native-all all N steps in one nogil Cython call (the GIL is taken back once per loop)
  gen-plain  genai.Generator's per-token loop (``while not is_done(): generate_next_token();
             get_next_tokens()``, max_length = prompt + steps), every step in the caller's
             thread (GENAI_DECODE_AHEAD=0)
  gen-ahead  the same loop with decode ahead (the steps run on a native thread into a ring)
  gen-ahead@R/G  the same with a ring of R slots and a waiting caller gathering G steps
             (genai.generation.decode_ahead.RING / GATHER; gen-ahead uses the defaults)
  gen-all    generate_until_done(): all steps in one GIL-free call (the ceiling of the two above)

Each loop runs alone and beside a pure-Python thread spinning a counter. Printed: steps/s
alone, steps/s beside the spinner (and its ratio to alone), and the spinner's rate during the
loop relative to its idle rate. Rounds are interleaved; medians are reported. Each gen-* run
includes making the generator, the one-token prompt and dropping the generator.

``--stats`` prints the decode-ahead worker's counters (`AheadWorker.stats`) of the gen-ahead
runs (each variant; medians per run): where the per-token loop waits beside the spinner.
``--early-stop K`` also times a gen-ahead caller that stops K tokens before the end and drops
its generator (what the steps run ahead cost it).

Usage: PYTHONPATH=. python benchmarks/gil_native.py [--model PATH] [--steps 200] [--rounds 3]
       [--loops gen-plain,gen-ahead]
``--model``: a model.onnx, or a model folder or cached model's name (its model.onnx); default:
the reference-built SmolLM2 in ../shared when present, else genai's default model.
Needs genai._core.native_session built, Cython and a C compiler (the per-step helper that
cimports NativeSession is compiled at start into a temporary folder, removed at the end).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
from _bench_args import header, model_folder, non_negative_int, positive_float, positive_int

ROOT = Path(__file__).resolve().parents[1]

HELPER_PYX = """
# cython: language_level=3, boundscheck=False, wraparound=False
from libc.stdint cimport int64_t
from genai._core.ort_api cimport ELEM_INT64
from genai._core.native_session cimport NativeSession


def native_step(NativeSession s, Py_ssize_t mask_index, int64_t[:, ::1] mask,
                Py_ssize_t total):
    \"\"\"One decode step without the GIL: mask column total-1 = 1, bind [1, total], run.\"\"\"
    cdef int64_t shape[2]
    cdef int rc
    with nogil:
        mask[0, total - 1] = 1
        shape[0] = 1
        shape[1] = total
        rc = s.bind_input_ptr(mask_index, &mask[0, 0], shape, 2, ELEM_INT64)
        if rc == 0:
            rc = s.run_binding()
    if rc != 0:
        s.raise_last_error()


def native_steps(NativeSession s, Py_ssize_t mask_index, int64_t[:, ::1] mask,
                 Py_ssize_t first_total, Py_ssize_t n):
    \"\"\"n decode steps in one nogil block.\"\"\"
    cdef int64_t shape[2]
    cdef int rc = 0
    cdef Py_ssize_t total
    with nogil:
        for total in range(first_total, first_total + n):
            mask[0, total - 1] = 1
            shape[0] = 1
            shape[1] = total
            rc = s.bind_input_ptr(mask_index, &mask[0, 0], shape, 2, ELEM_INT64)
            if rc == 0:
                rc = s.run_binding()
            if rc != 0:
                break
    if rc != 0:
        s.raise_last_error()
"""


def build_helper(work: Path) -> object:
    """The compiled helper module, built in ``work`` (the caller removes it)."""
    (work / "gil_native_helper.pyx").write_text(textwrap.dedent(HELPER_PYX))
    (work / "setup_helper.py").write_text(
        textwrap.dedent(
            f"""
            from Cython.Build import cythonize
            from setuptools import Extension, setup
            ext = Extension("gil_native_helper", ["gil_native_helper.pyx"],
                            extra_compile_args=["-O3"])
            setup(ext_modules=cythonize([ext], include_path=[{str(ROOT)!r}], quiet=True))
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "setup_helper.py", "build_ext", "--inplace"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(f"building the helper failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    sys.path.insert(0, str(work))
    import gil_native_helper  # type: ignore[import-not-found]

    return gil_native_helper


class Spinner:
    """A pure-Python thread incrementing a counter as fast as the GIL lets it."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop:
            n += 1
            if n & 0xFFF == 0:
                self.count = n
        self.count = n

    def __enter__(self) -> Spinner:
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join()


def idle_spinner_rate(seconds: float = 1.0) -> float:
    with Spinner() as sp:
        c0, t0 = sp.count, time.perf_counter()
        time.sleep(seconds)
        c1, t1 = sp.count, time.perf_counter()
    return (c1 - c0) / (t1 - t0)


class Model:
    """Shared buffers of one decode run: mask, input_ids, KV (past == present), logits."""

    def __init__(
        self, path: str, max_len: int, kv_heads: int, head: int, layers: int, vocab: int
    ) -> None:
        self.path = path
        self.max_len = max_len
        self.layers = layers
        self.mask = np.zeros((1, max_len), np.int64)
        self.ids = np.full((1, 1), 17, np.int64)
        self.kv = [np.zeros((1, kv_heads, max_len, head), np.float32) for _ in range(2 * layers)]
        self.logits = np.zeros((1, 1, vocab), np.float32)

    def kv_names(self):
        for i in range(self.layers):
            for j, kind in enumerate(("key", "value")):
                yield (f"past_key_values.{i}.{kind}", f"present.{i}.{kind}", self.kv[2 * i + j])


def make_ort_loop(m: Model, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(m.path, so, providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    keep = []
    for past, present, buf in m.kv_names():
        v = ort.OrtValue.ortvalue_from_numpy(buf)
        keep.append(v)
        io.bind_ortvalue_input(past, v)
        io.bind_ortvalue_output(present, v)
    logits = ort.OrtValue.ortvalue_from_numpy(m.logits)
    ids = ort.OrtValue.ortvalue_from_numpy(m.ids)
    keep += [logits, ids]
    io.bind_ortvalue_output("logits", logits)
    io.bind_ortvalue_input("input_ids", ids)
    mask, ptr = m.mask, m.mask.ctypes.data

    def run(n: int) -> None:
        mask[:] = 0
        for total in range(1, n + 1):
            mask[0, total - 1] = 1
            io.bind_input("attention_mask", "cpu", 0, np.int64, [1, total], ptr)
            sess.run_with_iobinding(io)

    run.keep = (sess, io, keep)  # type: ignore[attr-defined]
    return run


def make_native(m: Model, threads: int):
    from genai._core.native_session import NativeSession

    s = NativeSession(m.path, intra_op_num_threads=threads, inter_op_num_threads=1)
    for past, present, buf in m.kv_names():
        s.bind_input(past, buf)
        s.bind_output(present, buf)
    s.bind_output("logits", m.logits)
    s.bind_input("input_ids", m.ids)
    return s


def make_native_py_loop(s, m: Model):
    mask = m.mask

    def run(n: int) -> None:
        mask[:] = 0
        for total in range(1, n + 1):
            mask[0, total - 1] = 1
            s.bind_input("attention_mask", mask, shape=(1, total))
            s.run()

    return run


def make_native_loop(s, m: Model, helper):
    mask = m.mask
    index = s.input_index("attention_mask")
    step = helper.native_step

    def run(n: int) -> None:
        mask[:] = 0
        for total in range(1, n + 1):
            step(s, index, mask, total)

    return run


def make_native_all_loop(s, m: Model, helper):
    mask = m.mask
    index = s.input_index("attention_mask")

    def run(n: int) -> None:
        mask[:] = 0
        helper.native_steps(s, index, mask, 1, n)

    return run


def make_generator_loop(
    folder: str,
    threads: int,
    ahead: bool,
    fused: bool = False,
    early_stop: int = 0,
    ring_gather: tuple[int, int] | None = None,
):
    """genai's per-token loop on ``folder`` (one prompt token, then ``n`` steps to max_length;
    EOS moved to an id this prompt does not reach, so every run makes ``n`` steps).
    ``early_stop``: max_length is that many tokens further, the loop stops after ``n``.
    ``ring_gather``: the worker's ring and gather instead of the defaults.
    ``run.stats``: the decode-ahead worker's counters of the last run (or None)."""
    import genai
    from genai.generation import decode_ahead

    config = genai.Config(folder)
    config.overlay(
        '{"model": {"eos_token_id": [49151], "decoder": {"session_options": '
        f'{{"intra_op_num_threads": {threads}, "inter_op_num_threads": 1}}}}}}}}'
    )
    model = genai.Model(config)

    def run(n: int) -> None:
        os.environ["GENAI_DECODE_AHEAD"] = "1" if ahead else "0"
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=n + 1 + early_stop)
        defaults = decode_ahead.RING, decode_ahead.GATHER
        if ring_gather is not None:
            decode_ahead.RING, decode_ahead.GATHER = ring_gather
        try:
            generator = genai.Generator(model, params)
        finally:
            decode_ahead.RING, decode_ahead.GATHER = defaults
        assert (generator._ahead is not None) == ahead
        generator.append_tokens(np.array([[1]], np.int32))
        if fused:
            made = generator.generate_until_done(n)
            if made != n:
                raise RuntimeError(f"generate_until_done made {made} of {n} steps")
            return
        made = 0
        while not generator.is_done():
            generator.generate_next_token()
            generator.get_next_tokens()
            made += 1
            if made == n:
                break
        if made != n or (not early_stop and not generator.is_done()):
            raise RuntimeError(f"the loop ended after {made} of {n} steps")
        worker = generator._ahead
        run.stats = worker.stats() if worker is not None else None  # type: ignore[attr-defined]

    run.stats = None  # type: ignore[attr-defined]
    return run


def timed(run, n: int) -> float:
    t0 = time.perf_counter()
    run(n)
    return n / (time.perf_counter() - t0)


def timed_beside_spinner(run, n: int) -> tuple[float, float]:
    """(steps/s, spinner increments/s) with the spinner running."""
    with Spinner() as sp:
        c0, t0 = sp.count, time.perf_counter()
        run(n)
        t1, c1 = time.perf_counter(), sp.count
    return n / (t1 - t0), (c1 - c0) / (t1 - t0)


def print_stats(stats: dict[tuple[str, str], list[dict]]) -> None:
    """Medians of the gen-ahead workers' counters per run (see `AheadWorker.stats`)."""
    for (name, where), runs in stats.items():
        if not runs:
            continue

        def med(key: str, runs: list[dict] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        waits = max(med("empty"), 1)
        print(
            f"{name} {where}: {med('takes'):.0f} takes, {med('empty'):.0f} found the ring "
            f"empty; waits per empty take: token {med('wait_token') / waits:.2f} ms, "
            f"wake-up {med('wake') / waits:.2f} ms, GIL {med('wait_gil') / waits:.2f} ms; "
            f"ready-to-taken {med('lag') / max(med('takes'), 1):.2f} ms/token; "
            f"caller between takes {med('between') / max(med('takes'), 1):.3f} ms "
            f"({med('long_gaps'):.0f} over 1 ms)"
        )
        steps = max(med("steps"), 1)
        print(
            f"  worker: {med('steps'):.0f} steps, {med('step') / steps:.2f} ms/step "
            f"({med('step_cpu') / steps:.2f} ms CPU), gaps between steps "
            f"{med('gaps') / steps:.3f} ms/step, full ring {med('full'):.0f} times "
            f"({med('full_wait'):.1f} ms)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model",
        default=None,
        help="a model.onnx, or a model folder / cached model name (default: ../shared's "
        "SmolLM2 when present, else genai's default model)",
    )
    ap.add_argument("--steps", type=positive_int, default=200)
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--threads", type=positive_int, default=1, help="intra_op_num_threads")
    ap.add_argument("--layers", type=positive_int, default=30)
    ap.add_argument("--kv-heads", type=positive_int, default=3)
    ap.add_argument("--head-size", type=positive_int, default=64)
    ap.add_argument("--vocab", type=positive_int, default=49152)
    ap.add_argument(
        "--loops",
        default="ort-py,native-py,native,native-all,gen-plain,gen-ahead,gen-all",
        help="comma-separated loops to run (see the module docstring)",
    )
    ap.add_argument(
        "--switch-interval",
        type=positive_float,
        default=None,
        help="sys.setswitchinterval (seconds)",
    )
    ap.add_argument(
        "--stats", action="store_true", help="print the gen-ahead worker's counters (medians)"
    )
    ap.add_argument(
        "--early-stop",
        type=non_negative_int,
        default=0,
        metavar="K",
        help="also time gen-ahead stopping K tokens before max_length (gen-early)",
    )
    args = ap.parse_args()
    header(args.threads)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if args.model is None or not Path(args.model).is_file():
        args.model = str(model_folder(args.model) / "model.onnx")
    if not Path(args.model).is_file():
        sys.exit(f"model not found: {args.model}")
    with tempfile.TemporaryDirectory(prefix="gil_native_") as work:
        run_loops(args, Path(work))


def run_loops(args: argparse.Namespace, work: Path) -> None:
    """Build the loops (the helper in ``work``), run the rounds, print the tables."""

    from genai._core import ort_api

    print(f"model {args.model}")
    print(
        f"steps {args.steps}, rounds {args.rounds}, intra_op_num_threads {args.threads}, "
        f"switch interval {sys.getswitchinterval() * 1e3:.1f} ms, "
        f"libonnxruntime {ort_api.version()} at {ort_api.library_path()}"
    )

    m = Model(args.model, args.steps + 8, args.kv_heads, args.head_size, args.layers, args.vocab)
    native = make_native(m, args.threads)
    makers = {
        "ort-py": lambda: make_ort_loop(m, args.threads),
        "native-py": lambda: make_native_py_loop(native, m),
        "native": lambda: make_native_loop(native, m, helper),
        "native-all": lambda: make_native_all_loop(native, m, helper),
        "gen-plain": lambda: make_generator_loop(folder, args.threads, False),
        "gen-ahead": lambda: make_generator_loop(folder, args.threads, True),
        "gen-all": lambda: make_generator_loop(folder, args.threads, True, fused=True),
        "gen-early": lambda: make_generator_loop(
            folder, args.threads, True, early_stop=args.early_stop
        ),
    }
    wanted = [name.strip() for name in args.loops.split(",") if name.strip()]
    if args.early_stop and "gen-early" not in wanted:
        wanted.append("gen-early")
    for name in wanted:
        if name.startswith("gen-ahead@"):
            ring, _, gather = name.partition("@")[2].partition("/")
            try:
                variant = (int(ring), int(gather))
            except ValueError:
                sys.exit(f"loop {name}: gen-ahead@RING/GATHER takes two integers")
            makers[name] = lambda v=variant: make_generator_loop(
                folder, args.threads, True, ring_gather=v
            )
    unknown = sorted(set(wanted) - set(makers))
    if unknown:
        sys.exit(f"unknown loops {unknown}; choose from {sorted(makers)}")
    folder = str(Path(args.model).parent)
    helper = build_helper(work) if {"native", "native-all"} & set(wanted) else None
    loops = {name: makers[name]() for name in wanted}
    for run in loops.values():  # warm up
        run(8)

    if "ort-py" in loops and "native" in loops:
        # Same logits from both engines on the same buffers (sanity).
        loops["ort-py"](4)
        want = m.logits.copy()
        loops["native"](4)
        diff = float(np.abs(m.logits - want).max())
        print(f"max |logits(ort-py) - logits(native)| after 4 steps: {diff:.3g}")

    alone = {k: [] for k in loops}
    beside = {k: [] for k in loops}
    spin = {k: [] for k in loops}  # spinner rate during the loop / idle rate just before
    idle = []
    kept = {k: [] for k in loops}  # per round: beside / alone (paired, same machine state)
    stats: dict[tuple[str, str], list[dict]] = {}
    names = list(loops)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotated order
            run = loops[name]
            alone[name].append(timed(run, args.steps))
            if getattr(run, "stats", None) is not None:
                stats.setdefault((name, "alone"), []).append(run.stats)
            idle.append(idle_spinner_rate(0.5))
            rate, spin_rate = timed_beside_spinner(run, args.steps)
            if getattr(run, "stats", None) is not None:
                stats.setdefault((name, "beside"), []).append(run.stats)
            beside[name].append(rate)
            kept[name].append(rate / alone[name][-1])
            spin[name].append(spin_rate / idle[-1])

    print(
        f"idle spinner: {statistics.median(idle) / 1e6:.2f} M increments/s "
        f"(min {min(idle) / 1e6:.2f}, max {max(idle) / 1e6:.2f})"
    )
    print(
        f"{'loop':<11} {'alone st/s':>10} {'beside st/s':>11} {'beside/alone':>12} "
        f"{'spinner/idle':>12}  (ratios: medians of the rounds' ratios, [min, max])"
    )
    for name in loops:
        a = statistics.median(alone[name])
        b = statistics.median(beside[name])
        k, sp = kept[name], spin[name]
        print(
            f"{name:<11} {a:>10.1f} {b:>11.1f} {statistics.median(k):>12.2f} "
            f"{statistics.median(sp):>12.2f}  [{min(k):.2f}, {max(k):.2f}] "
            f"[{min(sp):.2f}, {max(sp):.2f}]"
        )
    for name in [k for k in loops if k.startswith(("gen-ahead", "gen-plain"))]:
        if "gen-all" not in loops:
            break
        ratio = [
            (b / a) / (bc / ac)
            for a, b, ac, bc in zip(
                alone[name], beside[name], alone["gen-all"], beside["gen-all"], strict=True
            )
        ]
        print(
            f"{name} keeps / gen-all keeps (per round): {statistics.median(ratio):.2f} "
            f"[{min(ratio):.2f}, {max(ratio):.2f}]"
        )
    if args.stats:
        print_stats(stats)
    if "ort-py" not in loops:
        return
    a0 = statistics.median(alone["ort-py"])
    b0 = statistics.median(beside["ort-py"])
    for name in [k for k in ("native-py", "native", "native-all") if k in loops]:
        print(
            f"{name} vs ort-py: alone x{statistics.median(alone[name]) / a0:.2f}, "
            f"beside spinner x{statistics.median(beside[name]) / b0:.2f}"
        )


if __name__ == "__main__":
    main()
