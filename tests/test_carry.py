"""extensions/carry.py: a user's edits of a worker's settings and container, carried into
the shapes release v0.2.0 gives them (docs/decisions/0017). Source text in, source out;
tests/test_runtime_move.py runs the same over real template history."""

from __future__ import annotations

import ast

import pytest
from conftest import load_extension

carry = load_extension("carry")

OLD_SETTINGS = '''"""Settings."""

from __future__ import annotations

import re

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from acme.infra.settings import InfraSettings

RESERVED_CONNECTIONS = {"claim": 1, "sweep": 1}
_LANE = re.compile(r"^[a-z]+$")


class WorkerSettings(BaseSettings):
    """The worker's settings."""

    model_config = SettingsConfigDict(env_prefix="X_", extra="ignore", frozen=True)

    lane: str = "default"
    capacity: int = Field(default=4, ge=1, description="items handled at once")
    infra: InfraSettings = Field(default_factory=InfraSettings)

    @field_validator("lane")
    @classmethod
    def _lane_is_snake_case(cls, value: str) -> str:
        if not _LANE.fullmatch(value):
            raise ValueError("lane must be snake_case")
        return value
'''

NEW_SETTINGS = '''"""The worker's settings."""

from __future__ import annotations

from typing import ClassVar

from pydantic_settings import SettingsConfigDict

from acme.workers.runtime.settings import Count, RuntimeSettings

PREFIX = "X_"


class WorkerSettings(RuntimeSettings):
    """The worker's settings under `PREFIX`."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", frozen=True)
    service_name: ClassVar[str] = "x"

    lane: str = "default"
    capacity: Count = 10
'''

OLD_CONTAINER = '''"""Container."""

from __future__ import annotations

from acme.om.root import Managers
from acme.om.work.types.handler import WorkHandlerInterface
from acme.om.work.types.work_item import WorkKind
from acme.workers.x.handler import XHandlerImpl


def _handlers(managers: Managers) -> dict[WorkKind, WorkHandlerInterface]:
    handler = XHandlerImpl(audit=managers.audit)
    return {WorkKind.X: handler}


def parked_record_resumers(managers: Managers) -> dict[str, object]:
    return {}
'''

NEW_CONTAINER = '''"""Container."""

from __future__ import annotations

from acme.om.root import Managers
from acme.om.work.types.handler import WorkHandlerInterface
from acme.om.work.types.work_item import WorkKind
from acme.workers.runtime.container import RuntimeContainer

from .handler import XHandlerImpl


class WorkerContainer(RuntimeContainer):
    """The engine's container with this worker's handlers."""

    @staticmethod
    def make_handlers(managers: Managers) -> dict[WorkKind, WorkHandlerInterface]:
        """The handler of each kind this worker runs."""
        handler = XHandlerImpl(
            audit=managers.audit,
        )
        return {WorkKind.X: handler}
'''


def test_an_unedited_file_has_nothing_to_carry() -> None:
    assert carry.settings_edits(OLD_SETTINGS, OLD_SETTINGS).empty
    assert carry.container_edits(OLD_CONTAINER, OLD_CONTAINER).empty


def test_a_changed_default_and_a_new_field_land_in_the_new_class_with_their_imports() -> None:
    user = (
        OLD_SETTINGS.replace("default=4,", "default=6,")
        .replace(
            "    infra: InfraSettings = Field(default_factory=InfraSettings)\n",
            "    infra: InfraSettings = Field(default_factory=InfraSettings)\n"
            "    smtp_timeout: timedelta = timedelta(seconds=5)\n",
        )
        .replace("import re\n", "import re\nfrom datetime import timedelta\n")
    )

    edits = carry.settings_edits(OLD_SETTINGS, user)
    out = carry.apply_settings(NEW_SETTINGS, edits, "acme", 100)

    ast.parse(out)
    assert (
        '    capacity: int = Field(default=6, ge=1, description="items handled at once")\n' in out
    )
    assert "    capacity: Count = 10" not in out
    assert out.rstrip().endswith("smtp_timeout: timedelta = timedelta(seconds=5)")
    # the imports, in isort's sections and order: stdlib, third party, the host's
    assert (
        "from __future__ import annotations\n\n"
        "from datetime import timedelta\nfrom typing import ClassVar\n\n"
        "from pydantic import Field\nfrom pydantic_settings import SettingsConfigDict\n\n"
        "from acme.workers.runtime.settings import Count, RuntimeSettings\n"
    ) in out


