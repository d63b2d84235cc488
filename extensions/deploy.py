"""The worker's deployment fragments: the deploy workflows and the local compose file.

docs/host-contract.md, Deployment: the staging workflow builds the worker's image, pushes it under the
commit and records its digest by commit; the production workflow promotes that digest for
the release commit and never rebuilds; with `container: true` the worker also runs as a
container in `deployment/local/docker-compose.full.yml`. Both workflows already do this for
every name in their image matrix (`strategy.matrix.image`), so the worker's fragment is one
entry in each such list; the compose fragment is one service. The per-environment Terraform
is not a fragment: copier renders `deployment/terraform/environments/<env>/worker_<module>.tf`
for this worker alone (an instance of `deployment/terraform/modules/worker`, rendered with
the namespace owner), and `check_terraform` makes sure the host declares everything those
files refer to.

Edits are structural (ruamel.yaml round-trip: comments, quotes, flow lists and the file's
indentation kept) and idempotent: an edit that finds its entry returns the text it was given,
byte for byte. A file without the structure an edit needs raises `Missing`, whose message is
`<file>: <the missing part>`; the host patcher (extensions/patcher.py) turns it into its own
refusal, before any file is written when called from the precondition check.

Loaded by file path from the patcher, so it imports nothing of the template's own.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

STAGING_WORKFLOW = ".github/workflows/deploy-staging.yml"
PRODUCTION_WORKFLOW = ".github/workflows/deploy-production.yml"
COMPOSE_FULL = "deployment/local/docker-compose.full.yml"
ENVIRONMENTS = ("staging", "production")
TERRAFORM = "deployment/terraform"
SERVICE_MODULE = f"{TERRAFORM}/modules/service"
WORKER_MODULE = f"{TERRAFORM}/modules/worker"

# prettier's default line width: an image list written past it goes one entry a line
# (docs/updating.md, "Formatters").
PRETTIER_WIDTH = 80
_FLOW_IMAGES = re.compile(r"^\s*image:\s*\[")
# The build step of the staging workflow names the image's Dockerfile by the matrix entry.
DOCKERFILE_BY_MATRIX = re.compile(r"deployment/docker/\$\{\{\s*matrix\.image\s*\}\}\.Dockerfile")
# The port /metrics and /healthz listen on inside the worker's container (the image's only
# EXPOSE, and the default of the worker module's `metrics_port`).
CONTAINER_METRICS_PORT = 9100
# The first host port a worker container's metrics are published on; each next one takes
# the lowest port from here that no service of the compose file publishes yet.
HOST_METRICS_PORT_BASE = 9100
# `<ROOT>_*` settings every process shares (InfraSettings, docs/host-contract.md), copied
# into the worker's service from the first service of the compose file that sets them.
INFRA_FIELDS = (
    "DATABASE_URL",
    "REDIS_URL",
    "LOG_LEVEL",
    "LOG_JSON",
    "SENTRY_DSN",
    "OTEL_EXPORTER_ENDPOINT",
)
# Indentation styles tried in turn (mapping, sequence, offset): the first that reproduces
# the file unchanged is the file's own; GitHub's and compose's docs use the first.
_STYLES = ((2, 4, 2), (2, 2, 0), (4, 6, 4), (4, 4, 0))
# The worker's Terraform files, one per environment, in the template (rendered by copier).
_TEMPLATE_ENVIRONMENTS = (
    Path(__file__).resolve().parents[1] / "template" / TERRAFORM / "environments"
)
TEMPLATE_TERRAFORM = _TEMPLATE_ENVIRONMENTS / "{env}" / "worker_{{ worker_module }}.tf.jinja"
# What every worker's instance shares in one environment (`local.worker_platform`), rendered
# once per host with the namespace owner, beside those files.
TEMPLATE_WORKERS_TERRAFORM = (
    _TEMPLATE_ENVIRONMENTS / "{env}" / "{% if namespace_absent %}workers.tf{% endif %}.jinja"
)
# The worker module those files instantiate, rendered once per host with the namespace owner;
# its `module "service"` block is what the host's service module must declare.
TEMPLATE_WORKER_MODULE = (
    Path(__file__).resolve().parents[1]
    / "template"
    / TERRAFORM
    / "modules"
    / "{% if namespace_absent %}worker{% endif %}"
    / "main.tf.jinja"
)


class Missing(Exception):
    """A host file lacks what a deployment fragment needs; str() is `<file>: <missing part>`."""


class SpecLike(Protocol):
    """The answers a fragment reads (extensions/patcher.py `Spec`)."""

    @property
    def worker_name(self) -> str: ...
    @property
    def lane(self) -> str: ...
    @property
    def host_root(self) -> str: ...
    @property
    def container(self) -> bool: ...
    @property
    def namespace_absent(self) -> bool: ...
    @property
    def names(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Edit:
    """One deployment fragment: the host file it edits and the edit (text -> new text)."""

    name: str
    path: str
    edit: Callable[[str], str]


# --- YAML round trip ----------------------------------------------------------------------


def _yaml(style: tuple[int, int, int]) -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    mapping, sequence, offset = style
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    return yaml


def _dump(yaml: YAML, data: Any) -> str:
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def load(text: str, where: str) -> tuple[YAML, Any]:
    """Parse `text` for a round trip; returns the YAML instance holding the file's style.

    Raises `Missing` when the text is not YAML or not a mapping at the top.
    """
    chosen: tuple[YAML, Any] | None = None
    for style in _STYLES:
        yaml = _yaml(style)
        try:
            data = yaml.load(text)
        except YAMLError as exc:
            raise Missing(f"{where}: does not parse as YAML ({exc.__class__.__name__})") from exc
        if not isinstance(data, CommentedMap):
            raise Missing(f"{where}: the top level is not a mapping")
        if chosen is None:
            chosen = (yaml, data)
        if _dump(yaml, data) == text:
            return yaml, data
    assert chosen is not None
    return chosen


# --- the deploy workflows ------------------------------------------------------------------


def image_matrices(workflow: Any, where: str) -> list[tuple[str, CommentedSeq]]:
    """Every job of a workflow with a `strategy.matrix.image` list: `(job id, the list)`.

    Raises `Missing` when the workflow has no `jobs` mapping or no such job.
    """
    jobs = workflow.get("jobs")
    if not isinstance(jobs, dict):
        raise Missing(f"{where}: no `jobs` mapping")
    found = []
    for job_id, job in jobs.items():
        strategy = job.get("strategy") if isinstance(job, dict) else None
        matrix = strategy.get("matrix") if isinstance(strategy, dict) else None
        images = matrix.get("image") if isinstance(matrix, dict) else None
        if isinstance(images, CommentedSeq):
            found.append((str(job_id), images))
    if not found:
        raise Missing(
            f"{where}: no job with a `strategy.matrix.image` list (the images it deploys)"
        )
    return found


def _job_text(job: Any) -> str:
    """The job's steps as one string, to find what they name (a Dockerfile, a digest)."""
    steps = job.get("steps") if isinstance(job, dict) else None
    return repr(list(steps)) if isinstance(steps, list) else ""


