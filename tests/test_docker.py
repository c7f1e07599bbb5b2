"""docker/: the image, the compose file and the Kubernetes manifests agree with zkbeat, the project and the demo.

Docker does not run where the suite runs, so these tests read the files, run
the example project's real settings under each deployment's environment, and
point the probes at one real replica.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from demo.cluster import BEAT_COMMAND
from tests.support.djangosupport import EXAMPLE_PROJECT, DjangoReplica, replica_env
from tests.support.helpers import wait_for
from tests.support.processes import ROOT
from tests.support.servers import RedisServer, ZooKeeperServer, free_port
from zkbeat.conf import Settings

DOCKER = ROOT / "docker"
SETTINGS_PY = EXAMPLE_PROJECT / "proj" / "settings.py"
#: Read by `manage.py createsuperuser --noinput`, not by the settings module.
DJANGO_SUPERUSER = {"DJANGO_SUPERUSER_USERNAME", "DJANGO_SUPERUSER_PASSWORD", "DJANGO_SUPERUSER_EMAIL"}


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (DOCKER / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yml").read_text())


def manifests() -> dict[str, dict]:
    docs = [doc for path in sorted((DOCKER / "k8s").glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())]
    return {doc["kind"]: doc for doc in docs if doc}


def beat_container() -> dict:
    return manifests()["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def k8s_env(container: dict) -> dict[str, str]:
    """The container's environment, with secrets and pod fields given example values."""
    return {
        item["name"]: item.get("value", f"example-{item['name'].lower()}")
        for item in container["env"]
        if "value" in item or "valueFrom" in item
    } | {"DATABASE_URL": "postgres://user:secret@db:5432/proj", "CELERY_BROKER_URL": "redis://redis:6379/0"}


