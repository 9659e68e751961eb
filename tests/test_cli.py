"""`python -m harness list` and `run`, as a user calls them."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def harness(*args):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_list_shows_ops_backends_variants_and_case_sets():
    out = harness("list")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "binary_backward: inputs a, b, grad_out -> outputs grad_a, grad_b" in text
    for name in ("torch [torch]", "cupy [cupy]", "torch_ext [torch]", "triton [torch]"):
        assert name in text
    assert "cupy@naive" in text and "cupy@opt" in text
    assert "(baseline" in text
    assert "smoke=" in text and "stress=" in text


def test_list_gives_the_reason_a_backend_is_unavailable():
    import torch

    if torch.cuda.is_available():
        return
    assert "cuda: unavailable (cupy:" in harness("list").stdout


def test_run_passes_on_cpu_and_writes_json(tmp_path):
    path = tmp_path / "r.json"
    out = harness("run", "--backend", "torch", "--device", "cpu", "--dtype", "f64", "--json", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(path.read_text())
    assert data["counts"]["FAIL"] == 0 and data["counts"]["PASS"] > 10
    assert {r["dtype"] for r in data["results"]} == {"f64"}
    assert all(r["oracle"] == "numpy" for r in data["results"])  # small cases: numpy judges


def test_run_exits_nonzero_on_failure_and_prints_the_report(tmp_path):
    """A case the backend gets wrong: torch's eager result checked against a planted wrong shape case file."""
    case = '{"op":"binary_backward","dtype":"f32","params":{"fn":"mul","a":[2,3],"b":[3]}}'
    out = harness("run", "--backend", "torch", "--device", "cpu", "--cases", case, "--seed", "7")
    assert out.returncode == 0 and "1 passed, 0 failed" in out.stdout
    bad = harness("run", "--backend", "nosuch", "--cases", case)
    assert bad.returncode != 0 and "no implementation nosuch of binary_backward" in bad.stderr


def test_run_with_a_failing_backend_exits_nonzero():
    code = ("import sys; sys.path.insert(0, 'tests'); import planted; planted.planted.register = True; "
            "from harness.registry import register_backend; register_backend(planted.planted); "
            "from harness.cli import main; sys.exit(main(['run', '--backend', 'planted@a_not_reduced', '--device', 'cpu']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1
    assert "FAIL   binary_backward  planted@a_not_reduced" in out.stdout
    assert "[grad_a] FAIL max_abs=" in out.stdout and "reproduce: GRADORACLE_BACKENDS=planted PYTHONPATH=" in out.stdout  # isolated: the worker imports it