def builder_jobs(workflow: Any, where: str) -> list[str]:
    """The jobs that build `deployment/docker/${{ matrix.image }}.Dockerfile` over an image matrix.

    Raises `Missing` when there is none: the staging workflow must build every listed image.
    """
    jobs = [
        job_id
        for job_id, _ in image_matrices(workflow, where)
        if DOCKERFILE_BY_MATRIX.search(_job_text(workflow["jobs"][job_id]))
    ]
    if not jobs:
        raise Missing(
            f"{where}: no job with a `strategy.matrix.image` list builds "
            "`deployment/docker/${{ matrix.image }}.Dockerfile`"
        )
    return jobs


def add_image(text: str, image: str, where: str, *, builds: bool) -> str:
    """`image` appended to every `strategy.matrix.image` list of a workflow (once).

    With `builds`, the workflow must also build each listed image from its Dockerfile.
    Returns `text` itself when every list already names the image.
    """
    yaml, data = load(text, where)
    matrices = image_matrices(data, where)
    if builds:
        builder_jobs(data, where)
    changed = False
    for _, images in matrices:
        if image not in [str(entry) for entry in images]:
            images.append(image)
            changed = True
    if not changed:
        return text
    out = _dump(yaml, data)
    if any(len(line) > PRETTIER_WIDTH and _FLOW_IMAGES.match(line) for line in out.splitlines()):
        for _, images in matrices:  # prettier would wrap the line, and the next round trip
            images.fa.set_block_style()  # would join it again: a block list stays as it is
        out = _dump(yaml, data)
    return out


