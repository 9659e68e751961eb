"""Run the cupy backend's CUDA kernels (the norms' and binary_backward's) on the CPU: the .cuh sources compiled by g++ against the CUDA
stand-in in tests/cuda_host/ (fibers for threads, real barriers and warp shuffles), loaded with
ctypes, launched through `_norm_plan.run` by `HostCudaDevice`.

One shared library per (op, dtype) holds every instantiation the planner can launch for it
(`_norm_plan.all_kernel_exprs`, plus any a test asks for), each behind an `extern "C"`
wrapper that takes its arguments the way cuLaunchKernel does (an array of pointers to the argument
values) and the launch's dynamic shared memory.  A cooperative launch (nb_rows3 finishing its own
column sums after a grid-wide barrier) runs as two launches of the same kernel, split at the
barrier: the rows phase, then the column-sum phase (NBParams.flags' phase bits).  Libraries are cached in
the temp folder under a hash of their sources.  Needs g++ with C++20 and _Float16 (GCC >= 12).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from backends.cupy import nvrtc as _nvrtc
from backends.cupy import _norm_plan as plan

HERE = Path(__file__).resolve().parent / "cuda_host"
BB = "binary_backward"
CXX = shutil.which("g++")
FLAGS = ["-std=c++20", "-O1", "-shared", "-fPIC", "-Wno-unknown-pragmas", "-Wno-attributes"]


def available() -> str | None:
    """None if kernels can be built here, else why not."""
    if CXX is None:
        return "g++ not found"
    probe = "int main() { _Float16 h = (_Float16)1.5f; return (int)(float)h - 1; }"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text(probe)
        proc = subprocess.run([CXX, "-std=c++20", str(src), "-o", str(Path(tmp) / "probe")], capture_output=True)
        if proc.returncode:
            return "g++ lacks C++20 or _Float16 (GCC >= 12 needed)"
    return None


def _types(expr: str) -> tuple[str, str]:
    """(T, A) of a kernel name expression."""
    name, targs = expr.split("<", 1)
    args = [a.strip() for a in targs.rstrip(">").split(",")]
    t = args[1] if name in ("nb_rows", "nb_rows2", "nb_rows3", "nb_chunked") else args[0]
    return t, f"{'bb' if name.startswith('bb_') else 'nb'}_acc_t<{t}>"


def _bb_signature(name: str, t: str, a: str) -> list[str]:
    """Parameter types of a binary_backward kernel (backends/cuda/binary_backward.cuh)."""
    ops = [f"const {t}*"] * 3
    if name == "bb_fast":
        return ops + [f"{t}*", f"{t}*", "long long", "int"]
    if name == "bb_finalize":
        return [f"const {a}*", "long long", "long long", f"{t}*"]
    if name == "bb_opt2":
        return ["BBCollapsed", *ops, f"{t}*", f"{t}*", f"{a}*", f"{a}*"]
    if name == "bb_ew":
        return ["BBParams", *ops, f"{t}*", f"{t}*"]
    if name == "bb_naive":
        return ["BBParams", *ops, f"{a}*", f"{a}*"]
    if name in ("bb_lr_stream", "bb_cols", "bb_rows", "bb_both"):
        return ["BBParams", *ops, f"{t}*", f"{a}*", f"{t}*"]
    return ["BBParams", *ops, f"{t}*", f"{a}*", f"{t}*", f"{a}*"]  # bb_lk, bb_lr_batched


def _signature(expr: str) -> list[str]:
    t, a = _types(expr)
    name = expr.split("<")[0]
    if name.startswith("bb_"):
        return _bb_signature(name, t, a)
    main = ["NBParams", f"const {t}*", f"const {t}*", f"const {t}*", f"const {a}*", f"const {a}*", f"{t}*", f"{a}*"]
    if name in ("nb_rows", "nb_rows2"):
        return main + [f"{t}*", f"{t}*"]
    if name == "nb_rows3":
        return main + [f"{t}*", f"{t}*", "unsigned int*"]
    if name == "nb_colsum":
        return [f"const {a}*", "long long", "long long", "long long", f"{t}*", "long long", f"{t}*", "long long"]
    return main  # nb_chunked, ln_v*


SET_SCHEDULE = 'extern "C" void set_schedule(int s) { cuhost::schedule = s; }\n'
# The stand-in's shared-memory bank counts (cuda_host_runtime.h, BankStats), read and reset.
BANK_STATS = """extern "C" int bank_stats(long long* out, char* first, int len) {
  const cuhost::BankStats& b = cuhost::S.banks;
  const long long v[6] = {b.ld_instr, b.ld_phases, b.ld_extra, b.cp_rounds, b.cp_phases, b.cp_extra};
  for (int i = 0; i < 6; ++i) out[i] = v[i];
  std::snprintf(first, len, "%s", b.first.c_str());
  cuhost::S.banks = cuhost::BankStats();
  return 0;
}
"""
BANK_FIELDS = ("ld_instr", "ld_phases", "ld_extra", "cp_rounds", "cp_phases", "cp_extra")
SCHEDULES = 3  # cuda_host_runtime.h: round robin, warp-serial, warp-serial from the last warp


def _wrappers(exprs: list[str], signature=None) -> str:
    out = [SET_SCHEDULE, BANK_STATS]
    for i, expr in enumerate(exprs):
        sig = (signature or _signature)(expr)
        unpack = "\n".join(f"  {ty} a{k} = *reinterpret_cast<{ty}*>(args[{k}]);" for k, ty in enumerate(sig))
        call = ", ".join(f"a{k}" for k in range(len(sig)))
        out.append(f"""// {expr}
