"""The `concur` command: a subcommand writes what its rule writes, reports included, and logs its summary to
stderr (curate, eval-score and analyze are compared with their rules in tests/test_workflow.py)."""

import pandas as pd
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