def edit_staging(text: str, spec: SpecLike) -> str:
    """`deploy-staging.yml`: the worker's image built, pushed under the commit, its digest recorded."""
    return add_image(text, spec.worker_name, STAGING_WORKFLOW, builds=True)


def edit_production(text: str, spec: SpecLike) -> str:
    """`deploy-production.yml`: the worker's recorded digest checked and promoted, never rebuilt."""
    return add_image(text, spec.worker_name, PRODUCTION_WORKFLOW, builds=False)


# --- the local compose file ----------------------------------------------------------------


def _published(port: Any) -> int | None:
    """The host port of one `ports` entry (short `[ip:]host:container` or long syntax)."""
    if isinstance(port, dict):
        value = str(port.get("published") or "")
        return int(value) if value.isdigit() else None
    parts = str(port).split("/")[0].rsplit(":", 2)
    if len(parts) < 2:
        return None
    host = parts[-2]
    return int(host) if host.isdigit() else None


def host_metrics_port(services: dict[str, Any]) -> int:
    """The lowest port from `HOST_METRICS_PORT_BASE` that no service publishes yet."""
    used = {
        published
        for service in services.values()
        if isinstance(service, dict)
        for port in service.get("ports") or []
        if (published := _published(port)) is not None
    }
    port = HOST_METRICS_PORT_BASE
    while port in used:
        port += 1
    return port


def _quoted(value: str) -> str:
    """A string YAML would read as a number, bool or null, quoted so it stays a string."""
    plain = value.lower() in {"true", "false", "yes", "no", "on", "off", "null", "~", ""}
    numeric = re.fullmatch(r"[-+]?(\d[\d_]*)?\.?\d*([eE][-+]?\d+)?", value) is not None
    return DoubleQuotedScalarString(value) if plain or numeric else value


def infra_environment(services: dict[str, Any], root: str) -> dict[str, str]:
    """The shared `<ROOT>_*` settings for a container, as the other services set them.

    Taken from the first service that sets `<ROOT>_DATABASE_URL`; without one, the local
    services of `docker-compose.yml` under the names docs/host-contract.md gives them.
    """
    prefix = root.upper() + "_"
    for service in services.values():
        env = service.get("environment") if isinstance(service, dict) else None
        if isinstance(env, dict) and f"{prefix}DATABASE_URL" in env:
            return {
                f"{prefix}{field}": str(env[f"{prefix}{field}"])
                for field in INFRA_FIELDS
                if f"{prefix}{field}" in env
            }
    return {
        f"{prefix}DATABASE_URL": f"postgresql+asyncpg://{root}_app@postgres:5432/{root}",
        f"{prefix}REDIS_URL": "redis://redis:6379/0",
        f"{prefix}LOG_JSON": "true",
    }


def compose_service(
    spec: SpecLike,
    settings: Sequence[tuple[str, str]],
    services: dict[str, Any],
) -> CommentedMap:
    """The worker's compose service: built from its Dockerfile, every setting, metrics mapped.

    `settings` are the worker's `(field, local value)` pairs (extensions/patcher.py
    `WORKER_SETTINGS`); the metrics listen on all interfaces of the container, on the port
    the image exposes, published on the host's loopback only.
    """
    prefix = spec.names["worker_env_prefix"]
    overrides = {"metrics_host": "0.0.0.0", "metrics_port": str(CONTAINER_METRICS_PORT)}
    environment = CommentedMap()
    for key, value in infra_environment(services, spec.host_root).items():
        environment[key] = _quoted(value)
    for field, value in settings:
        local = overrides.get(field, value.format(lane=spec.lane, metrics_port=""))
        environment[f"{prefix}{field.upper()}"] = _quoted(local)
    published = host_metrics_port(services)
    service = CommentedMap()
    service["build"] = CommentedMap(
        [("context", "../.."), ("dockerfile", f"deployment/docker/{spec.worker_name}.Dockerfile")]
    )
    service["environment"] = environment
    service["ports"] = CommentedSeq(
        [DoubleQuotedScalarString(f"127.0.0.1:{published}:{CONTAINER_METRICS_PORT}")]
    )
    service["depends_on"] = CommentedMap(
        (name, CommentedMap([("condition", "service_healthy")])) for name in ("postgres", "redis")
    )
    return service


