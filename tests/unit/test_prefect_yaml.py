"""prefect.yaml (for `prefect deploy` to a work pool) declares the deployments `rlhf serve` serves."""

from pathlib import Path

import yaml
from prefect.flows import load_flow_from_entrypoint

from flows.cli.serve import DEPLOYMENTS
from flows.pipeline import FLOW_NAME

ROOT = Path(__file__).resolve().parents[2]


def test_prefect_yaml_deploys_the_served_deployments_to_a_work_pool(monkeypatch):
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    assert project["name"] == FLOW_NAME
    deployments = {d["name"]: d for d in project["deployments"]}
    assert set(deployments) == set(DEPLOYMENTS)
    monkeypatch.chdir(ROOT)  # prefect deploy resolves entrypoints from the project directory
    for name, (params, description) in DEPLOYMENTS.items():
        d = deployments[name]
        assert d["description"] == description and d["work_pool"]["name"] == "rlhf"
        assert d["parameters"] == {"config": "tiny", **params}
        flow = load_flow_from_entrypoint(d["entrypoint"])
        assert flow.name == FLOW_NAME
        flow.validate_parameters(d["parameters"])  # raises on a parameter the flow does not take