extern "C" int launch_{i}(unsigned gx, unsigned gy, unsigned block, unsigned smem, void** args, char* err,
                          int errlen) {{
{unpack}
  return cuhost::launch(dim3{{gx, gy, 1}}, dim3{{block, 1, 1}}, [&] {{ {expr}({call}); }}, err, errlen, smem);
}}""")
    return "\n".join(out) + "\n"


def build(tag: str, source: str, flags=()) -> ctypes.CDLL:
    """`source` (C++ that includes cuda_host_runtime.h first) compiled with g++ into a shared library,
    cached in the temp folder under a hash of the source, the flags and every stand-in and
    backends/cuda header."""
    deps = [HERE / n for n in sorted(os.listdir(HERE))] + sorted(_nvrtc.CUDA_DIR.glob("*.cuh")) + \
        sorted(_nvrtc.CUDA_DIR.glob("*.h"))
    flags = FLAGS + list(flags)
    key = hashlib.sha256((source + " ".join(flags)).encode() + b"".join(p.read_bytes() for p in deps))
    folder = Path(tempfile.gettempdir()) / "gradoracle-cuda-host"
    folder.mkdir(exist_ok=True)
    lib = folder / f"{tag}-{key.hexdigest()[:16]}.so"
    if not lib.exists():
        src = lib.with_suffix(".cpp")
        src.write_text(source)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run([CXX, *flags, f"-I{HERE}", str(src), "-o", str(tmp)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"g++ failed for {tag}:\n{proc.stderr[-6000:]}")
        tmp.replace(lib)
    return ctypes.CDLL(str(lib))


_SCALARS = {"long long": ctypes.c_int64, "int": ctypes.c_int32, "unsigned": ctypes.c_uint32,
            "unsigned int": ctypes.c_uint32, "float": ctypes.c_float, "double": ctypes.c_double}


class Kernels:
    """Kernels of a CUDA source run on the CPU stand-in, for any op: `kernels` maps each name
    expression (e.g. 'mm_naive<float>') to its parameter types as C++ spells them.  `launch`
    takes Python values in that order: numpy arrays (or None) for pointers, ints / floats for
    the scalar types above, numpy arrays / bytes holding a by-value struct's bytes for any other
    type.  Launches cycle through the stand-in's thread schedules (`SCHEDULES`)."""

    def __init__(self, tag: str, source: str, kernels: dict[str, list[str]], defines=()):
        self.exprs = list(kernels)
        self.sigs = dict(kernels)
        text = f'#include "cuda_host_runtime.h"\n{source}\n' + _wrappers(self.exprs, self.sigs.__getitem__)
        self.lib = build(tag, text, defines)
        self.lib.set_schedule.argtypes = [ctypes.c_int]
        self.fns = {}
        for i, expr in enumerate(self.exprs):
            fn = getattr(self.lib, f"launch_{i}")
            fn.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p),
                           ctypes.c_char_p, ctypes.c_int]
            fn.restype = ctypes.c_int
            self.fns[expr] = fn
        self.launches = 0

    def launch(self, expr: str, grid, block: int, args, smem: int = 0, schedule: int | None = None) -> None:
        """Runs one launch; raises AssertionError with the stand-in's report on a fault."""
        sig = self.sigs[expr]
        if len(args) != len(sig):
            raise TypeError(f"{expr} takes {len(sig)} arguments, got {len(args)}")
        keep, argv = [], (ctypes.c_void_p * len(args))()
        for k, (ty, a) in enumerate(zip(sig, args)):
            ty = ty.replace("const ", "").strip()
            if ty.endswith("*"):
                box = ctypes.c_void_p(None if a is None else data_address(a))
            elif ty in _SCALARS:
                box = _SCALARS[ty](a)
            else:  # a struct by value: its bytes
                box = ctypes.create_string_buffer(bytes(a) if not isinstance(a, np.ndarray) else a.tobytes())
            keep.append(box)
            argv[k] = ctypes.addressof(box)
        gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
        err = ctypes.create_string_buffer(4096)
        self.lib.set_schedule(self.launches % SCHEDULES if schedule is None else schedule)
        self.launches += 1
        if self.fns[expr](int(gx), int(gy), int(block), int(smem), argv, err, len(err)):
            raise AssertionError(f"{expr} grid ({gx}, {gy}) block {block}: {err.value.decode()}")

    def bank_stats(self) -> dict:
        """The shared-memory bank counts of the launches since the last call (then reset): BANK_FIELDS
        (ldmatrix instructions, 8-row phases, excess wavefronts; cp.async warp rounds, 8-lane phases,
        excess wavefronts) and `first`, the first conflicting access described ('' if none)."""
        out, first = (ctypes.c_longlong * len(BANK_FIELDS))(), ctypes.create_string_buffer(1024)
        self.lib.bank_stats(out, first, len(first))
        return {**dict(zip(BANK_FIELDS, out)), "first": first.value.decode()}