def add_compose_service(text: str, spec: SpecLike, settings: Sequence[tuple[str, str]]) -> str:
    """`docker-compose.full.yml`: the worker as a service named `<worker_name>`, once.

    Raises `Missing` without a top-level `services` mapping. Returns `text` itself when the
    service is there already (whatever it holds now: the user owns it from then on).
    """
    yaml, data = load(text, COMPOSE_FULL)
    services = data.get("services")
    if not isinstance(services, CommentedMap):
        raise Missing(f"{COMPOSE_FULL}: no top-level `services` mapping")
    if spec.worker_name in services:
        return text
    services[spec.worker_name] = compose_service(spec, settings, services)
    if len(services) > 1:
        services.yaml_set_comment_before_after_key(spec.worker_name, before="\n")
    return _dump(yaml, data)


# --- the worker's Terraform: what the rendered file needs from the host ---------------------


_BLOCK = re.compile(r"^(variable|resource|module|locals|output|data)\b([^{\n]*)\{", re.MULTILINE)
_LABELS = re.compile(r'"([^"]+)"')
_BLOCK_END = re.compile(r"^\}", re.MULTILINE)


def _blocks(text: str) -> Iterable[tuple[str, list[str], str]]:
    """Top-level blocks of `terraform fmt`ed HCL: (type, labels, body up to the closing `}`)."""
    for match in _BLOCK.finditer(text):
        end = _BLOCK_END.search(text, match.end())
        body = text[match.end() : end.start() if end else len(text)]
        yield match.group(1), _LABELS.findall(match.group(2)), body


def declared(texts: Iterable[str]) -> dict[str, set[str]]:
    """What HCL sources declare: `var` names, `local` names, resources and outputs.

    Keys: `variable`, `local`, `resource` (`<type>.<name>`), `output`. Reads blocks at
    column 0 and attributes at two spaces, the layout `terraform fmt` gives.
    """
    found: dict[str, set[str]] = {
        "variable": set(),
        "local": set(),
        "resource": set(),
        "output": set(),
    }
    for text in texts:
        for kind, labels, body in _blocks(text):
            if kind == "variable" and labels:
                found["variable"].add(labels[0])
            elif kind == "output" and labels:
                found["output"].add(labels[0])
            elif kind == "resource" and len(labels) == 2:
                found["resource"].add(".".join(labels))
            elif kind == "locals":
                found["local"].update(re.findall(r"^  (\w+)\s*=", body, re.MULTILINE))
    return found


def required(template: str, module: str) -> dict[str, set[str]]:
    """What the worker's Terraform template refers to and does not declare itself.

    Keys: `variable`, `local`, `resource` (as `declared`), `input`: the arguments of its
    `module` block, which the service module must declare as variables, and `output`: the
    module's outputs it reads (`module.<name>.<output>`).
    """
    text = template.replace("{{ worker_module }}", module)
    own = declared([text])
    needs = {
        "variable": set(re.findall(r"\bvar\.(\w+)", text)) - own["variable"],
        "local": set(re.findall(r"\blocal\.(\w+)", text)) - own["local"],
        "resource": {
            f"{kind}.{name}"
            for kind, name in re.findall(r"\b(aws_\w+)\.(\w+)\.", text)
            if f"{kind}.{name}" not in own["resource"]
        },
        "input": set(),
        "output": set(re.findall(r"\bmodule\.\w+\.(\w+)", text)),
    }
    for kind, _labels, body in _blocks(text):
        if kind == "module":
            needs["input"].update(
                name for name in re.findall(r"^  (\w+)\s*=", body, re.MULTILINE) if name != "source"
            )
    return needs


