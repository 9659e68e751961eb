"""`python -m harness merge` (harness/merge.py): the shards of a run (`run --shard k/N`, as a
scheduler array runs them) joined into one results JSON and report, equal to the unsharded run."""
import gzip
import json

import pytest

from harness.cli import main
from harness.report import files

RUN = ["run", "--op", "reduce_sum", "--backend", "torch", "--dtype", "f32", "--device", "cpu", "--seed", "3"]


def rows_of(path) -> dict:
    raw = open(path, "rb").read()
    data = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    return {(r["op"], r["impl"], r["case"]): r["status"] for r in data["results"]}


def test_merged_shards_equal_the_unsharded_run(tmp_path, capsys):
    assert main([*RUN, "--json", str(tmp_path / "all.json")]) == 0
    for k in range(2):
        assert main([*RUN, "--shard", f"{k}/2", "--json", str(tmp_path / f"shard{k}.json")]) == 0
    capsys.readouterr()
    shards = [rows_of(tmp_path / f"shard{k}.json") for k in range(2)]
    assert shards[0] and shards[1] and not set(shards[0]) & set(shards[1])  # two real, disjoint slices
    out = tmp_path / "merged.json.gz"
    assert main(["merge", str(out), str(tmp_path / "shard0.json"), str(tmp_path / "shard1.json")]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "from 2 parts" in printed
    assert rows_of(out) == rows_of(tmp_path / "all.json")
    merged = json.loads(gzip.decompress(out.read_bytes()))
    assert merged["counts"]["PASS"] == len(merged["results"]) and merged["interrupted"] is None
    assert merged["merged_from"] == [str(tmp_path / "shard0.json"), str(tmp_path / "shard1.json")]
    assert merged["seeds"] == [3, 3] and [p["counts"]["PASS"] for p in merged["parts"]] == [len(s) for s in shards]
    report = (tmp_path / "merged.md").read_text()
    assert "| op | impl | PASS |" in report and f"| reduce_sum | torch | {len(merged['results'])} |" in report


def test_a_later_part_replaces_rows_and_interruptions_are_kept(tmp_path, capsys):
    row = {"op": "reduce_sum", "impl": "mine", "case": "c1", "device": "cpu", "status": "FAIL",
           "reason": "over tolerance", "repro": "python -m harness run --case c1"}
    first = {"device": "cpu", "seed": 1, "interrupted": "time limit", "results": [row, {**row, "case": "c2"}]}
    second = {"device": "cpu", "seed": 2, "interrupted": None, "results": [{**row, "status": "PASS"}]}
    for name, data in (("a.json", first), ("b.json", second)):
        (tmp_path / name).write_text(json.dumps(data))
    assert main(["merge", str(tmp_path / "m.json"), str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 "--report", str(tmp_path / "r" / "report.md")]) == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    assert {r["case"]: r["status"] for r in merged["results"]} == {"c1": "PASS", "c2": "FAIL"}
    assert merged["interrupted"] is None and merged["parts_interrupted"] == ["time limit", None]
    report = (tmp_path / "r" / "report.md").read_text()
    assert f"parts cut short (a later part may have resumed them): `{tmp_path / 'a.json'}` (time limit)" in report
    assert "**FAIL** reduce_sum mine `c2`: over tolerance" in report and "reproduce: `python -m harness run" in report


def test_bench_parts_merge_into_one_bench_report(tmp_path, capsys):
    from test_report import synthetic

    one, two = synthetic(), synthetic()
    two["rows"] = [{**r, "op": "layernorm_backward"} for r in two["rows"]]
    (tmp_path / "1.json").write_text(json.dumps(one))
    (tmp_path / "2.json").write_text(json.dumps(two))
    assert main(["merge", str(tmp_path / "all.json"), str(tmp_path / "1.json"), str(tmp_path / "2.json")]) == 0
    merged = files.load(tmp_path / "all.json")
    assert len(merged["rows"]) == len(one["rows"]) + len(two["rows"])
    text = (tmp_path / "all.md").read_text()
    assert "## binary_backward" in text and "## layernorm_backward" in text
    (tmp_path / "run.json").write_text(json.dumps({"results": []}))
    with pytest.raises(SystemExit, match="mix `run` and `bench`"):
        main(["merge", str(tmp_path / "x.json"), str(tmp_path / "1.json"), str(tmp_path / "run.json")])
    two["device"] = {**two["device"], "name": "Other GPU"}
    (tmp_path / "3.json").write_text(json.dumps(two))
    with pytest.raises(SystemExit, match="different devices"):
        main(["merge", str(tmp_path / "x.json"), str(tmp_path / "1.json"), str(tmp_path / "3.json")])


def test_readme_documents_scheduler_arrays_and_the_old_script_is_gone():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    assert '--shard "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT"' in readme
    assert '--shard "$JOB_COMPLETION_INDEX/8"' in readme and "python -m harness merge out/full.json" in readme
    assert not (root / "scripts" / "merge_results.py").exists()
    users = [p for p in (root / "scripts").rglob("*") if p.is_file() and p.suffix in (".sh", ".py")
             and "merge_results.py" in p.read_text(errors="replace")]
    assert not users
