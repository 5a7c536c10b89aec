"""Every shipped cluster config under ``cluster/`` is validated offline, one test per file (litgpt's
tests/test_config_hub.py does the same for its YAMLs).

Cluster launcher configs (``cluster/aws.yaml``, ``cluster/gcp.yaml``) go through the steps of ``ray up`` that need
no cloud credentials, with Ray's own code at the pinned version: ``ray.autoscaler._private.util.prepare_config``
(merge the provider's ``defaults.yaml`` from the Ray wheel, merge setup commands, fill per-type worker bounds), then
``validate_config`` (``ray-schema.json`` plus Ray's cross-field checks), then
``ray.autoscaler.v2.instance_manager.config.AutoscalingConfig``, the parser the head's v2 autoscaler runs.
The provider bootstrap (``bootstrap_aws`` / ``bootstrap_gcp``: key pairs, IAM, subnets, images) calls cloud APIs
with credentials and is not run here.

``cluster/local/fake_multinode.yaml`` is checked with ``validate_config`` as written: the v1 autoscaler that
``ray start --autoscaling-config`` runs reads it without merging defaults (and the wheel ships no defaults file for
``fake_multinode``, so ``prepare_config`` cannot run on it).

KubeRay manifests are checked for structure and through Ray's RayCluster-to-autoscaler translation
(``ray.autoscaler._private.kuberay.autoscaling_config._derive_autoscaling_config_from_ray_cr``, which ends in
``validate_config``). The KubeRay CRD schema itself needs an API server and is not checked.

Then security rules over every file in ``cluster/``: no ingress from 0.0.0.0/0 to the dashboard (8265) or MLflow
(5000), no authentication switched off, no literal credentials.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_TYPE
from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
LAUNCHERS = ["aws.yaml", "gcp.yaml"]
STORAGE_SCHEME = {"aws.yaml": "s3://", "gcp.yaml": "gs://"}
# GPU model (Ray's accelerator type), count and GB per GPU of each machine type, from the providers' instance-type
# pages: every node type must declare what its machine has, or the autoscaler plans with wrong numbers, and the
# paper preset's --gpu-types must plan with the card's memory. Add a row to use another machine.
GPU_MACHINES = {
    "g6e.xlarge": ("L40S", 1, 48),
    "g6e.12xlarge": ("L40S", 4, 48),
    "p5.48xlarge": ("H100", 8, 80),
    "p4de.24xlarge": ("A100-80G", 8, 80),  # Ray detects "A100" for both sizes; the type declares the 80 GB label
    "g2-standard-8": ("L4", 1, 24),
    "g2-standard-96": ("L4", 8, 24),
    "a3-highgpu-8g": ("H100", 8, 80),
}
DASHBOARD_PORT, MLFLOW_PORT = 8265, 5000
MLFLOW_URI = f"http://127.0.0.1:{MLFLOW_PORT}"


def load(relative: str) -> Any:
    return yaml.safe_load((CLUSTER / relative).read_text())


def load_all(relative: str) -> list[Any]:
    return [doc for doc in yaml.safe_load_all((CLUSTER / relative).read_text()) if doc is not None]


def machine_type(node_config: dict[str, Any]) -> str:
    return node_config.get("InstanceType") or node_config["machineType"]


def is_spot(node_config: dict[str, Any]) -> bool:
    """AWS: InstanceMarketOptions.MarketType spot; GCP: scheduling.provisioningModel SPOT (or legacy preemptible)."""
    aws = node_config.get("InstanceMarketOptions", {}).get("MarketType") == "spot"
    scheduling = node_config.get("scheduling", {})
    return aws or scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible") is True


def commands(config: dict[str, Any], key: str) -> str:
    return "\n".join(config[key])


# ----------------------------------------------------------------------------------------------------------------
# Cluster launcher: aws.yaml, gcp.yaml


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_config_passes_ray_validation(name):
    raw = load(name)
    prepared = prepare_config(copy.deepcopy(raw))
    validate_config(prepared)
    parsed = AutoscalingConfig(copy.deepcopy(raw), skip_content_hash=True)
    assert parsed.get_head_node_type() == raw["head_node_type"]
    assert set(parsed.get_node_type_configs()) == set(raw["available_node_types"])


def _drop(key: str) -> Callable[[dict], None]:
    return lambda config: config.pop(key)


def _set(key: str, value: Any) -> Callable[[dict], None]:
    return lambda config: config.__setitem__(key, value)


def _drop_worker_resources(config: dict) -> None:
    worker = next(n for n in config["available_node_types"] if n != config["head_node_type"])
    del config["available_node_types"][worker]["resources"]


BREAKAGES = {
    "no provider": (_drop("provider"), jsonschema.ValidationError),
    "max_workers not a number": (_set("max_workers", "lots"), jsonschema.ValidationError),
    "unknown top-level key": (_set("max_wrokers", 4), jsonschema.ValidationError),
    "node type without resources": (_drop_worker_resources, jsonschema.ValidationError),
    "head type not a node type": (_set("head_node_type", "no_such_type"), ValueError),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
@pytest.mark.parametrize("name", LAUNCHERS)
def test_broken_launcher_config_fails_validation(name, breakage):
    config = prepare_config(load(name))
    mutate, error = BREAKAGES[breakage]
    mutate(config)
    with pytest.raises(error):
        validate_config(config)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_head_is_on_demand_cpu_only(name):
    config = load(name)
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"] == {"CPU": 0}, "no training work may be scheduled on the head"
    assert not is_spot(head["node_config"]), "the Tune driver and MLflow must not run on spot"
    assert machine_type(head["node_config"]) not in GPU_MACHINES


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_gpu_workers_match_their_machines_and_scale_from_zero(name):
    from par_ray.planner import GPU_MEMORY_GB

    config = load(name)
    workers = {n: t for n, t in config["available_node_types"].items() if n != config["head_node_type"]}
    assert config["idle_timeout_minutes"] > 0
    machines = {n: GPU_MACHINES[machine_type(t["node_config"])] for n, t in workers.items()}
    for type_name, node_type in workers.items():
        gpu, count, _ = machines[type_name]
        assert node_type["min_workers"] == 0, type_name
        assert node_type["max_workers"] >= 1, type_name
        assert node_type["resources"]["GPU"] == count, type_name
        assert node_type["resources"][f"accelerator_type:{gpu}"] == 1, type_name
        # --gpu-types plans a trial on this type with this much memory per GPU (par_ray.presets.fit_parallelism)
        assert GPU_MEMORY_GB[gpu] == machines[type_name][2], type_name
    # The 7B backbone needs one node with 8 GPUs of 80 GB (cluster/README.md, "Which node for which backbone").
    assert (8, 80) in {(count, gb) for _, count, gb in machines.values()}


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_spot_types_have_an_on_demand_fallback(name):
    config = load(name)
    types = config["available_node_types"]
    spot = {n: t for n, t in types.items() if is_spot(t["node_config"])}
    assert spot, "no spot worker type"
    for type_name, spot_type in spot.items():
        fallback = types[type_name.removesuffix("_spot")]
        assert type_name.endswith("_spot") and not is_spot(fallback["node_config"]), type_name
        assert fallback["resources"] == spot_type["resources"], type_name
        assert machine_type(fallback["node_config"]) == machine_type(spot_type["node_config"]), type_name
        # Autoscaler v2 breaks ties between equally good node types by priority, after availability.
        assert spot_type["priority"] > fallback.get("priority", 0), type_name


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_installs_par_ray_and_runs_mlflow_and_token_auth_on_the_head(name):
    config = prepare_config(load(name))
    head_setup = commands(config, "head_setup_commands")
    worker_setup = commands(config, "worker_setup_commands")
    head_start = commands(config, "head_start_ray_commands")
    worker_start = commands(config, "worker_start_ray_commands")

    # par_ray is installed from the synced working tree on every node.
    assert config["file_mounts"]["/home/ubuntu/par_ray"] == "."
    assert "cluster/setup_node.sh" in head_setup and "cluster/setup_node.sh" in worker_setup
    assert re.search(rf"--head '{STORAGE_SCHEME[name]}[^' ]+'", head_setup), "the head needs the storage URI"
    setup_script = (CLUSTER / "setup_node.sh").read_text()
    assert 'pip install --python "${venv}/bin/python" -e "${repo}"' in setup_script

    # Token authentication on every node, with the laptop's token.
    assert config["file_mounts"]["/home/ubuntu/.ray/auth_token"] == "~/.ray/auth_token"
    assert "export RAY_AUTH_MODE=token" in commands(config, "initialization_commands")
    assert "RAY_AUTH_MODE=token" in head_start and "RAY_AUTH_MODE=token" in worker_start

    # MLflow on the head, on loopback only, and its address exported to the jobs' processes.
    assert "cluster/mlflow_server.sh restart" in head_start
    assert f"MLFLOW_TRACKING_URI={MLFLOW_URI}" in head_start
    assert "--dashboard-host=127.0.0.1" in head_start
    mlflow_script = (CLUSTER / "mlflow_server.sh").read_text()
    assert f"--host 127.0.0.1 --port {MLFLOW_PORT}" in mlflow_script
    assert '--backend-store-uri "sqlite:///' in mlflow_script
    assert '--artifacts-destination "${PAR_RAY_STORAGE%/}/mlflow/artifacts"' in mlflow_script


@pytest.mark.parametrize("script", sorted(p.name for p in CLUSTER.glob("*.sh")))
def test_cluster_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(CLUSTER / script)], check=True)


# ----------------------------------------------------------------------------------------------------------------
# Laptop: local/fake_multinode.yaml


def test_fake_multinode_config_validates_as_written():
    config = load("local/fake_multinode.yaml")
    validate_config(config)
    assert config["provider"]["type"] == "fake_multinode"
    # FakeMultiNodeProvider registers the head under this fixed name.
    assert config["head_node_type"] == FAKE_HEAD_NODE_TYPE
    head = config["available_node_types"][FAKE_HEAD_NODE_TYPE]
    workers = [t for n, t in config["available_node_types"].items() if n != FAKE_HEAD_NODE_TYPE]
    assert head["resources"]["CPU"] <= 2
    assert workers and all(t["min_workers"] == 0 and 1 <= t["max_workers"] <= 4 for t in workers)
    assert all("CPU" in t["resources"] and "GPU" not in t["resources"] for t in workers)
    assert 0 < config["idle_timeout_minutes"] <= 1


# ----------------------------------------------------------------------------------------------------------------
# KubeRay: kuberay/raycluster.yaml, kuberay/rayjob.yaml, kuberay/storage.yaml


def _containers(pod_template: dict[str, Any]) -> list[dict[str, Any]]:
    return pod_template["spec"]["containers"]


def _gpus(container: dict[str, Any]) -> int:
    resources = container.get("resources", {})
    return max(int(resources.get(part, {}).get("nvidia.com/gpu", 0)) for part in ("limits", "requests"))


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_raycluster_manifest():
    cluster = load("kuberay/raycluster.yaml")
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    spec = cluster["spec"]
    assert spec["rayVersion"] == ray.__version__
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["authOptions"]["mode"] == "token"

    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert all(_gpus(c) == 0 for c in _containers(head["template"])), "no GPU on the head"
    ray_head, *sidecars = _containers(head["template"])  # KubeRay's Ray container is the first one
    env = _env(ray_head)
    assert env["MLFLOW_TRACKING_URI"] == MLFLOW_URI
    assert env["PAR_RAY_STORAGE"].startswith(("gs://", "s3://"))
    assert MLFLOW_PORT not in {p["containerPort"] for p in ray_head.get("ports", [])}, "MLflow stays pod-private"
    mlflow = next(c for c in sidecars if c["name"] == "mlflow")
    assert mlflow["command"][-2:] == ["/home/ray/par_ray/cluster/mlflow_server.sh", "run"]
    assert _env(mlflow)["PAR_RAY_STORAGE"] == env["PAR_RAY_STORAGE"]

    groups = spec["workerGroupSpecs"]
    assert all(g["minReplicas"] == 0 and g.get("replicas", 0) == 0 for g in groups)
    assert all(_gpus(_containers(g["template"])[0]) >= 1 for g in groups)
    assert any(_gpus(_containers(g["template"])[0]) == 8 for g in groups)


def test_raycluster_translates_to_a_valid_autoscaling_config():
    cluster = copy.deepcopy(load("kuberay/raycluster.yaml"))
    cluster["metadata"]["namespace"] = "default"  # set by `kubectl apply -n`; the translation reads it
    derived = _derive_autoscaling_config_from_ray_cr(cluster)
    node_types = AutoscalingConfig(derived, skip_content_hash=True).get_node_type_configs()
    head = node_types.pop("headgroup")
    assert head.resources["CPU"] == 0 and "GPU" not in head.resources
    for name, node_type in node_types.items():
        accelerators = [r for r in node_type.resources if r.startswith("accelerator_type:")]
        assert node_type.min_worker_nodes == 0 and node_type.resources["GPU"] >= 1, name
        assert len(accelerators) == 1, f"{name} must declare its accelerator to scale up from zero"


def test_rayjob_runs_the_backbone_sweep_on_the_same_cluster_spec():
    job = load("kuberay/rayjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert "sweeps/backbone_scaling.py --preset paper" in spec["entrypoint"]
    assert re.search(r"--storage '(gs|s3)://[^' ]+'", spec["entrypoint"])
    assert f"--mlflow-uri {MLFLOW_URI}" in spec["entrypoint"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["rayClusterSpec"] == load("kuberay/raycluster.yaml")["spec"], "rayjob.yaml drifted from raycluster"


def test_kuberay_storage_provides_what_the_pods_reference():
    provided = {(doc["kind"], doc["metadata"]["name"]) for doc in load_all("kuberay/storage.yaml")}
    spec = load("kuberay/raycluster.yaml")["spec"]
    templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    for template in templates:
        assert ("ServiceAccount", template["spec"]["serviceAccountName"]) in provided
    claims = {v["persistentVolumeClaim"]["claimName"] for v in spec["headGroupSpec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims and all(("PersistentVolumeClaim", c) in provided for c in claims)


def test_image_is_built_on_the_pinned_ray():
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{ray.__version__}-py311-gpu" in dockerfile
    assert "pip install --no-cache-dir -e ." in dockerfile


# ----------------------------------------------------------------------------------------------------------------
# Security over every file in cluster/

CREDENTIAL_PATTERNS = {
    "AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "AWS secret key assignment": re.compile(r"aws_secret_access_key\s*[=:]", re.I),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "GCP service-account key": re.compile(r'"private_key(_id)?"\s*:'),
    "Google API key": re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"),
}
AUTH_OFF_PATTERNS = {
    "RAY_AUTH_MODE disabled": re.compile(r"RAY_AUTH_MODE\W{0,4}disabled", re.I),
    "MLflow security middleware disabled": re.compile(r"--disable-security-middleware"),
}
WILDCARD_BIND = re.compile(r"--(dashboard-host|host)[= ]0\.0\.0\.0\b")


def _walk(node: Any) -> Iterator[Any]:
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    for child in children:
        yield from _walk(child)


def _covers(rule: dict[str, Any], port: int) -> bool:
    low, high = rule.get("FromPort", -1), rule.get("ToPort", -1)
    return low == -1 or low <= port <= high


def _opens_to_world(rule: dict[str, Any]) -> bool:
    ranges = [r.get("CidrIp") for r in rule.get("IpRanges", [])] + rule.get("sourceRanges", [])
    ranges += [r.get("CidrIpv6") for r in rule.get("Ipv6Ranges", [])]
    return any(r in ("0.0.0.0/0", "::/0") for r in ranges)


def security_findings(text: str, docs: list[Any]) -> list[str]:
    """Problems in one file: its raw text and, for YAML, its parsed documents."""
    findings = [name for name, p in {**CREDENTIAL_PATTERNS, **AUTH_OFF_PATTERNS}.items() if p.search(text)]
    findings += [f"binds {m.group(0)}" for m in WILDCARD_BIND.finditer(text)]
    for doc in docs:
        for node in _walk(doc):
            if not isinstance(node, dict):
                continue
            if _opens_to_world(node) and any(_covers(node, p) for p in (DASHBOARD_PORT, MLFLOW_PORT)):
                findings.append(f"world-open ingress rule {node}")
            if node.get("name") == "RAY_AUTH_MODE" and node.get("value") != "token":
                findings.append(f"RAY_AUTH_MODE={node.get('value')}")
            if "authOptions" in node and node["authOptions"].get("mode") != "token":
                findings.append(f"authOptions {node['authOptions']}")
            if node.get("serviceType") not in (None, "ClusterIP") or node.get("enableIngress") is True:
                findings.append(f"head service exposed: {node.get('serviceType')}, ingress {node.get('enableIngress')}")
            if node.get("kind") == "Ingress" or (node.get("kind") == "Service" and node.get("spec", {}).get(
                    "type") in ("LoadBalancer", "NodePort")):
                findings.append(f"exposes the cluster: {node['kind']}")
    return findings


CLUSTER_FILES = sorted(str(p.relative_to(CLUSTER)) for p in CLUSTER.rglob("*") if p.is_file())


@pytest.mark.parametrize("relative", CLUSTER_FILES)
def test_cluster_file_is_secure(relative):
    text = (CLUSTER / relative).read_text()
    docs = load_all(relative) if relative.endswith((".yaml", ".yml")) else []
    assert security_findings(text, docs) == []


PLANTED = {
    "open dashboard": ("", [{"provider": {"security_group": {"IpPermissions": [
        {"FromPort": 8265, "ToPort": 8265, "IpProtocol": "tcp", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]}}}]),
    "open all ports": ("", [{"IpPermissions": [{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]}]),
    "gcp firewall": ("", [{"sourceRanges": ["0.0.0.0/0"], "FromPort": 5000, "ToPort": 5000}]),
    "auth disabled in a command": ("export RAY_AUTH_MODE=disabled; ray start --head", []),
    "auth disabled in k8s env": ("", [{"env": [{"name": "RAY_AUTH_MODE", "value": "disabled"}]}]),
    "kuberay auth off": ("", [{"spec": {"authOptions": {"mode": "disabled"}}}]),
    "dashboard on all interfaces": ("ray start --head --dashboard-host=0.0.0.0", []),
    "mlflow on all interfaces": ("mlflow server --host 0.0.0.0 --port 5000", []),
    "load balancer": ("", [{"headGroupSpec": {"serviceType": "LoadBalancer"}}]),
    "aws key": ("key: " + "AKIA" + "Q" * 16, []),
    "private key": ("-----BEGIN " + "OPENSSH PRIVATE KEY-----", []),
}


@pytest.mark.parametrize("case", PLANTED)
def test_security_check_catches_planted_problems(case):
    text, docs = PLANTED[case]
    assert security_findings(text, docs), f"missed: {case}"


def test_every_placeholder_is_listed_in_the_readme():
    placeholder = re.compile(r"<your-[a-z0-9-]+>")
    readme = (CLUSTER / "README.md").read_text()
    used = {m for f in CLUSTER_FILES if f != "README.md" for m in placeholder.findall((CLUSTER / f).read_text())}
    listed = set(re.findall(r"^\| `(<your-[a-z0-9-]+>)`", readme, re.M))
    listed |= {p for row in re.findall(r"^\| (`<your-.*?) \|", readme, re.M) for p in placeholder.findall(row)}
    assert used <= listed, f"not in cluster/README.md's placeholder table: {sorted(used - listed)}"


def test_readme_node_types_exist():
    readme = (CLUSTER / "README.md").read_text()
    named = set(re.findall(r"`(gpu_[a-z0-9_]+)`", readme))
    defined = set(load("aws.yaml")["available_node_types"]) | set(load("gcp.yaml")["available_node_types"])
    assert named and named <= defined, sorted(named - defined)