def settings_under(env: dict[str, str]) -> dict:
    """The zkbeat Settings the example project's beat would read under ``env`` (a real import of its settings)."""
    code = (
        "import dataclasses, json\n"
        "from proj import celery_app\n"
        "from zkbeat.conf import read_settings\n"
        "s = read_settings(celery_app.conf, celery_app.main)\n"
        "print(json.dumps({k: v for k, v in dataclasses.asdict(s).items()}, default=str))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": os.environ.get("PATH", "/usr/bin"), **env, "PYTHONPATH": f"{EXAMPLE_PROJECT}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_image_is_multi_stage_non_root_with_dependencies_in_their_own_layer() -> None:
    """The Dockerfile builds in one stage, runs in another as a non-root user, installs dependencies before the code."""
    steps = dockerfile()
    stages = [i for i, (op, _) in enumerate(steps) if op == "FROM"]
    assert len(stages) >= 2 and all(" AS " in steps[i][1].upper() for i in stages)
    build, runtime = steps[stages[0] : stages[1]], steps[stages[-1] :]
    dependencies = next(i for i, (op, args) in enumerate(build) if op == "RUN" and "pip wheel" in args)
    code = next(i for i, (op, args) in enumerate(build) if op == "COPY" and args.split()[0] == "zkbeat")
    assert dependencies < code, "editing zkbeat must not re-download the dependencies"
    copied_before = " ".join(args for op, args in build[:dependencies] if op == "COPY")
    assert "example_project" not in copied_before and "zkbeat/__init__.py" in copied_before
    users = [args for op, args in runtime if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert not any(op == "COPY" and "--from" not in args and "example_project" not in args for op, args in runtime)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".demo", "tests"} <= set(ignored)


def test_every_beat_runs_the_command_make_demo_runs() -> None:
    """The image's default command, compose's beat service and the Deployment run exactly the demo's beat command."""
    cmd = [json.loads(args) for op, args in dockerfile() if op == "CMD"][-1]
    assert cmd == list(BEAT_COMMAND)
    assert compose()["services"]["beat"]["command"] == list(BEAT_COMMAND)
    assert beat_container()["args"] == list(BEAT_COMMAND)


def test_compose_runs_an_ensemble_three_beats_two_workers_and_the_admin() -> None:
    """compose.yml: a 3-member ZooKeeper ensemble, beat x3, worker x2, the admin on loopback, health checks."""
    services = compose()["services"]
    members = {name: s for name, s in services.items() if s.get("image", "").startswith("zookeeper:")}
    assert len(members) == 3
    assert sorted(s["environment"]["ZOO_MY_ID"] for s in members.values()) == ["1", "2", "3"]
    ensemble = {s["environment"]["ZOO_SERVERS"] for s in members.values()}
    assert len(ensemble) == 1, "every member must list the same ensemble"
    servers = ensemble.pop().split()
    assert sorted(servers) == sorted(f"server.{s['environment']['ZOO_MY_ID']}={n}:2888:3888;2181"
                                     for n, s in members.items())  # fmt: skip
    hosts = services["beat"]["environment"]["ZKBEAT_HOSTS"]
    assert sorted(hosts.split(",")) == sorted(f"{name}:2181" for name in members)
    assert services["beat"]["deploy"]["replicas"] == 3
    assert services["worker"]["deploy"]["replicas"] == 2
    assert services["worker"]["command"][:4] == ["celery", "-A", "proj", "worker"]
    assert services["admin"]["ports"] == ["127.0.0.1:8000:8000"]
    assert int(services["beat"]["stop_grace_period"].rstrip("s")) >= 10
    for name, service in services.items():
        if name != "migrate":
            assert "healthcheck" in service, f"{name} has no health check"
    for name in ("beat", "worker", "admin"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_deployments_set_only_what_the_project_reads_and_zkbeat_accepts() -> None:
    """Every variable compose and the Deployment set is read by the settings; beat's zkbeat settings come out as set."""
    settings_text = SETTINGS_PY.read_text()
    read = set(re.findall(r'os\.environ(?:\.get)?[\[(]\s*"([A-Z0-9_]+)"', settings_text))
    read |= set(re.findall(r'_env_float\("([A-Z0-9_]+)"\)', settings_text))
    environments = {
        f"compose {name}": service.get("environment", {})
        for name, service in compose()["services"].items()
        if service.get("image") == "zkbeat-example"
    }
    environments["k8s beat"] = k8s_env(beat_container())
    for where, env in environments.items():
        assert set(env) - read - DJANGO_SUPERUSER == set(), f"{where} sets variables nothing reads"

    for where in ("compose beat", "k8s beat"):
        env = environments[where]
        found = settings_under(env)
        assert found["hosts"] == env["ZKBEAT_HOSTS"], where
        assert found["session_timeout"] == float(env["ZKBEAT_SESSION_TIMEOUT"]), where
        assert found["metrics_port"] == int(env["ZKBEAT_METRICS_PORT"]), where
        assert found["root"] == "/zkbeat/proj", where
    assert settings_under(environments["k8s beat"])["identity"] == "example-zkbeat_identity"


def test_the_example_settings_show_every_zkbeat_setting() -> None:
    """example_project's settings name every zkbeat_* setting (as CELERY_ZKBEAT_*), each with a comment above it."""
    lines = SETTINGS_PY.read_text().splitlines()
    for field in dataclasses.fields(Settings):
        name = f"CELERY_ZKBEAT_{field.name.upper()}"
        at = next((i for i, line in enumerate(lines) if line.startswith(f"{name} =")), None)
        assert at is not None, f"{name} is missing from {SETTINGS_PY.relative_to(ROOT)}"
        assert lines[at - 1].startswith("#"), f"{name} has no comment"


def test_the_deployment_gives_sigterm_time_and_probes_the_metrics_port() -> None:
    """Deployment of 3 with time for the SIGTERM handover, probes on ZKBEAT_METRICS_PORT, and a PDB over its pods."""
    found = manifests()
    spec = found["Deployment"]["spec"]
    pod = spec["template"]
    assert spec["replicas"] == 3
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 10
    container = beat_container()
    port = next(p for p in container["ports"] if p["name"] == "metrics")
    assert str(port["containerPort"]) == k8s_env(container)["ZKBEAT_METRICS_PORT"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"]["port"] == "metrics"
    assert container["livenessProbe"]["httpGet"]["path"] != "/healthz", "a ZooKeeper outage must not restart beats"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    pdb = found["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pdb["maxUnavailable"] < spec["replicas"]
    assert "terminationGracePeriodSeconds" in (DOCKER / "k8s" / "README.md").read_text()


@pytest.mark.processes
def test_the_probes_answer_on_a_real_replica(
    beat_db: str, zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path
) -> None:
    """A real replica answers the Deployment's probe paths, and compose's health check command exits 0."""
    port = free_port()
    env = replica_env(database_url=beat_db, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root,
                      record_key=f"zkbeat-test:{zk_root}") | {"ZKBEAT_METRICS_PORT": str(port)}  # fmt: skip
    replica = DjangoReplica("probe", env, tmp_path).start()
    try:
        wait_for(replica.is_leader_by_log, timeout=40, message=replica.log)
        container = beat_container()
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            path = container[probe]["httpGet"]["path"]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:  # noqa: S310
                assert answer.status == 200, probe
        check = compose()["services"]["beat"]["healthcheck"]["test"]
        assert check[0] == "CMD"
        result = subprocess.run(
            [sys.executable, "-m", "zkbeat.ops.cli", *check[2:]] if check[1] == "zkbeat" else check[1:],
            cwd=EXAMPLE_PROJECT,
            env={**os.environ, **env, "PYTHONPATH": f"{EXAMPLE_PROJECT}{os.pathsep}{ROOT}"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        replica.stop()