class Library:
    """The compiled kernels of one (op, dtype)."""

    def __init__(self, op: str, dt: str, extra=(), defines=()):
        if op == BB:
            from backends.cupy import binary_backward as bb

            exprs, src = bb.all_kernel_exprs(dt), bb.SOURCE
        else:
            exprs, src = plan.all_kernel_exprs(op, dt), plan.SOURCES[op]
        self.exprs = sorted(set(exprs) | set(extra))
        source = f'#include "cuda_host_runtime.h"\n#include "{_nvrtc.CUDA_DIR / src}"\n' + \
            _wrappers(self.exprs)
        self.lib = build(f"{op}-{dt}", source, defines)  # -D overrides of the source's tuning macros
        self.lib.set_schedule.argtypes = [ctypes.c_int]
        self.fns = {}
        for i, expr in enumerate(self.exprs):
            fn = getattr(self.lib, f"launch_{i}")
            fn.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p),
                           ctypes.c_char_p, ctypes.c_int]
            fn.restype = ctypes.c_int
            self.fns[expr] = fn


_LIBS: dict = {}
EXTRA_EXPRS: dict = {}  # (op, dtype) -> name expressions beyond the defaults', added before the library is built


def library(op: str, dt: str, defines=()) -> Library:
    key = (op, dt, tuple(defines))
    if key not in _LIBS:
        _LIBS[key] = Library(op, dt, EXTRA_EXPRS.get((op, dt), ()), defines)
    return _LIBS[key]


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def data_address(a: np.ndarray) -> int:
    """The address of a's first element, for any dtype (bfloat16 arrays have no array interface)."""
    return a.ctypes.data


