"""The engine renders from `engine/` (docs/decisions/0029): stubs, sources and the rewrite."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest
from conftest import HOST_TESTS, REPO, load_extension

engine = load_extension("engine")
STUB = re.compile(r'\{\{ engine_source\("([^"]+)"\) \}\}')


def stubs() -> dict[Path, str]:
    """Every template stub and the engine path it names."""
    found = {}
    for path in (REPO / "template").rglob("*.py.jinja"):
        match = STUB.fullmatch(path.read_text(encoding="utf-8"))
        if match:
            found[path] = match.group(1)
    return found


def test_every_stub_names_an_engine_file_at_the_path_it_renders_to() -> None:
    named = stubs()
    assert len(named) >= 30
    for stub, source in named.items():
        assert (REPO / "engine" / source).is_file(), stub
        rendered = stub.relative_to(REPO / "template").as_posix().removesuffix(".jinja")
        rendered = re.sub(r"\{% if namespace_absent %\}(\w+)\{% endif %\}", r"\1", rendered)
        assert rendered.replace("{{ host_root }}", "acme") == source


def test_the_engine_holds_no_jinja_and_every_source_is_rendered_or_engine_only() -> None:
    named = set(stubs().values())
    for path in (REPO / "engine").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(REPO / "engine").as_posix()
        # A rendered source is held to test_render's residue rule: an f-string's `{{`
        # reads as an unrendered tag in a host, so it is written another way.
        residue = r"(?<!\$)\{\{|\{%" if rel in named else r"\{\{ |\{% "
        assert not re.search(residue, text), f"{rel}: reads as Jinja residue"
        assert rel in named or "/tests/" in f"/{rel}", f"{rel}: no stub renders it"


def test_a_host_receives_the_contract_and_the_seeds_cases_and_no_other_engine_test() -> None:
    rendered = {
        source
        for source in stubs().values()
        if "/tests/" in f"/{source}" and not source.startswith("workers/runtime/src/")
    }
    assert rendered == HOST_TESTS


def test_the_rewrite_moves_the_root_and_its_prefix_and_nothing_else() -> None:
    source = (
        "from acme.om.work import rules\n"
        'ENV = "ACME_TEST_ADMIN_URL"\n'
        'NAME = "acme-test"\n'
        'ROLE = "acme_app"  # a word that only starts with the root\n'
        "macme = 1\n"
    )
    assert engine.rewrite_root(source, "zeta") == (
        "from zeta.om.work import rules\n"
        'ENV = "ZETA_TEST_ADMIN_URL"\n'
        'NAME = "zeta-test"\n'
        'ROLE = "acme_app"  # a word that only starts with the root\n'
        "macme = 1\n"
    )


def test_a_stub_renders_the_source_verbatim_braces_included() -> None:
    env = jinja2.Environment(keep_trailing_newline=True, extensions=[engine.EngineSourceExtension])
    braced = [
        (stub, source)
        for stub, source in stubs().items()
        if "{" in (REPO / "engine" / source).read_text(encoding="utf-8")
    ]
    assert braced
    for stub, source in braced:
        rendered = env.from_string(stub.read_text(encoding="utf-8")).render(host_root="zeta")
        text = (REPO / "engine" / source).read_text(encoding="utf-8")
        assert rendered == engine.rewrite_root(text, "zeta"), stub
    with pytest.raises(ValueError, match="outside engine/"):
        env.from_string('{{ engine_source("../copier.yml") }}').render(host_root="x")
