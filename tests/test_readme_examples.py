"""The README's worked examples run as written: a kernel added to a backend as one new file, an
outside backend installed by entry point, a case file."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_files() -> dict[str, str]:
    """Code blocks in README.md announced by `<!-- file: PATH -->`."""
    text = (ROOT / "README.md").read_text()
    return {m[0]: m[1] for m in re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, re.S)}


def harness(*args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory):
    """pip-installs the README's outside package into a private folder (not the test venv)."""
    src = tmp_path_factory.mktemp("src")
    for name, body in readme_files().items():
        if name.startswith("my_kernels/"):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_text(body)
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src / "my_kernels")], check=True, timeout=300)
    return {"PYTHONPATH": f"{target}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_outside_backend_is_discovered_by_entry_point(installed_example):
    listed = harness("list", env_extra=installed_example)
    assert listed.returncode == 0, listed.stderr
    assert "mykernels [torch] my BinaryBackward kernels" in listed.stdout
    assert "binary_backward: mykernels@v1" in listed.stdout


def test_outside_backend_runs_and_passes(installed_example):
    run = harness("run", "--backend", "mykernels@v1", "--device", "cpu", env_extra=installed_example)
    assert run.returncode == 0, run.stdout + run.stderr
    passed = int(re.search(r"(\d+) passed, 0 failed", run.stdout)[1])
    assert passed >= 20 and "mykernels@v1" in run.stdout


def test_case_file_from_readme(tmp_path):
    path = tmp_path / "my_cases.yaml"
    path.write_text(readme_files()["my_cases.yaml"])
    run = harness("run", "--backend", "torch", "--device", "cpu", "--cases", str(path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "mul[bf16,A=16x1x4096,B=16x128x1]" in run.stdout and "div[f32,A=7x1,B=7x9,B:transposed]" in run.stdout
    assert "2 passed, 0 failed" in run.stdout


def test_the_gpu_install_line_works_with_the_index_switched_off(tmp_path):
    """README's GPU line (`pip install -e . --no-deps --no-build-isolation`) needs no package index:
    build isolation would fetch setuptools.  Built here into a scratch target with the index off."""
    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("pip install -e . --no-deps"))
    flags = [f for f in line.split("#")[0].split()[2:] if f.startswith("--")]
    assert flags == ["--no-deps", "--no-build-isolation"], line
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--target", str(tmp_path / "t"),
                          *flags, str(ROOT)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PIP_NO_INDEX": "1", "PIP_INDEX_URL": "http://127.0.0.1:9/none"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "t" / "harness" / "cli.py").exists()


def test_triton_kernel_example_is_one_new_file(tmp_path):
    """'Adding a kernel to a backend': the README's file, dropped into a copy of the tree as a new
    module of backends/triton/ (no other edit), registers with the package and passes every case it
    supports, under TRITON_INTERPRET=1: the smoke set (the broadcast cases skip with the kernel's
    reason) and every fn it has in the 16-bit dtypes and float64, strided views included."""
    name = "backends/triton/binary_backward_example.py"
    body = readme_files()[name]
    assert not (ROOT / name).exists()  # an example, not part of the tree
    tree = tmp_path / "tree"
    for package in ("harness", "oracle", "cases", "backends"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / name).write_text(body)
    more = tmp_path / "more.yaml"
    more.write_text("cases:\n" + "".join(
        f"  - {{op: binary_backward, dtype: {dt}, params: {{fn: {fn}, a: [33, 70], b: [33, 70], a_layout: transposed, "
        f"g_layout: sliced}}}}\n" for fn in ("add", "sub", "mul") for dt in ("bf16", "f16", "f64")))
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "GRADORACLE_BUILD_DIR": str(ROOT / "build" / "torch_ext")}  # no torch_ext build in the copy
    for cases, least in (("smoke", 5), (str(more), 9)):
        run = subprocess.run([sys.executable, "-m", "harness", "run", "--backend", "triton@example", "--device", "cpu",
                              "--cases", cases, "--show-skips", "-v"], cwd=tree, env=env, capture_output=True, text=True,
                             timeout=900)
        assert run.returncode == 0, run.stdout + run.stderr
        passed = int(re.search(r"(\d+) passed, 0 failed", run.stdout)[1])
        assert passed >= least and "triton@example" in run.stdout, run.stdout
        if cases == "smoke":
            assert "triton@example: a (" in run.stdout  # a broadcast case, skipped with the kernel's reason
