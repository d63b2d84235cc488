"""The worker's deployment artifacts, rendered into the reference host.

Seed 000, Changed: per environment one instance of the worker module (rendered once per
host), which holds one instance of the host's service module (no load balancer route,
rollouts capped at the desired count, a log group with retention, autoscaling behind
`autoscaling_enabled`, the running-tasks-below-desired alarm on the alarm topic), the
queue metrics, backlog scaling and alarms, and the settings' defaults; each environment's
shared inputs once (`workers.tf`); every setting passed as a variable or wired as a secret;
the `moved` blocks the update from before 0.2 writes carry the state of the long worker
files before the module (docs/decisions/0031) and `terraform plan` on it changes nothing
more than before; the staging
workflow builds, pushes and records the image by commit, production promotes that digest
and never rebuilds; with `container: true` a compose service; the image itself.

Two workers are rendered into one copy of the reference host once for the module:
`shipment-notifier` (the namespace's first, no container) and then `invoice-mailer`
(`SEND_INVOICE`, lane `billing`, `container: true`). The refusal tests use fresh copies.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import hcl2
import jinja2
import pytest
import yaml
from conftest import (
    REFERENCE_HOST,
    RELEASE_0_1_0,
    REPO,
    VENV_BIN,
    commit_all,
    copy_host,
    copy_template,
    git,
    load_extension,
    tree_state,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from churn import ALARMS, alarm_from_module, first_alarm_at  # bench/ is no package
from copier.errors import UserMessageError

patcher = load_extension("patcher")
deploy = load_extension("deploy")

TERRAFORM = "/usr/local/bin/terraform"
ENVIRONMENTS = ("staging", "production")
STAGING = ".github/workflows/deploy-staging.yml"
PRODUCTION = ".github/workflows/deploy-production.yml"
COMPOSE_FULL = "deployment/local/docker-compose.full.yml"
COMPOSE = "deployment/local/docker-compose.yml"
TERRAFORM_DIR = "deployment/terraform"
MODULE_DIR = "deployment/terraform/modules/service"
WORKER_MODULE_DIR = "deployment/terraform/modules/worker"
FIRST = {"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"}
SECOND = {
    "worker_name": "invoice-mailer",
    "work_kind": "SEND_INVOICE",
    "lane": "billing",
    "container": True,
}
WORKERS = (FIRST, SECOND)
# The second worker as the patcher reads it (a container worker, not the namespace owner).
SECOND_SPEC = patcher.Spec(
    worker_name="invoice-mailer",
    work_kind="SEND_INVOICE",
    lane="billing",
    host_root="acme",
    namespace_absent=False,
    container=True,
)
DIGEST = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/acme-x@sha256:" + "ab" * 32
# Settings whose deployed value differs from the local one, and why: the metrics listen on
# every interface of the task (Prometheus scrapes them), on the port the image exposes, and
# the release is the image's digest.
DEPLOYED = {"metrics_host": "0.0.0.0", "metrics_port": None, "release": None}


def _module(answers: dict[str, Any]) -> str:
    return str(answers["worker_name"]).replace("-", "_")


def _prefix(answers: dict[str, Any]) -> str:
    return _module(answers).upper() + "_"


def _unquote(value: Any) -> Any:
    """python-hcl2 keeps the quotes of string literals (`'"serve"'`); drop them."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def _labelled(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """`[{'"name"': body}, ...]` as `{name: body}` (one label)."""
    return {_unquote(k): v for block in blocks for k, v in block.items()}


def _resources(parsed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`resource` blocks as `{"<type>.<name>": body}`."""
    out = {}
    for block in parsed.get("resource", []):
        for kind, named in block.items():
            for name, body in named.items():
                out[f"{_unquote(kind)}.{_unquote(name)}"] = body
    return out