def test_a_new_validator_comes_with_its_decorators() -> None:
    user = OLD_SETTINGS + (
        '\n    @field_validator("capacity")\n    @classmethod\n'
        "    def _even(cls, value: int) -> int:\n        return value\n"
    )
    out = carry.apply_settings(NEW_SETTINGS, carry.settings_edits(OLD_SETTINGS, user), "acme", 100)
    assert '    @field_validator("capacity")\n    @classmethod\n    def _even(' in out
    assert "from pydantic import field_validator" in out


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (('"sweep": 1}', '"sweep": 2}'), "`RESERVED_CONNECTIONS`"),
        (('r"^[a-z]+$"', 'r"^[a-z_]+$"'), "`_LANE`"),
        (('    lane: str = "default"\n', ""), "`WorkerSettings.lane`"),
    ],
    ids=["engine-constant", "engine-regex", "removed-field"],
)
def test_an_edit_of_what_the_engine_owns_now_is_refused_by_name(
    change: tuple[str, str], named: str
) -> None:
    with pytest.raises(carry.Unsupported, match=named):
        carry.settings_edits(OLD_SETTINGS, OLD_SETTINGS.replace(*change))


def test_a_member_that_uses_an_old_module_constant_is_refused() -> None:
    user = OLD_SETTINGS.replace(
        '    lane: str = "default"\n',
        '    lane: str = "default"\n    slots: int = len(RESERVED_CONNECTIONS)\n',
    )
    with pytest.raises(carry.Unsupported, match="`RESERVED_CONNECTIONS`, which this file"):
        carry.settings_edits(OLD_SETTINGS, user)


def test_the_handler_factory_body_becomes_make_handlers_with_its_imports() -> None:
    user = OLD_CONTAINER.replace(
        "    handler = XHandlerImpl(audit=managers.audit)\n",
        "    audit: AuditManagerInterface = managers.audit  # ours\n"
        "    handler = XHandlerImpl(audit=audit)\n",
    ).replace(
        "from acme.om.root import Managers\n",
        "from acme.om.audit import AuditManagerInterface\nfrom acme.om.root import Managers\n",
    )

    out = carry.apply_container(
        NEW_CONTAINER, carry.container_edits(OLD_CONTAINER, user), "acme", 100
    )

    ast.parse(out)
    assert (
        '        """The handler of each kind this worker runs."""\n'
        "        audit: AuditManagerInterface = managers.audit  # ours\n"
        "        handler = XHandlerImpl(audit=audit)\n"
        "        return {WorkKind.X: handler}\n"
    ) in out
    assert (
        "from acme.om.audit import AuditManagerInterface\nfrom acme.om.root import Managers\n"
        in out
    )
    assert out.count("XHandlerImpl\n") == 1, "the handler's import is not added twice"


def test_an_edit_of_the_containers_engine_part_is_refused() -> None:
    user = OLD_CONTAINER.replace("    return {}\n", "    return {'mine': object()}\n")
    with pytest.raises(
        carry.Unsupported, match="`parked_record_resumers`, which moves into the engine"
    ):
        carry.container_edits(OLD_CONTAINER, user)


def test_an_import_line_past_the_line_length_is_wrapped_as_ruff_would() -> None:
    user = OLD_SETTINGS.replace("default=4,", "default=6,")
    edits = carry.settings_edits(OLD_SETTINGS, user)
    edits.imports.append("from acme.workers.runtime.settings import Port")
    out = carry.apply_settings(NEW_SETTINGS, edits, "acme", 60)
    assert (
        "from acme.workers.runtime.settings import (\n    Count,\n    Port,\n    RuntimeSettings,\n)"
    ) in out
