"""The `concur` command: a subcommand writes what its rule writes, reports included, and logs its summary to
stderr (curate, eval-score and analyze are compared with their rules in tests/test_workflow.py)."""

import pandas as pd
import pytest
import yaml

from concur.cli import main
from concur.tasks import OUTPUTS
from conftest import FIXTURES, ROOT


def test_tasks_writes_every_report_and_logs_the_summary(tmp_path, capfd):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["results"] = str(tmp_path / "results")
    config["tasks"].update(sources=[{"kind": "folder", "path": str(FIXTURES / "tasks" / "user")}], validate_run=False)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))

    assert main(["tasks", "--config", str(path)]) == 0
    out = tmp_path / "results" / "tasks"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{name}.parquet" if name in ("train", "eval") else f"{name}.csv" for name in OUTPUTS
    )
    rejected = pd.read_csv(out / "rejected.csv").set_index("task_id")["reason"]
    assert rejected["user/no_inputs"] == "program: missing get_inputs"
    assert len(pd.read_csv(out / "unchecked.csv")) == len(pd.read_parquet(out / "train.parquet"))  # none run
    stderr = capfd.readouterr().err
    assert f"source folder {FIXTURES / 'tasks' / 'user'}: 6 programs, 2 rejected" in stderr
    assert "tasks: 6 train, 0 eval; 2 rejected, 0 duplicates, 6 not run" in stderr


def test_bad_input_is_one_line_without_a_traceback(tmp_path, capfd):
    assert main(["tasks", "--config", str(tmp_path / "missing.yaml")]) == 2
    err = capfd.readouterr().err
    assert err.startswith("concur tasks: ") and "cannot read config" in err and "Traceback" not in err


def test_validate_config_prints_what_the_workflow_runs_with(capsys):
    import json

    from concur import config

    assert main(["validate-config", str(ROOT / "config.yaml")]) == 0
    assert json.loads(capsys.readouterr().out) == config.load(ROOT / "config.yaml")


def test_compile_and_verify_run_with_the_workflows_settings_and_the_options(tmp_path, monkeypatch):
    """`concur compile` and `verify` get the settings their rules' jobs run with (concur.workflow.verifier), the
    options on top; `verify-one` keeps a build cache left unset in its own workdir."""
    import json

    from concur import config, workflow
    from concur.verify import api

    cfg = config.load(ROOT / "config.yaml")
    cfg["verify"].update(compile_workers=5, light_cuda_headers=False)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    got = {}
    monkeypatch.setattr(api, "compile_run", lambda *a, **k: got.update(compile=a[1]))
    monkeypatch.setattr(api, "run", lambda *a, **k: got.update(verify=a[2]))
    monkeypatch.setattr(api, "verify_one", lambda *a: got.update(one=a[2]) or {"status": "correct"})
    common = ["--config", str(path), "--candidates", "c.parquet", "--out", "o.parquet"]
    assert main(["compile", *common, "--mode", "kernelbench", "--timeout", "9"]) == 0
    assert main(["verify", *common, "--tasks", "t.parquet", "--device", "cpu"]) == 0
    (tmp_path / "r.py").write_text("")
    one = ["--reference", str(tmp_path / "r.py"), "--solution", str(tmp_path / "r.py")]
    assert main(["verify-one", "--config", str(path), *one]) == 0
    assert got["compile"] == workflow.verifier(cfg).replace(mode="kernelbench", timeout_s=9.0)
    assert got["verify"] == workflow.verifier(cfg).replace(device="cpu")
    assert got["one"].build_cache is None and got["one"].compile_workers == 5
    assert got["compile"].compile_workers == 5 and got["compile"].light_cuda_headers is False
    json.dumps(got["verify"].to_dict())  # plain data


def test_a_required_sandbox_without_landlock_is_one_line(tmp_path, monkeypatch, capfd):
    from verify_frames import candidates_frame

    from concur.verify import orchestrate, sandbox

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["verify"].update(sandbox="required")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    candidates_frame([("c-1", "t", "x = 1")]).to_parquet(tmp_path / "c.parquet")
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)
    monkeypatch.setattr(orchestrate, "run_builds", lambda *a, **k: pytest.fail("a build ran without Landlock"))
    args = ["--config", str(path), "--candidates", str(tmp_path / "c.parquet"), "--out", str(tmp_path / "b.parquet")]
    assert main(["compile", *args]) == 2
    assert "verify.sandbox is required but this kernel has no Landlock" in capfd.readouterr().err


def test_refine_writes_the_next_turn_of_a_shard(tmp_path, capfd):
    """`concur synthesize`, verdicts for its candidates, then `concur refine --turn 2`: the demo file's second turns
    of the trajectories asked again, with their parents."""
    tasks = tmp_path / "train.parquet"
    code = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    pd.DataFrame({"task_id": ["builtin/relu", "builtin/sigmoid"], "code": [code, code]}).to_parquet(tasks)
    config = ["--config", str(ROOT / "config.yaml")]
    first, second = tmp_path / "c1.parquet", tmp_path / "c2.parquet"
    assert main(["synthesize", *config, "--tasks", str(tasks), "--out", str(first)]) == 0
    cands = pd.read_parquet(first)
    verdicts = cands.loc[:, ["candidate_id", "task_id"]].assign(
        status="compile_error", reason="error: no", correct=False, speedup=0.0
    )
    verdicts.to_parquet(tmp_path / "v1.parquet")
    argv = ["refine", *config, "--tasks", str(tasks), "--turn", "2", "--history", str(first)]
    assert main([*argv, "--verified", str(tmp_path / "v1.parquet"), "--out", str(second)]) == 0
    refined = pd.read_parquet(second)
    assert sorted(zip(refined["task_id"], refined["sample_idx"])) == [("builtin/relu", 2), ("builtin/sigmoid", 0)]
    parents = cands.set_index(["task_id", "sample_idx"])["candidate_id"]
    assert [parents[(t, s)] for t, s in zip(refined["task_id"], refined["sample_idx"])] == list(refined["parent_id"])
    assert refined["prompt"].str.contains("error: no").all() and (tmp_path / "c2.report.csv").exists()
    assert "turn 2: 8 version(s) of turn 1 to refine" in capfd.readouterr().err
