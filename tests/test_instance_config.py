"""The Dagster instance config BRIDGE writes: sections it lacks are added, sections an earlier
BRIDGE wrote are brought up to date, and a section the user wrote is kept."""

import yaml

from bridge_assets.orchestration import runs


def test_a_new_home_gets_the_whole_config_and_its_launcher_imports(tmp_path):
    config = yaml.safe_load(runs.ensure_instance_config(tmp_path).read_text())
    assert config == runs.INSTANCE_CONFIG
    launcher = config["run_launcher"]
    module = __import__(launcher["module"], fromlist=[launcher["class"]])
    assert getattr(module, launcher["class"]).__name__ == "BridgeRunLauncher"


def test_the_launcher_an_earlier_bridge_wrote_moves_with_the_module_and_a_users_own_is_kept(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "dagster.yaml").write_text(yaml.safe_dump({
        "run_launcher": {"module": "bridge_assets.run_launcher", "class": "BridgeRunLauncher"},
        "telemetry": {"enabled": False}}))
    config = yaml.safe_load(runs.ensure_instance_config(old).read_text())
    assert config["run_launcher"] == runs.INSTANCE_CONFIG["run_launcher"]
    assert config["run_coordinator"] == runs.INSTANCE_CONFIG["run_coordinator"]  # added, as before

    own = tmp_path / "own"
    own.mkdir()
    theirs = {"module": "my_company.launchers", "class": "K8sLauncher"}
    (own / "dagster.yaml").write_text(yaml.safe_dump({"run_launcher": theirs}))
    assert yaml.safe_load(runs.ensure_instance_config(own).read_text())["run_launcher"] == theirs