class HostCudaDevice:
    """`_norm_plan.run`'s device, on the CPU: numpy buffers, kernels from `library`.  Launches take
    the stand-in's thread schedules in turn, so repeated calls of a deterministic kernel must agree
    bitwise across schedules, and a shared-memory race shows up as a wrong or differing result."""

    def __init__(self):
        self.launches: list[str] = []

    def launch(self, source: str, expr: str, grid, block: int, args, smem: int = 0, coop: bool = False) -> None:
        if coop:  # split at the grid-wide barrier: every block's rows, then every block's column sums
            words = args[0]["words"][0]
            flags = int(words[plan.FLAGS_WORD])
            assert flags & plan.PHASE_ROWS and flags & plan.PHASE_COLS, flags
            for drop in (plan.PHASE_COLS, plan.PHASE_ROWS):
                one = plan.params_struct(list(words))
                one["words"][0][plan.FLAGS_WORD] = flags & ~drop
                self.launch(source, expr, grid, block, (one,) + tuple(args[1:]), smem)
            return
        op = plan.LN if source == plan.SOURCES[plan.LN] else plan.RMS
        t = _types(expr)[0]
        dt = next(k for k, v in plan.CUDA_TYPE.items() if v == t)
        fn = library(op, dt).fns[expr]
        gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
        keep, argv = [], (ctypes.c_void_p * len(args))()
        for k, a in enumerate(args):
            if isinstance(a, np.ndarray) and a.dtype == plan.PARAMS_DTYPE:
                argv[k] = address(a)  # the struct's bytes
                continue
            if isinstance(a, np.uint64):
                box = ctypes.c_void_p(int(a))  # a null pointer
            elif isinstance(a, np.int64):
                box = ctypes.c_int64(int(a))
            elif isinstance(a, np.ndarray):
                box = ctypes.c_void_p(address(a))
            else:
                raise TypeError(f"argument {k} of {expr}: {type(a).__name__}")
            keep.append(box)
            argv[k] = ctypes.addressof(box)
        err = ctypes.create_string_buffer(4096)
        lib = library(op, dt)
        lib.lib.set_schedule(len(self.launches) % SCHEDULES)
        self.launches.append(expr)
        if fn(gx, gy, block, smem, argv, err, len(err)):
            raise AssertionError(f"{expr} grid ({gx}, {gy}) block {block}: {err.value.decode()}")

    def workspace(self, entry, n: int, dtype):
        buf = entry.workspace.get("host")
        if buf is None:
            buf = entry.workspace["host"] = np.full(n, np.nan, dtype=dtype)  # read before written: NaN
        return buf

    def barrier(self, entry):
        return np.zeros(2, dtype=np.uint32)  # never touched: cooperative launches are split

    def zeros(self, n: int, dtype):
        return np.zeros(n, dtype=dtype)

    def fill_zero(self, x) -> None:
        x[...] = 0


class HostBinaryDevice:
    """The cupy binary_backward host code's device (`run_opt`, `run_opt2`, `run_naive`,
    `run_entry` in backends/cupy/binary_backward.py), on the CPU: numpy buffers, the .cuh's
    kernels from `library`.  Partial-row buffers start as NaN, so a row read before it is written
    shows; launches take the stand-in's thread schedules in turn."""

    def __init__(self, num_sms: int = 3, blocks_per_sm: int | None = None, defines=()):
        self.sms, self.bps, self.defines = num_sms, blocks_per_sm, tuple(defines)
        self.launches: list[tuple[str, int]] = []

    def num_sms(self) -> int:
        return self.sms

    def blocks_per_sm(self, expr: str) -> int | None:
        return self.bps

    def ptr(self, x) -> int:
        return data_address(x)

    def empty(self, n: int, dtype):
        return np.full(n, np.nan, dtype=dtype)

    def zeros(self, n: int, dtype):
        return np.zeros(n, dtype=dtype)

    def fill_zero(self, x) -> None:
        x[...] = 0

    def launch(self, expr: str, grid: int, args) -> None:
        t = _types(expr)[0]
        from backends.cupy.common import CUDA_TYPE

        dt = next(k for k, v in CUDA_TYPE.items() if v == t)
        lib = library(BB, dt, self.defines)
        fn = lib.fns[expr]
        keep, argv = [], (ctypes.c_void_p * len(args))()
        for k, a in enumerate(args):
            if isinstance(a, np.ndarray) and a.dtype.names == ("words",):
                argv[k] = data_address(a)  # a by-value struct's bytes
                continue
            if isinstance(a, np.uint64):
                box = ctypes.c_void_p(int(a))  # a null pointer
            elif isinstance(a, np.int64):
                box = ctypes.c_int64(int(a))
            elif isinstance(a, np.int32):
                box = ctypes.c_int32(int(a))
            elif isinstance(a, np.ndarray):
                box = ctypes.c_void_p(data_address(a))
            else:
                raise TypeError(f"argument {k} of {expr}: {type(a).__name__}")
            keep.append(box)
            argv[k] = ctypes.addressof(box)
        err = ctypes.create_string_buffer(4096)
        lib.lib.set_schedule(len(self.launches) % SCHEDULES)
        self.launches.append((expr, int(grid)))
        if fn(int(grid), 1, 256, 0, argv, err, len(err)):
            raise AssertionError(f"{expr} grid {grid}: {err.value.decode()}")