def _tf_texts(folder: Path, *, skip: tuple[str, ...] = ()) -> list[str]:
    return [
        p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.tf")) if p.name not in skip
    ]


def check_terraform(host: Path, spec: SpecLike) -> list[str]:
    """Every `<folder>: <missing part>` that keeps the worker's Terraform files from working.

    The rendered `environments/<env>/worker_<module>.tf` and the owner's `workers.tf` beside
    it refer to the environment's shared variables and locals and its alarm topic (the
    host's files, without those two, must declare them); the worker module it instantiates
    (`modules/worker`, the template's) sets the service module's inputs and reads its
    outputs. Each one the host does not declare is named ([] when all are there), and so is
    the worker module itself when this worker does not render it (not the namespace owner).
    """
    module = spec.names["worker_module"]
    problems: list[str] = []
    if not spec.namespace_absent and not (host / WORKER_MODULE / "main.tf").is_file():
        problems.append(
            f"{WORKER_MODULE}: the worker module does not exist (the worker that owns the "
            "work namespace renders it: update that worker first)"
        )
    module_dir = host / SERVICE_MODULE
    service = declared(_tf_texts(module_dir)) if module_dir.is_dir() else None
    inputs = service["variable"] if service else set()
    if not module_dir.is_dir():
        problems.append(f"{SERVICE_MODULE}: the service module does not exist")
    else:
        worker = required(TEMPLATE_WORKER_MODULE.read_text(encoding="utf-8"), module)
        for name in sorted(worker["input"] - inputs):
            problems.append(f'{SERVICE_MODULE}: no `variable "{name}"` (the worker module sets it)')
        for name in sorted(worker["output"] - (service["output"] if service else set())):
            problems.append(f'{SERVICE_MODULE}: no `output "{name}"` (the worker module reads it)')
    for env in ENVIRONMENTS:
        # the worker's file with the shared one (`local.worker_platform`): what the two
        # read from the host's own files
        templates = (TEMPLATE_TERRAFORM, TEMPLATE_WORKERS_TERRAFORM)
        text = "\n".join(
            Path(str(path).replace("{env}", env)).read_text(encoding="utf-8") for path in templates
        )
        needs = required(text, module)
        folder = f"{TERRAFORM}/environments/{env}"
        if not (host / folder).is_dir():
            problems.append(f"{folder}: the environment does not exist")
            continue
        if not spec.namespace_absent and not (host / folder / "workers.tf").is_file():
            problems.append(
                f"{folder}/workers.tf: the workers' shared inputs do not exist (the worker that "
                "owns the work namespace renders them: update that worker first)"
            )
        skip = (f"worker_{module}.tf", "workers.tf")
        have = declared(_tf_texts(host / folder, skip=skip))
        for name in sorted(needs["variable"] - have["variable"]):
            problems.append(f'{folder}: no `variable "{name}"`')
        for name in sorted(needs["local"] - have["local"]):
            problems.append(f"{folder}: no local `{name}` in a `locals` block")
        for name in sorted(needs["resource"] - have["resource"]):
            kind, label = name.split(".")
            problems.append(f'{folder}: no `resource "{kind}" "{label}"`')
    return list(dict.fromkeys(problems))


# --- the plan -----------------------------------------------------------------------------


def fragments(spec: SpecLike, settings: Sequence[tuple[str, str]]) -> list[Edit]:
    """The deployment fragments of one worker, in order (compose only with `container`)."""
    plan = [
        Edit("deploy staging", STAGING_WORKFLOW, lambda text: edit_staging(text, spec)),
        Edit("deploy production", PRODUCTION_WORKFLOW, lambda text: edit_production(text, spec)),
    ]
    if spec.container:
        plan.append(
            Edit(
                "compose service",
                COMPOSE_FULL,
                lambda text: add_compose_service(text, spec, settings),
            )
        )
    return plan