def _locals(parsed: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for block in parsed.get("locals", []):
        out.update({k: v for k, v in block.items() if not k.startswith("__")})
    return out


def _hcl_folder(folder: Path, *, skip: str = "") -> dict[str, Any]:
    """Every `*.tf` of a folder parsed and merged (lists of blocks concatenated)."""
    merged: dict[str, list[Any]] = {}
    for path in sorted(folder.glob("*.tf")):
        if path.name == skip:
            continue
        with path.open(encoding="utf-8") as handle:
            for key, blocks in hcl2.load(handle).items():
                merged.setdefault(key, []).extend(blocks)
    return merged


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def _run(*cmd: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, template_repo: Path) -> Path:
    """The reference host with both workers rendered, each copy committed (read-only)."""
    root = copy_host(tmp_path_factory.mktemp("deployment") / "host")
    for answers in WORKERS:
        copy_template(template_repo, root, "v0.0.2", **answers)
        commit_all(root, f"worker {answers['worker_name']}")
    return root


@pytest.fixture
def fresh_host(tmp_path: Path) -> Path:
    return copy_host(tmp_path / "host")


def _worker_tf(host: Path, env: str, answers: dict[str, Any]) -> Path:
    return host / f"deployment/terraform/environments/{env}/worker_{_module(answers)}.tf"


def _instance(host: Path, env: str, answers: dict[str, Any]) -> dict[str, Any]:
    """The worker file's one `module "worker_<module>"` block."""
    with _worker_tf(host, env, answers).open(encoding="utf-8") as handle:
        parsed = hcl2.load(handle)
    modules = _labelled(parsed["module"])
    assert list(modules) == [f"worker_{_module(answers)}"], "one module instance per file"
    return modules[f"worker_{_module(answers)}"]


def _worker_module(host: Path) -> dict[str, Any]:
    """The worker module (modules/worker), every file parsed and merged."""
    return _hcl_folder(host / WORKER_MODULE_DIR)


def _service(host: Path) -> dict[str, Any]:
    """The worker module's one `module "service"` block: the host's service module."""
    modules = _labelled(_worker_module(host)["module"])
    assert list(modules) == ["service"]
    return modules["service"]


def _platform(host: Path, env: str) -> dict[str, Any]:
    """The environment's `local.worker_platform` (workers.tf, the namespace owner's)."""
    with (host / f"deployment/terraform/environments/{env}/workers.tf").open() as handle:
        return dict(_locals(hcl2.load(handle))["worker_platform"])


def _parsed_worker(host: Path, env: str, answers: dict[str, Any]) -> dict[str, Any]:
    with _worker_tf(host, env, answers).open(encoding="utf-8") as handle:
        return hcl2.load(handle)


ALL = [(env, answers) for env in ENVIRONMENTS for answers in WORKERS]
IDS = [f"{env}-{answers['worker_name']}" for env, answers in ALL]


# --- Terraform ----------------------------------------------------------------------------


def test_terraform_is_fmt_clean(host: Path) -> None:
    done = _run(TERRAFORM, "fmt", "-check", "-recursive", "-diff", "deployment/terraform", cwd=host)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_rendered_terraform_has_no_residue_or_blank_noise(
    host: Path, env: str, answers: dict[str, Any]
) -> None:
    text = _worker_tf(host, env, answers).read_text(encoding="utf-8")
    assert "{{" not in text and "{%" not in text and "}}\n" not in text
    assert "\n\n\n" not in text and not text.startswith("\n")
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert [line for line in text.splitlines() if line != line.rstrip()] == []


def _inputs_match(instance: dict[str, Any], folder: Path) -> None:
    """Everything a module block passes is declared, everything without a default passed."""
    variables = _labelled(_hcl_folder(folder)["variable"])
    passed = {k for k in instance if not k.startswith("__") and k != "source"}
    assert passed - set(variables) == set(), f"inputs {folder.name} does not declare"
    without_default = {name for name, body in variables.items() if "default" not in body}
    assert without_default - passed == set(), f"{folder.name} inputs without a default left unset"


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_one_worker_module_instance_per_file(host: Path, env: str, answers: dict[str, Any]) -> None:
    instance = _instance(host, env, answers)
    assert _unquote(instance["source"]) == "../../modules/worker"
    assert _unquote(instance["name"]) == answers["worker_name"]
    assert instance["platform"] == "${local.worker_platform}"
    _inputs_match(instance, host / WORKER_MODULE_DIR)
    # the worker file declares its image variable and the module instance: no resource, no
    # locals, and no moves (an update from before the module writes those: test below)
    assert set(_parsed_worker(host, env, answers)) - {"__comments__"} == {"variable", "module"}
    assert not list(_worker_tf(host, env, answers).parent.glob("*.moved.tf"))


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_the_workers_share_one_platform_per_environment(host: Path, env: str) -> None:
    """workers.tf (the namespace owner's) bundles what every worker's instance passes alike."""
    platform = _platform(host, env)
    assert platform == {
        "environment": "${local.environment}",
        "cluster_arn": "${var.cluster_arn}",
        "cluster_name": "${var.cluster_name}",
        "subnet_ids": "${var.private_subnet_ids}",
        "security_group_ids": "${var.task_security_group_ids}",
        "execution_role_arn": "${var.execution_role_arn}",
        "task_role_arn": "${var.task_role_arn}",
        "autoscaling_enabled": "${var.autoscaling_enabled}",
        "alarm_topic_arn": "${aws_sns_topic.alarms.arn}",
        "environment_variables": "${local.shared_environment}",
        "secrets": "${local.shared_secrets}",
    }
    variable = _labelled(_worker_module(host)["variable"])["platform"]
    assert "object" in str(variable["type"])
    for name in platform:
        assert name in str(variable["type"]), name


def test_one_service_module_instance_without_a_load_balancer_route(host: Path) -> None:
    instance = _service(host)
    assert _unquote(instance["source"]) == "../service"
    assert instance["name"] == "${var.name}"
    assert "load_balancer" not in instance
    assert instance["environment"] == "${var.platform.environment}"
    assert [_unquote(c) for c in instance["command"]] == ["serve"]
    _inputs_match(instance, host / MODULE_DIR)
    for name in ("desired_count", "max_count", "log_retention_days"):
        assert instance[name] == f"${{var.{name}}}", name
    assert instance["autoscaling_enabled"] == "${var.platform.autoscaling_enabled}"
    # a worker has no route: the module creates its target group and rule only with one
    variables = _labelled(_hcl_folder(host / MODULE_DIR)["variable"])
    module = _resources(_hcl_folder(host / MODULE_DIR))
    for resource in ("aws_lb_target_group.this", "aws_lb_listener_rule.this"):
        assert module[resource]["count"] == "${var.load_balancer == null ? 0 : 1}"
    assert variables["load_balancer"]["default"] is None


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_rollout_never_exceeds_the_desired_count(
    host: Path, env: str, answers: dict[str, Any]
) -> None:
    instance = _service(host)
    assert instance["deployment_maximum_percent"] == 100
    minimum = instance["deployment_minimum_healthy_percent"]
    assert 0 < minimum < 100, "below 100, or a rollout capped at 100 % could never start"
    assert _instance(host, env, answers)["desired_count"] >= 1
    service = _resources(_hcl_folder(host / MODULE_DIR))["aws_ecs_service.this"]
    assert service["deployment_maximum_percent"] == "${var.deployment_maximum_percent}"
    assert (
        service["deployment_minimum_healthy_percent"] == "${var.deployment_minimum_healthy_percent}"
    )


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_log_group_keeps_logs_for_a_retention_period(
    host: Path, env: str, answers: dict[str, Any]
) -> None:
    instance = _instance(host, env, answers)
    days = instance["log_retention_days"]
    # the retention periods CloudWatch accepts
    assert days in {1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1827, 3653}
    if env == "production":
        staging = _instance(host, "staging", answers)["log_retention_days"]
        assert days >= staging
    group = _resources(_hcl_folder(host / MODULE_DIR))["aws_cloudwatch_log_group.this"]
    assert group["retention_in_days"] == "${var.log_retention_days}"


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_autoscaling_tracks_a_target_behind_the_root_switch(
    host: Path, env: str, answers: dict[str, Any]
) -> None:
    instance = _instance(host, env, answers)
    assert _platform(host, env)["autoscaling_enabled"] == "${var.autoscaling_enabled}"
    assert instance["max_count"] > instance["desired_count"]
    root = _labelled(
        _hcl_folder(host / f"deployment/terraform/environments/{env}", skip="")["variable"]
    )
    assert root["autoscaling_enabled"]["type"] == "bool"
    module = _resources(_hcl_folder(host / MODULE_DIR))
    target = module["aws_appautoscaling_target.this"]
    assert target["count"] == "${var.autoscaling_enabled ? 1 : 0}"
    assert target["min_capacity"] == "${var.desired_count}"
    assert target["max_capacity"] == "${var.max_count}"
    policy = module["aws_appautoscaling_policy.cpu"]
    assert policy["count"] == "${var.autoscaling_enabled ? 1 : 0}"
    assert _unquote(policy["policy_type"]) == "TargetTrackingScaling"


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_running_below_desired_alarm_notifies_the_alarm_topic(
    host: Path, env: str, answers: dict[str, Any]
) -> None:
    assert _platform(host, env)["alarm_topic_arn"] == "${aws_sns_topic.alarms.arn}"
    assert _service(host)["alarm_topic_arn"] == "${var.platform.alarm_topic_arn}"
    root = _resources(_hcl_folder(host / f"deployment/terraform/environments/{env}"))
    assert "aws_sns_topic.alarms" in root
    alarm = _resources(_hcl_folder(host / MODULE_DIR))[
        "aws_cloudwatch_metric_alarm.running_below_desired"
    ]
    assert "count" not in alarm, "the alarm exists for every process"
    assert alarm["alarm_actions"] == ["${var.alarm_topic_arn}"]  # the service module's own
    assert _unquote(alarm["comparison_operator"]) == "LessThanThreshold"
    metrics = {
        _unquote(q["metric"][0]["metric_name"]) for q in alarm["metric_query"] if "metric" in q
    }
    assert metrics == {"RunningTaskCount", "DesiredTaskCount"}


RUNTIME_QUEUE_STATS = "workers/runtime/src/acme/workers/runtime/queue_stats.py"
TOPIC = "${var.platform.alarm_topic_arn}"
SWITCH = "${var.platform.autoscaling_enabled ? 1 : 0}"
OLD_SWITCH = "${var.autoscaling_enabled ? 1 : 0}"  # the worker file's, before the module
NAMESPACE_SWITCH = "${var.namespace_alarms ? 1 : 0}"
# The alarms on the topic: every worker's, and the database's and the outbox's, which only
# the instance of the worker that owns the work namespace (the first) turns on.
OWN_ALARMS = {
    "backlog_age",
    "queue_stats_missing",
    "claims_failing",
    "lease_renewals_failing",
    "completions_failing",
    "wake_ups_down",
    "dead_letters_unaudited",
}
OWNER_ALARMS = {
    "snapshot_age",
    "snapshot_held",
    "stranded",
    "outbox_failing",
    "outbox_dead_letters",
}


def _queue_stats_constant(host: Path, name: str) -> Any:
    """A module-level literal of the rendered worker runtime's queue stats (`QUEUE_STATS_*`)."""
    tree = ast.parse((host / RUNTIME_QUEUE_STATS).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [
            t.id for t in node.targets if isinstance(t, ast.Name)
        ] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{RUNTIME_QUEUE_STATS} defines no {name}")


def _worker_resources(host: Path, kind: str) -> dict[str, Any]:
    """The worker module's resources of one type, by name."""
    resources = _resources(_worker_module(host))
    return {k.removeprefix(f"{kind}."): v for k, v in resources.items() if k.startswith(kind)}


LANE = '${local.settings["LANE"]}'


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_metric_filters_read_the_fields_the_loop_logs_from_the_modules_log_group(
    host: Path, env: str, answers: dict[str, Any]
) -> None:
    """The fields and the event are read from the rendered runtime (`queue_stats.py`), so
    the two cannot drift; the engine's own test checks that a sweep pass logs exactly those fields."""
    fields = _queue_stats_constant(host, "QUEUE_STATS_FIELDS")
    event = _queue_stats_constant(host, "QUEUE_STATS_EVENT")
    own = _locals(_worker_module(host))
    metrics = own["queue_metrics"]
    assert {_unquote(m["field"]) for m in metrics.values()} == set(fields) - {"lane"}
    assert len(metrics) == len(fields) - 1, "one metric per field"
    units = {_unquote(m["unit"]) for m in metrics.values()}
    assert units <= {"Count", "Seconds", "None"}
    for metric in metrics.values():  # a duration field carries its unit, and so its metric
        field, unit = _unquote(metric["field"]), _unquote(metric["unit"])
        assert field.endswith("_s") == (unit == "Seconds"), field
    assert (
        _unquote(own["metric_namespace"]) == "acme/${var.platform.environment}/workers/${var.name}"
    )
    assert own["lane"] == LANE
    [(name, log_filter)] = _worker_resources(host, "aws_cloudwatch_log_metric_filter").items()
    assert name == "queue_stats"
    assert log_filter["for_each"] == "${local.queue_metrics}"
    assert log_filter["log_group_name"] == "${module.service.log_group_name}"
    pattern = _unquote(log_filter["pattern"]).replace('\\"', '"')
    assert pattern == f'{{ ($.event = "{event}") && ($.${{each.value.field}} >= 0) }}'
    [transformation] = log_filter["metric_transformation"]
    assert transformation["namespace"] == "${local.metric_namespace}"
    assert _unquote(transformation["value"]) == "$.${each.value.field}"
    assert {k: _unquote(v) for k, v in transformation["dimensions"].items()} == {"lane": "$.lane"}
    assert "lane" in fields
    # the module declares the outputs read here (docs/host-contract.md)
    outputs = _labelled(_hcl_folder(host / MODULE_DIR)["output"])
    assert {"service_name", "log_group_name"} <= set(outputs)


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_every_alarm_notifies_the_alarm_topic_and_says_what_it_means(
    host: Path, env: str, answers: dict[str, Any]
) -> None:
    metrics = _locals(_worker_module(host))["queue_metrics"]
    alarms = _worker_resources(host, "aws_cloudwatch_metric_alarm")
    paging = {name: body for name, body in alarms.items() if body.get("count") != SWITCH}
    assert set(paging) == OWN_ALARMS | OWNER_ALARMS
    once = {name for name, body in paging.items() if body.get("count") == NAMESPACE_SWITCH}
    assert once == OWNER_ALARMS
    assert {n for n, b in paging.items() if "count" in b} == OWNER_ALARMS
    # the first worker created the work namespace: its instances alone turn them on
    instance = _instance(host, env, answers)
    assert instance.get("namespace_alarms", False) is (answers is FIRST)
    for name, alarm in paging.items():
        assert alarm["alarm_actions"] == [TOPIC], name
        assert alarm["ok_actions"] == [TOPIC], name
        assert _unquote(alarm["metric_name"]) in metrics, name
        assert alarm["namespace"] == "${local.metric_namespace}", name
        assert alarm["dimensions"] == {"lane": "${local.lane}"}, name
        assert _unquote(alarm["treat_missing_data"]) in {"notBreaching", "breaching"}, name
        assert alarm["period"] in (60, 300), name
        description = _unquote(alarm["alarm_description"])
        assert len(description) <= 1024 and description.count(". ") >= 1, name
        # the name says the threshold with its unit
        title = _unquote(alarm["alarm_name"])
        assert title.startswith("${module.service.service_name}-"), name
        assert re.search(r"(\d+min|\}s|-xids|-above-0)$", title), title
    # only the missing line counts as breaching: the others read nothing into no data
    missing = {n for n, a in paging.items() if _unquote(a["treat_missing_data"]) == "breaching"}
    assert missing == {"queue_stats_missing"}
    assert (host / "deployment/terraform/environments" / env / "main.tf").read_text().count(
        'resource "aws_sns_topic" "alarms"'
    ) == 1


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_backlog_scaling_exists_only_behind_the_autoscaling_switch(
    host: Path, env: str, answers: dict[str, Any]
) -> None:
    policies = _worker_resources(host, "aws_appautoscaling_policy")
    assert set(policies) == {"backlog", "oldest_item_age"}
    for name, policy in policies.items():
        assert policy["count"] == SWITCH, name
        assert _unquote(policy["resource_id"]) == (
            "service/${var.platform.cluster_name}/${module.service.service_name}"
        )
        assert _unquote(policy["scalable_dimension"]) == "ecs:service:DesiredCount"
        assert _unquote(policy["service_namespace"]) == "ecs"
        # the module creates the scalable target (docs/host-contract.md)
        assert policy["depends_on"] == ["${module.service}"], name
    assert _platform(host, env)["autoscaling_enabled"] == "${var.autoscaling_enabled}"
    tracking = policies["backlog"]
    assert _unquote(tracking["policy_type"]) == "TargetTrackingScaling"
    [config] = tracking["target_tracking_scaling_policy_configuration"]
    assert config["target_value"] == "${local.backlog_per_task_items}"
    own = _locals(_worker_module(host))
    assert own["capacity_items"] == '${tonumber(local.settings["CAPACITY"])}'
    assert own["backlog_per_task_items"] == "${local.capacity_items}"
    [spec] = config["customized_metric_specification"]
    queries = {_unquote(q["id"]): q for q in spec["metrics"]}
    assert [i for i, q in queries.items() if q["return_data"]] == ["per_task"]
    assert _unquote(queries["per_task"]["expression"]) == "available / running"
    [[available]] = [s["metric"] for s in queries["available"]["metric_stat"]]
    assert _unquote(available["metric_name"]) == "Available"
    [[running]] = [s["metric"] for s in queries["running"]["metric_stat"]]
    assert _unquote(running["metric_name"]) == "RunningTaskCount"
    assert _unquote(running["namespace"]) == "ECS/ContainerInsights"
    stepping = policies["oldest_item_age"]
    assert _unquote(stepping["policy_type"]) == "StepScaling"
    triggers = {
        name: alarm
        for name, alarm in _worker_resources(host, "aws_cloudwatch_metric_alarm").items()
        if alarm.get("count") == SWITCH
    }
    assert set(triggers) == {"scale_out_on_age"}
    trigger = triggers["scale_out_on_age"]
    assert trigger["count"] == SWITCH
    assert trigger["alarm_actions"] == ["${aws_appautoscaling_policy.oldest_item_age[0].arn}"]
    assert _unquote(trigger["metric_name"]) == "OldestAvailableAge"
    # nothing else in the worker module is behind the switch, nothing else scales
    resources = _resources(_worker_module(host))
    counted = {k for k, v in resources.items() if v.get("count") == SWITCH}
    assert counted == {
        "aws_appautoscaling_policy.backlog",
        "aws_appautoscaling_policy.oldest_item_age",
        "aws_cloudwatch_metric_alarm.scale_out_on_age",
    }
    assert {v.get("count") for k, v in resources.items() if k not in counted} <= {
        None,
        NAMESPACE_SWITCH,
    }


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_every_setting_is_passed_or_wired_as_a_secret(
    host: Path, env: str, answers: dict[str, Any], tmp_path: Path
) -> None:
    """Every field of the worker's settings reaches the task under its frozen name,
    `<PREFIX><FIELD>`: the module's defaults, its added kinds' `kind_settings`, the worker
    file's `settings` on top."""
    instance = _instance(host, env, answers)
    own = _locals(_worker_module(host))
    defaults = {k: _unquote(v) for k, v in own["default_settings"].items()}
    overrides = {k: _unquote(v) for k, v in instance["settings"].items()}
    lane = answers.get("lane", "default")
    assert overrides == {"LANE": lane, "CAPACITY": "10"}
    expected = {}
    for field, local in patcher.WORKER_SETTINGS:
        if field not in DEPLOYED:
            expected[field.upper()] = local.format(lane="default", metrics_port="")
    assert {k: v for k, v in defaults.items() if k in expected} == expected
    assert set(defaults) == {f.upper() for f, _ in patcher.WORKER_SETTINGS}
    assert defaults["METRICS_HOST"] == "0.0.0.0"
    assert defaults["METRICS_PORT"] == "${tostring(var.metrics_port)}"
    variables = _labelled(_worker_module(host)["variable"])
    assert variables["metrics_port"]["default"] == deploy.CONTAINER_METRICS_PORT
    assert "metrics_port" not in instance, "the image exposes the same port for every worker"
    assert defaults["RELEASE"] == '${substr(split("@sha256:", var.image)[1], 0, 12)}'
    assert own["settings"] == "${merge(local.default_settings, var.kind_settings, var.settings)}"
    # the prefix the module derives from the name is the one the worker reads
    prefix = _console(own["settings_prefix"].replace("var.name", f'"{answers["worker_name"]}"'),
                      tmp_path)  # fmt: skip
    assert prefix == f'"{_prefix(answers)}"'
    merged = own["environment_variables"]
    assert merged.startswith("${merge(var.platform.environment_variables,"), merged
    assert '"${local.settings_prefix}${field}" => value' in merged, merged
    service = _service(host)
    assert service["container_port"] == "${var.metrics_port}"
    assert service["environment_variables"] == "${local.environment_variables}"
    assert service["secrets"] == "${var.platform.secrets}"
    # the database and Redis URLs never in plain settings: secrets from the secret store
    platform = _platform(host, env)
    assert platform["secrets"] == "${local.shared_secrets}"
    assert platform["environment_variables"] == "${local.shared_environment}"
    root = _locals(_hcl_folder(host / f"deployment/terraform/environments/{env}"))
    secrets = root["shared_secrets"]
    assert secrets["ACME_DATABASE_URL"] == "${var.database_url_secret_arn}"
    assert secrets["ACME_REDIS_URL"] == "${var.redis_url_secret_arn}"
    plain = {_prefix(answers) + k for k in defaults} | set(root["shared_environment"])
    assert not {k for k in plain if k.endswith(("_URL", "_DSN", "_PASSWORD", "_TOKEN"))}


@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_every_variable_is_declared_and_the_workflow_sets_the_image(
    host: Path, env: str, answers: dict[str, Any]
) -> None:
    folder = host / f"deployment/terraform/environments/{env}"
    text = _worker_tf(host, env, answers).read_text(encoding="utf-8")
    everything = _hcl_folder(folder)
    declared = _labelled(everything["variable"])
    assert set(re.findall(r"\bvar\.(\w+)", text)) - set(declared) == set()
    defined = _locals(everything)
    assert set(re.findall(r"\blocal\.(\w+)", text)) - set(defined) == set()
    own = _labelled(_parsed_worker(host, env, answers)["variable"])
    unset = {name for name, body in own.items() if "default" not in body}
    image_var = f"{_module(answers)}_image"
    assert unset == {image_var}, "only the image comes without a default, from the workflow"
    # the deploy job turns each recorded image `<name>` into TF_VAR_<name with _>_image
    workflow = (host / (STAGING if env == "staging" else PRODUCTION)).read_text()
    assert 'echo "TF_VAR_${image//-/_}_image=${value}"' in workflow
    assert str(answers["worker_name"]).replace("-", "_") + "_image" == image_var


def _console(expression: str, tmp_path: Path) -> str:
    done = subprocess.run(
        [TERRAFORM, "console"],
        input=expression + "\n",
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_image_must_be_pinned_by_digest_and_names_the_release(host: Path, tmp_path: Path) -> None:
    """The worker module refuses an image by tag, and reports the digest's start as the
    release; each worker file passes its own image variable, which the workflow sets."""
    variable = _labelled(_worker_module(host)["variable"])["image"]
    condition = variable["validation"][0]["condition"][2:-1]
    release = _locals(_worker_module(host))["default_settings"]["RELEASE"][2:-1]
    tag = DIGEST.split("@")[0] + ":latest"
    for ref, expected in ((DIGEST, "true"), (tag, "false"), ("@sha256:" + "ab" * 32, "false")):
        literal = condition.replace("var.image", f'"{ref}"')
        assert _console(literal, tmp_path) == expected, ref
    value = _console(release.replace("var.image", f'"{DIGEST}"'), tmp_path)
    assert value == '"' + "ab" * 6 + '"'
    for env, answers in ALL:
        image = f"${{var.{_module(answers)}_image}}"
        assert _instance(host, env, answers)["image"] == image


def test_environments_differ_only_in_sizes(host: Path) -> None:
    staging = _instance(host, "staging", FIRST)
    production = _instance(host, "production", FIRST)
    differing = {k for k in staging if staging[k] != production.get(k)}
    assert differing == {"desired_count", "log_retention_days", "max_count"}
    assert production["desired_count"] >= staging["desired_count"]
    assert _platform(host, "staging") == _platform(host, "production")


# --- the move into the worker module (docs/decisions/0031) ---------------------------------

# The last commits whose worker files declared the worker's resources themselves: the 0.1.0
# release (the service module instance only) and the last one before the worker module.
BEFORE_MODULE = {"v0.1.0": RELEASE_0_1_0, "pre-module": "568e5b9210b7e0fca3e80e60bc66fcb5a8a02370"}
OLD_WORKER_TF = (
    "template/deployment/terraform/environments/{env}/worker_{{{{ worker_module }}}}.tf.jinja"
)
PLUGINS = "/opt/tf-plugins"
naming = load_extension("naming")
lifecycle = load_extension("lifecycle")


def _old_worker_tf(commit: str, env: str, answers: dict[str, Any], *, owner: bool) -> str:
    """The worker file as the template rendered it at `commit` (a commit of this repository)."""
    source = git(REPO, "show", f"{commit}:{OLD_WORKER_TF.format(env=env)}")
    context = {
        "lane": "default",
        "host_root": "acme",
        "namespace_absent": owner,
        **answers,
        **naming.derive_names(worker_name=answers["worker_name"], work_kind=answers["work_kind"]),
    }
    environment = jinja2.Environment(keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return environment.from_string(source).render(context)


def _addresses(parsed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Module calls and resources as Terraform addresses (`module.x`, `<type>.<name>`)."""
    calls = {f"module.{name}": body for name, body in _labelled(parsed.get("module", [])).items()}
    return calls | _resources(parsed)


def _moves(parsed: dict[str, Any]) -> dict[str, str]:
    """`moved` blocks as `{from: to}`, addresses without `${}`."""
    return {block["from"][2:-1]: block["to"][2:-1] for block in parsed.get("moved", [])}


# What the worker module gained after the move into it (v0.2.0): an update creates these.
METRICS_SINCE = {"OldestSnapshotAge", "LanePaused"}
ALARMS_SINCE = {"snapshot_held"}
METRIC_FILTER = "aws_cloudwatch_log_metric_filter.queue_stats"


@pytest.mark.parametrize("commit", list(BEFORE_MODULE.values()), ids=list(BEFORE_MODULE))
@pytest.mark.parametrize(("env", "answers"), ALL, ids=IDS)
def test_every_old_address_moves_into_the_worker_module(
    host: Path, env: str, answers: dict[str, Any], commit: str
) -> None:
    """Each address the worker file declared before the module has a `moved` block to an
    address the module declares, with the same count or for_each (keys kept), so an
    updated host's plan moves state instead of destroying and recreating. The blocks are
    those the update from before 0.2 writes (copier.yml's v0.2.0 `terraform-moves`)."""
    owner = answers is FIRST
    old = hcl2.loads(_old_worker_tf(commit, env, answers, owner=owner))
    module = _module(answers)
    moves = _moves(hcl2.loads(lifecycle.terraform_moves(answers["worker_name"], module, owner)))
    prefix = f"module.worker_{module}."
    inside = _addresses(_worker_module(host))
    old_metrics = _locals(old).get(f"{module}_queue_metrics")
    for address, body in _addresses(old).items():
        assert address in moves, f"{address}: no moved block"
        target = moves[address]
        assert target.startswith(prefix), target
        inner, _, key = target.removeprefix(prefix).partition("[")
        kind = inner.partition(".")[0]
        if address == f"module.{module}":
            assert inner == "module.service" and not key
            continue
        assert kind == address.split(".")[0], "a move keeps the resource type"
        assert inner in inside, f"{target}: the worker module declares no {inner}"
        new = inside[inner]
        if "for_each" in body:  # the same map, so the same keys
            assert body["for_each"] == f"${{local.{module}_queue_metrics}}"
            assert new["for_each"] == "${local.queue_metrics}"
            metrics = _locals(_worker_module(host))["queue_metrics"]
            assert {k: v for k, v in metrics.items() if k not in METRICS_SINCE} == old_metrics
            assert not key
        elif "count" in body:
            assert body["count"] == OLD_SWITCH and new["count"] == SWITCH and not key
        else:  # one instance before; the module's count is 1 for this worker
            assert not key or (key == "0]" and new["count"] == NAMESPACE_SWITCH and owner), target
            assert "count" not in new or key == "0]"
    if commit == BEFORE_MODULE["pre-module"]:  # no move from an address never declared
        assert set(moves) == set(_addresses(old))
        # and every address in the module but those it gained since has come from somewhere
        # (the owner's has all)
        targets = {t.removeprefix(prefix).partition("[")[0] for t in moves.values()}
        since = {f"aws_cloudwatch_metric_alarm.{name}" for name in ALARMS_SINCE}
        assert targets == (
            set(inside) - since
            if owner
            else set(inside) - {f"aws_cloudwatch_metric_alarm.{name}" for name in OWNER_ALARMS}
        )


def _terraform(folder: Path, *args: str) -> str:
    done = subprocess.run(
        [TERRAFORM, *args, "-no-color"],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"},
    )
    assert done.returncode == 0, f"terraform {args[0]}: {done.stdout}{done.stderr}"
    return done.stdout


# Offline: the provider from the local plugin folder, no credentials, a local backend.
OFFLINE_OVERRIDE = """\
terraform {
  backend "local" {}
}

provider "aws" {
  region                      = "eu-west-1"
  access_key                  = "offline"
  secret_key                  = "offline"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
}
"""
ARN = "arn:aws:sns:eu-west-1:123456789012:placeholder"
VARIABLES = {
    "cluster_arn": "arn:aws:ecs:eu-west-1:123456789012:cluster/c",
    "cluster_name": "c",
    "vpc_id": "vpc-1",
    "private_subnet_ids": ["subnet-1"],
    "task_security_group_ids": ["sg-1"],
    "execution_role_arn": "arn:aws:iam::123456789012:role/execution",
    "task_role_arn": "arn:aws:iam::123456789012:role/task",
    "alb_listener_arn": "arn:aws:elasticloadbalancing:eu-west-1:123456789012:listener/app/a/1/2",
    "database_url_secret_arn": ARN,
    "redis_url_secret_arn": ARN,
    "sentry_dsn_secret_arn": ARN,
    "otel_exporter_endpoint": "http://collector:4318",
    "api_image": DIGEST,
    "shipment_notifier_image": DIGEST,
    "invoice_mailer_image": DIGEST,
    "autoscaling_enabled": True,
}


def _plan(folder: Path) -> dict[str, Any]:
    """`terraform plan` of an environment folder, offline and without refresh, as JSON."""
    (folder / "offline_override.tf").write_text(OFFLINE_OVERRIDE, encoding="utf-8")
    (folder / "offline.tfvars.json").write_text(json.dumps(VARIABLES), encoding="utf-8")
    _terraform(folder, "init", "-reconfigure", f"-plugin-dir={PLUGINS}", "-input=false")
    _terraform(
        folder, "plan", "-refresh=false", "-input=false", "-var-file=offline.tfvars.json", "-out=p"
    )
    return dict(json.loads(_terraform(folder, "show", "-json", "p")))


def _schema_versions(module: dict[str, Any]) -> dict[str, int]:
    """`{address: schema_version}` of a plan's `planned_values` module, children included."""
    versions = {r["address"]: r["schema_version"] for r in module.get("resources", [])}
    for child in module.get("child_modules", []):
        versions |= _schema_versions(child)
    return versions


def _state(plan: dict[str, Any]) -> dict[str, Any]:
    """A state holding every managed resource a plan creates, as planned; values known only
    after apply are null, but `id` and `arn` (which other resources read) a placeholder."""
    versions = _schema_versions(plan["planned_values"]["root_module"])
    grouped: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for change in plan["resource_changes"]:
        if change["mode"] != "managed":
            continue
        after = dict(change["change"]["after"])
        for name, unknown in change["change"]["after_unknown"].items():
            if unknown is True:
                after[name] = ARN if name in ("id", "arn") else None
        instance = {"schema_version": versions[change["address"]], "attributes": after}
        if "index" in change:
            instance["index_key"] = change["index"]
        key = (change.get("module_address", ""), change["type"], change["name"])
        grouped.setdefault(key, []).append(instance)
    provider = 'provider["registry.terraform.io/hashicorp/aws"]'
    resources = [
        {"mode": "managed", "type": kind, "name": name, "provider": provider, "instances": items}
        | ({"module": module} if module else {})
        for (module, kind, name), items in grouped.items()
    ]
    return {"version": 4, "serial": 1, "lineage": "moves", "outputs": {}, "resources": resources}


def test_plan_after_the_update_destroys_nothing_and_changes_no_value(
    host: Path, tmp_path: Path
) -> None:
    """The staging folder before the module (both workers' old files, autoscaling on), its
    plan turned into a state; the folder after it, planned on that state: no resource is
    created or destroyed, each of the workers' resources is found at its old address, and
    every planned value (alarm and metric names and the task's settings included) is the old
    plan's; created only what the module gained since (`METRICS_SINCE`, `ALARMS_SINCE`).
    The folder after it is an updated host's: the fresh rendering and the moves the
    v0.2.0 migration writes (`lifecycle.py terraform-moves`), which the plan needs."""
    env = "staging"
    root = tmp_path / "updated"
    shutil.copytree(
        host / TERRAFORM_DIR, root / TERRAFORM_DIR, ignore=shutil.ignore_patterns(".terraform*")
    )
    for answers in WORKERS:
        answers_file = f"workers/{answers['worker_name']}/.copier-answers.yml"
        (root / answers_file).parent.mkdir(parents=True)
        shutil.copy(host / answers_file, root / answers_file)
    git(root, "init", "-q", "-b", "main")
    for answers in WORKERS:
        answers_file = f"workers/{answers['worker_name']}/.copier-answers.yml"
        done = lifecycle.main(
            ["terraform-moves", "--answers-file", answers_file, "--host", str(root)]
        )
        assert done == 0
        written = (
            root / TERRAFORM_DIR / "environments" / env / f"worker_{_module(answers)}.moved.tf"
        )
        assert written.is_file()
        check = _run(TERRAFORM, "fmt", "-check", "-diff", str(written), cwd=root)
        assert check.returncode == 0, check.stdout + check.stderr
        # written once: a second run (or a later update) leaves the file as it is
        written.write_text(written.read_text() + "# ours\n")
        assert (
            lifecycle.main(["terraform-moves", "--answers-file", answers_file, "--host", str(root)])
            == 0
        )
        assert written.read_text().endswith("}\n# ours\n")
    new = root / TERRAFORM_DIR
    old = tmp_path / "before"
    shutil.copytree(REFERENCE_HOST / TERRAFORM_DIR, old)
    for answers in WORKERS:
        rendered = _old_worker_tf(BEFORE_MODULE["pre-module"], env, answers, owner=answers is FIRST)
        (old / "environments" / env / f"worker_{_module(answers)}.tf").write_text(rendered)
    before = _plan(old / "environments" / env)
    state = json.dumps(_state(before))
    (old / "environments" / env / "terraform.tfstate").write_text(state, encoding="utf-8")
    (new / "environments" / env / "terraform.tfstate").write_text(state, encoding="utf-8")
    again = {
        c["address"]: c["change"] for c in _plan(old / "environments" / env)["resource_changes"]
    }
    planned = _plan(new / "environments" / env)["resource_changes"]
    created = {c["address"] for c in planned if c["change"]["actions"] == ["create"]}
    owner = f"module.worker_{_module(FIRST)}"
    assert created == {
        *(
            f'module.worker_{_module(a)}.{METRIC_FILTER}["{m}"]'
            for a in WORKERS
            for m in METRICS_SINCE
        ),
        *(f"{owner}.aws_cloudwatch_metric_alarm.{alarm}[0]" for alarm in ALARMS_SINCE),
    }
    after = [c for c in planned if c["address"] not in created]
    assert len(again) == len(before["resource_changes"]) == len(after)
    moved = 0
    for change in after:
        previous = change.get("previous_address", change["address"])
        moved += previous != change["address"]
        assert previous in again, f"{change['address']}: not in the state before"
        assert set(change["change"]["actions"]) <= {"no-op", "update"}, change["address"]
        assert change["change"]["actions"] == again[previous]["actions"], change["address"]
        assert change["change"]["after"] == again[previous]["after"], change["address"]
    workers = [c for c in again if any(_module(a) in c for a in WORKERS)]
    assert moved == len(workers) > 0


def test_a_worker_other_than_the_owner_is_refused_without_the_worker_module(
    host: Path, tmp_path: Path
) -> None:
    """A copy of the second worker into a host whose owner predates the worker module stops
    before writing, naming the module (the owner's update brings it)."""
    shutil.copytree(host / TERRAFORM_DIR, tmp_path / TERRAFORM_DIR)
    spec = SECOND_SPEC
    assert deploy.check_terraform(tmp_path, spec) == []
    shutil.rmtree(tmp_path / WORKER_MODULE_DIR)
    refusal = (
        f"{WORKER_MODULE_DIR}: the worker module does not exist (the worker that owns the "
        "work namespace renders it: update that worker first)"
    )
    assert deploy.check_terraform(tmp_path, spec) == [refusal]
    owner = dataclasses.replace(spec, namespace_absent=True)
    assert deploy.check_terraform(tmp_path, owner) == []
    # each environment's workers.tf, the owner's too
    (tmp_path / TERRAFORM_DIR / "environments/staging/workers.tf").unlink()
    missing = (
        f"{TERRAFORM_DIR}/environments/staging/workers.tf: the workers' shared inputs do not "
        "exist (the worker that owns the work namespace renders them: update that worker first)"
    )
    assert deploy.check_terraform(tmp_path, spec) == [refusal, missing]
    assert deploy.check_terraform(tmp_path, owner) == []


def test_a_worker_updated_before_the_owner_waits_for_the_worker_module(tmp_path: Path) -> None:
    """copier.yml's v0.2.0 `needs-owner` entry: the second worker's update stops, naming
    the owner's update, until the owner rendered the module; the owner always goes on."""
    lifecycle = load_extension("lifecycle")
    module_main = f"{WORKER_MODULE_DIR}/main.tf"
    [entry] = [
        m
        for m in yaml.safe_load((REPO / "copier.yml").read_text(encoding="utf-8"))["_migrations"]
        if "needs-owner" in m["command"]
    ]
    assert entry["version"] == "v0.2.0" and entry["command"][-2:] == ["--path", module_main]
    root = tmp_path / "host"
    for answers, owner in ((FIRST, True), (SECOND, False)):
        folder = root / "workers" / str(answers["worker_name"])
        folder.mkdir(parents=True)
        recorded = {"worker_name": answers["worker_name"], "namespace_absent": owner}
        (folder / ".copier-answers.yml").write_text(yaml.safe_dump(recorded), encoding="utf-8")
    git(root, "init", "-q", "-b", "main")
    commit_all(root, "two workers")
    second = "workers/invoice-mailer/.copier-answers.yml"
    waits = lifecycle.needs_owner(root, second, [module_main])
    assert not waits.proceed
    assert waits.message == (
        f"invoice-mailer: the new version reads {module_main}, which the worker that owns the "
        "work namespace brings: run `make update-worker NAME=shipment-notifier` first (or "
        "`make update-workers`, which starts with it). Nothing was updated."
    )
    first = "workers/shipment-notifier/.copier-answers.yml"
    assert lifecycle.needs_owner(root, first, [module_main]).proceed
    (root / WORKER_MODULE_DIR).mkdir(parents=True)
    (root / module_main).write_text("# the owner's\n", encoding="utf-8")
    assert lifecycle.needs_owner(root, second, [module_main]).proceed


# --- deploy workflows -----------------------------------------------------------------------


@pytest.mark.parametrize("path", [STAGING, PRODUCTION])
def test_workflows_validate_against_the_github_schema(host: Path, path: str) -> None:
    done = _run(
        str(VENV_BIN / "check-jsonschema"),
        "--builtin-schema",
        "vendor.github-workflows",
        path,
        cwd=host,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", [STAGING, PRODUCTION])
def test_workflows_gain_only_the_image_entries(host: Path, path: str) -> None:
    """Comments, quoting and layout kept: the one change is the images in the matrix."""
    before = (REFERENCE_HOST / path).read_text(encoding="utf-8")
    after = (host / path).read_text(encoding="utf-8")
    assert before.count("image: [api]") == 1
    assert after == before.replace(
        "image: [api]", "image: [api, shipment-notifier, invoice-mailer]"
    )


def _steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job.get("steps") or [])


def test_staging_builds_pushes_under_the_commit_and_records_the_digest(host: Path) -> None:
    workflow = yaml.safe_load((host / STAGING).read_text())
    [(job_id, images)] = [
        (name, job["strategy"]["matrix"]["image"])
        for name, job in workflow["jobs"].items()
        if "strategy" in job
    ]
    assert images == ["api", "shipment-notifier", "invoice-mailer"]
    steps = _steps(workflow["jobs"][job_id])
    [build] = [s for s in steps if str(s.get("uses", "")).startswith("docker/build-push-action")]
    assert build["with"]["file"] == "deployment/docker/${{ matrix.image }}.Dockerfile"
    assert build["with"]["push"] is True
    assert build["with"]["tags"].endswith(":${{ github.sha }}")
    records = [s for s in steps if f"steps.{build['id']}.outputs.digest" in str(s.get("env"))]
    assert len(records) == 1 and steps.index(records[0]) > steps.index(build)
    assert '"/acme/images/${GITHUB_SHA}/${IMAGE}"' in records[0]["run"]


def test_production_promotes_the_recorded_digest_and_never_rebuilds(host: Path) -> None:
    workflow = yaml.safe_load((host / PRODUCTION).read_text())
    jobs = workflow["jobs"]
    [(verify_id, images)] = [
        (name, job["strategy"]["matrix"]["image"])
        for name, job in jobs.items()
        if "strategy" in job
    ]
    assert images == ["api", "shipment-notifier", "invoice-mailer"]
    text = (host / PRODUCTION).read_text()
    assert "build-push-action" not in text and "docker build" not in text
    assert "docker push" not in text
    verify = _steps(jobs[verify_id])
    checks = [s for s in verify if "aws ssm get-parameter " in str(s.get("run"))]
    assert len(checks) == 1 and "exit 1" in checks[0]["run"]
    assert checks[0]["env"]["IMAGE"] == "${{ matrix.image }}"
    deployers = [name for name, job in jobs.items() if job.get("needs") == verify_id]
    assert len(deployers) == 1
    deploy_steps = _steps(jobs[deployers[0]])
    assert deploy_steps[0]["with"]["ref"] == f"${{{{ needs.{verify_id}.outputs.sha }}}}"
    assert any("/acme/images/${SHA}/" in str(s.get("run")) for s in deploy_steps)


# --- local compose ------------------------------------------------------------------------


def test_compose_validates_against_the_compose_spec(host: Path) -> None:
    for path in (COMPOSE_FULL, COMPOSE):
        done = _run(
            str(VENV_BIN / "check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            path,
            cwd=host,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_container_worker_runs_in_compose_and_the_other_does_not(host: Path) -> None:
    full = yaml.safe_load((host / COMPOSE_FULL).read_text())
    base = yaml.safe_load((host / COMPOSE).read_text())
    services = full["services"]
    assert list(services) == ["api", "invoice-mailer"], "only the container: true worker"
    service = services["invoice-mailer"]
    assert service["build"] == {
        "context": "../..",
        "dockerfile": "deployment/docker/invoice-mailer.Dockerfile",
    }
    assert (host / COMPOSE_FULL).parent.joinpath(service["build"]["context"]).resolve() == host
    assert service["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
    }
    assert {"postgres", "redis"} <= set(base["services"])
    env = service["environment"]
    assert env["ACME_DATABASE_URL"] == services["api"]["environment"]["ACME_DATABASE_URL"]
    assert env["ACME_REDIS_URL"] == services["api"]["environment"]["ACME_REDIS_URL"]
    assert all(isinstance(v, str) for v in env.values()), "compose values stay strings"
    for field, local in patcher.WORKER_SETTINGS:
        key = f"INVOICE_MAILER_{field.upper()}"
        if field == "metrics_host":
            assert env[key] == "0.0.0.0"
        elif field == "metrics_port":
            assert env[key] == str(deploy.CONTAINER_METRICS_PORT)
        else:
            assert env[key] == local.format(lane="billing", metrics_port=""), key
    [port] = service["ports"]
    address, published, target = port.split(":")
    assert address == "127.0.0.1" and target == env["INVOICE_MAILER_METRICS_PORT"]
    others = {p.split(":")[-2] for s in services.values() if s is not service for p in s["ports"]}
    assert published not in others


def test_compose_keeps_its_comments_and_the_existing_service(host: Path) -> None:
    before = (REFERENCE_HOST / COMPOSE_FULL).read_text(encoding="utf-8")
    after = (host / COMPOSE_FULL).read_text(encoding="utf-8")
    assert after.startswith(before + "\n  invoice-mailer:\n")
    assert not after.endswith("\n\n")


# --- idempotence -----------------------------------------------------------------------------


def test_fragments_applied_again_change_nothing(host: Path, tmp_path: Path) -> None:
    copy = tmp_path / "again"
    shutil.copytree(host, copy, symlinks=True)
    before = _snapshot(copy)
    for answers in WORKERS:
        spec = patcher.Spec.from_answers(
            yaml.safe_load(
                (copy / f"workers/{answers['worker_name']}/.copier-answers.yml").read_text()
            )
        )
        assert patcher.check_host(copy, spec) == []
        assert patcher.apply(copy, spec) == []
    assert _snapshot(copy) == before


@pytest.mark.parametrize("path", [STAGING, PRODUCTION, COMPOSE_FULL])
def test_each_deploy_edit_twice_is_byte_identical(path: str) -> None:
    spec = SECOND_SPEC
    [edit] = [e for e in deploy.fragments(spec, patcher.WORKER_SETTINGS) if e.path == path]
    original = (REFERENCE_HOST / path).read_text(encoding="utf-8")
    once = edit.edit(original)
    assert once != original
    assert edit.edit(once) == once
    assert edit.edit(once) is once, "an edit that finds its entry returns the text it got"


# --- refusals -----------------------------------------------------------------------------

REFUSALS = [
    (
        STAGING,
        "    strategy:\n      matrix:\n        image: [api]\n",
        "",
        f"{STAGING}: no job with a `strategy.matrix.image` list",
    ),
    (
        STAGING,
        "file: deployment/docker/${{ matrix.image }}.Dockerfile",
        "file: deployment/docker/api.Dockerfile",
        (
            f"{STAGING}: no job with a `strategy.matrix.image` list builds "
            "`deployment/docker/${{ matrix.image }}.Dockerfile`"
        ),
    ),
    (
        PRODUCTION,
        "    strategy:\n      matrix:\n        image: [api]\n",
        "",
        f"{PRODUCTION}: no job with a `strategy.matrix.image` list",
    ),
    (
        "deployment/terraform/environments/staging/main.tf",
        'variable "autoscaling_enabled" {',
        'variable "scaling" {',
        'deployment/terraform/environments/staging: no `variable "autoscaling_enabled"`',
    ),
    (
        "deployment/terraform/environments/production/main.tf",
        'resource "aws_sns_topic" "alarms" {',
        'resource "aws_sns_topic" "alerts" {',
        'deployment/terraform/environments/production: no `resource "aws_sns_topic" "alarms"`',
    ),
    (
        "deployment/terraform/environments/staging/main.tf",
        "  shared_secrets = {",
        "  secrets = {",
        "deployment/terraform/environments/staging: no local `shared_secrets`",
    ),
    (
        f"{MODULE_DIR}/variables.tf",
        'variable "deployment_maximum_percent" {',
        'variable "max_percent" {',
        f'{MODULE_DIR}: no `variable "deployment_maximum_percent"`',
    ),
    (
        f"{MODULE_DIR}/outputs.tf",
        'output "log_group_name" {',
        'output "logs" {',
        f'{MODULE_DIR}: no `output "log_group_name"` (the worker module reads it)',
    ),
]


@pytest.mark.parametrize(("path", "old", "new", "expected"), REFUSALS)
def test_host_without_the_structure_is_refused_before_writing(
    fresh_host: Path,
    template_repo: Path,
    path: str,
    old: str,
    new: str,
    expected: str,
) -> None:
    target = fresh_host / path
    text = target.read_text(encoding="utf-8")
    assert old in text
    target.write_text(text.replace(old, new), encoding="utf-8")
    commit_all(fresh_host, "break the host")
    with pytest.raises(UserMessageError) as caught:
        copy_template(template_repo, fresh_host, "v0.0.2", **FIRST)
    assert expected in str(caught.value)
    assert tree_state(fresh_host) == "", "a refused copy must leave the tree untouched"


def test_compose_without_services_is_named_for_a_container_worker(fresh_host: Path) -> None:
    (fresh_host / COMPOSE_FULL).write_text("# nothing here yet\nvolumes: {}\n", encoding="utf-8")
    spec = dataclasses.replace(SECOND_SPEC, namespace_absent=True)
    problems = patcher.check_host(fresh_host, spec)
    assert f"{COMPOSE_FULL}: no top-level `services` mapping" in problems
    without = dataclasses.replace(spec, container=False)
    assert patcher.check_host(fresh_host, without) == []


# --- the image --------------------------------------------------------------------------------


def _dockerfile(host: Path, answers: dict[str, Any]) -> str:
    path = host / f"deployment/docker/{answers['worker_name']}.Dockerfile"
    assert path.is_file(), f"{path.name} was not rendered"
    return path.read_text(encoding="utf-8")


def _instructions(text: str) -> list[tuple[str, str]]:
    """`(INSTRUCTION, arguments)` per instruction, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("answers", WORKERS, ids=[a["worker_name"] for a in WORKERS])
def test_image_is_linted_non_root_and_checks_healthz(host: Path, answers: dict[str, Any]) -> None:
    text = _dockerfile(host, answers)
    path = f"deployment/docker/{answers['worker_name']}.Dockerfile"
    lint = _run(str(VENV_BIN / "hadolint"), "--no-color", path, cwd=host)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    instructions = _instructions(text)
    last_stage = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    final = instructions[last_stage:]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the final stage sets a USER"
    assert users[-1].split(":")[0] not in {"root", "0"}
    exposed = [rest for word, rest in instructions if word == "EXPOSE"]
    assert exposed == [str(deploy.CONTAINER_METRICS_PORT)], "the metrics port, alone"
    [health] = [rest for word, rest in final if word == "HEALTHCHECK"]
    assert f":{deploy.CONTAINER_METRICS_PORT}/healthz" in health
    # the task definition passes `command = ["serve"]` after the image's entrypoint
    entrypoint = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert entrypoint and answers["worker_name"] in entrypoint[-1]
    assert "serve" not in entrypoint[-1]


SWEEP_S = 30  # the worker's default SWEEP_INTERVAL: one queue stats line per pass


def _held_snapshot_lines(xids_per_s: float, hold_from: float) -> list[dict[str, float]]:
    """The queue stats lines of a worker while one snapshot is held from `hold_from` for
    20 minutes: its transaction-id age grows at the write rate, its age in seconds from the
    first pass that saw it."""
    lines = []
    first_seen = None
    for at in range(int(hold_from) - 300, int(hold_from) + 1200, SWEEP_S):
        held = at >= hold_from
        first_seen = (first_seen or at) if held else None
        lines.append(
            {
                "at": float(at),
                "oldest_snapshot_xid_age": xids_per_s * (at - hold_from) if held else 0.0,
                "oldest_snapshot_age_s": float(at - first_seen) if first_seen else 0.0,
            }
        )
    return lines


@pytest.mark.parametrize("xids_per_s", [50, 300, 3000])
def test_a_held_snapshot_pages_within_12_minutes_whatever_the_write_rate(
    xids_per_s: int, host: Path
) -> None:
    """The rendered worker module's snapshot alarms, evaluated as CloudWatch does
    (`bench/churn.py`, which `make bench-scale` runs on a real hold) on a worker's queue
    stats lines: the earliest fires within 12 minutes of the hold starting, on a quiet
    database and a busy one (an age in transaction ids alone pages after an hour at 300/s)."""
    hold_from = 1_000_017.0  # not aligned to a period
    lines = _held_snapshot_lines(xids_per_s, hold_from)
    fired = []
    for resource in ALARMS:
        alarm = alarm_from_module(host, resource)
        samples = [(line["at"], line[alarm.field]) for line in lines]
        if (at := first_alarm_at(samples, alarm)) is not None:
            fired.append(at - hold_from)

    assert fired, "no snapshot alarm fires during a 20-minute hold"
    assert min(fired) <= 12 * 60
