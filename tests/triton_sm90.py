"""Compiling Triton jit kernels for sm_90 (H100) with no GPU, shared by the tests/test_triton_*compile*.py
modules and tests/test_triton_norms.py.

A test module lists its jobs; `run_workers(__file__, flag, groups)` (a module-scoped fixture's body)
runs the module as a script with `flag` in worker subprocesses without TRITON_INTERPRET (under
TRITON_INTERPRET=1, which the test session sets on GPU-less machines before triton is imported,
`triton.jit` makes interpreter objects that `triton.compile` cannot take; a fresh process gets real
JITFunctions), and the script side calls `worker(jobs, compile_job)`, which prints one JSON line.
A job's compile builds its signature with `signature` (the test's own specialisation) or
`launch_signature` (as triton's launcher specialises the values of a real launch), compiles it with
`compile_sm90`, and reads the result with `ptxas_report` and `pointer_offsets`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRITON_TY = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "f64": "fp64"}
ITEM = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8}
_ALIGNED = [["tt.divisibility", 16]]  # torch allocations are 16-byte aligned; so are ints marked divisible


def no_specialise(kernel) -> set[str]:
    """Names of the kernel's arguments that its @jit(do_not_specialize=...) keeps unspecialised."""
    return {kernel.arg_names[p.num] for p in kernel.params if p.do_not_specialize}


def signature(kernel, ptrs: dict, constexprs: dict, hinted=lambda i, name: False) -> tuple[dict, dict]:
    """(signature, attrs): constexprs by name, pointers `*<ptrs[name]>` marked 16-byte aligned, every
    other argument i32 (a launch passes i32 for small values: offsets must widen anyway), marked
    divisible by 16 where `hinted(index, name)`."""
    sig, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ptrs:
            sig[name] = "*" + ptrs[name]
            attrs[(i,)] = _ALIGNED
        else:
            sig[name] = "i32"
            if hinted(i, name):
                attrs[(i,)] = _ALIGNED
    return sig, attrs


def launch_signature(kernel, ptrs: dict, values: dict, constexprs: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) as triton's launcher makes them for int arguments `values`:
    ints equal to 1 become constants and ints divisible by 16 get the divisibility hint, unless the
    kernel says not to specialise them; ints past int32 are i64."""
    sig, attrs, consts = {}, {}, dict(constexprs)
    skip = no_specialise(kernel)
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        if name in ptrs:
            sig[name] = "*" + ptrs[name]
            attrs[(i,)] = _ALIGNED
            continue
        v = values[name]
        if v == 1 and name not in skip and not isinstance(v, bool):
            sig[name], consts[name] = "constexpr", 1
            continue
        sig[name] = "i32" if -2**31 <= v < 2**31 else "i64"
        if name not in skip and v % 16 == 0:
            attrs[(i,)] = _ALIGNED
    return sig, consts, attrs


def compile_sm90(kernel, sig: dict, constexprs: dict, attrs: dict, num_warps: int, **options):
    """triton.compile of one specialisation for GPUTarget("cuda", 90, 32)."""
    import triton
    from triton.backends.compiler import GPUTarget

    src = triton.compiler.ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, **options})


def ptxas_report(ptx: str, *flags: str) -> dict:
    """{"regs", "spill_stores", "spill_loads"} (bytes) that `ptxas -v` (triton's own, with `flags`)
    reports for one kernel's PTX; regs None where triton ships no ptxas or ptxas reports none."""
    import triton

    exe = triton.knobs.nvidia.ptxas.path
    if not exe or not Path(exe).exists():
        return {"regs": None, "spill_stores": None, "spill_loads": None}
    arch = re.search(r"\.target\s+(sm_\w+)", ptx).group(1)
    with tempfile.TemporaryDirectory() as d:
        Path(d, "k.ptx").write_text(ptx)
        log = subprocess.run([exe, *flags, "-v", f"--gpu-name={arch}", str(Path(d, "k.ptx")), "-o", str(Path(d, "k.o"))],
                             capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", log)
    stores = re.findall(r"(\d+) bytes spill stores", log)
    loads = re.findall(r"(\d+) bytes spill loads", log)
    return {"regs": int(regs[-1]) if regs else None, "spill_stores": sum(map(int, stores)),
            "spill_loads": sum(map(int, loads))}


def pointer_offsets(ttir: str) -> tuple[int, list[str]]:
    """(how many pointer increments, the sorted "operand: type" of those whose offset is not i64),
    from the TTIR; constants (descriptor fields, tile offsets) may be i32."""
    constants = set(re.findall(r"(%\S+) = arith\.constant ", ttir))
    addptrs = re.findall(r"tt\.addptr %\S+, (%\S+) : .*, (\S+) loc", ttir)
    return len(addptrs), sorted({f"{op}: {ty}" for op, ty in addptrs if "i64" not in ty and op not in constants})


def worker(jobs, compile_job, error=lambda msg: {"error": msg}) -> None:
    """The worker side: print {job: compile_job(job), or error("<type>: <message>")} as one JSON line."""
    sys.path.insert(0, str(ROOT))
    out = {}
    for job in jobs:
        try:
            out[job] = compile_job(job)
        except Exception as exc:  # noqa: BLE001 - reported to the test side, which asserts
            out[job] = error(f"{type(exc).__name__}: {exc}"[-3000:])
    print(json.dumps(out))


def run_workers(test_file, flag: str, groups, timeout: int) -> dict:
    """Run `test_file` as a script with `flag` and each group of jobs in its own subprocess (this
    machine has two cores: two groups), all at once, TRITON_INTERPRET unset; their results merged."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    workers = [subprocess.Popen([sys.executable, str(test_file), flag, *jobs], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for jobs in groups]
    results = {}
    for w in workers:
        stdout, stderr = w.communicate(timeout=timeout)
        assert w.returncode == 0, f"compile worker failed:\n{stderr[-4000:]}"
        results.update(json.loads(stdout.strip().splitlines()[-1]))
    return results
