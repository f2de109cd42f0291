"""The README and docs/ link only inside the repository, and every such link resolves: a user of
the repository has nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "trainer" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_stay_inside_the_repository_and_resolve(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        resolved = (page.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(REPO), f"{page.name} links outside the repository: {target}"
        assert resolved.exists(), f"{page.name} links to a missing file: {target}"


def test_the_reference_pages_exist() -> None:
    for name in ("spec.md", "api.md", "cli.md", "settings.md", "worker-protocol.md", "workers.md"):
        assert (REPO / "docs" / name).is_file(), name
    spec = (REPO / "docs" / "spec.md").read_text()
    assert "**`num_trials` counts trials per arm.**" in spec


def test_every_spec_field_is_documented() -> None:
    from hpo.server.spec.model import Hyperparameter, Objective, Resources, StudySpec, TrainerSettings

    spec = (REPO / "docs" / "spec.md").read_text()
    for model in (StudySpec, Objective, Hyperparameter, Resources, TrainerSettings):
        for field in model.model_fields:
            assert f"`{field}`" in spec, f"docs/spec.md does not document {model.__name__}.{field}"


def test_every_command_is_documented() -> None:
    import argparse

    from hpo.cli import build_parser

    cli = (REPO / "docs" / "cli.md").read_text()
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in commands.choices.items():
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for sub in subs[0].choices if subs else [None]:
            shown = f"hpo {name}" + (f" {sub}" if sub else "")
            assert f"`{shown}" in cli, f"docs/cli.md does not document `{shown}`"


def test_every_setting_is_documented() -> None:
    settings = (REPO / "docs" / "settings.md").read_text()
    sources = (REPO / "hpo" / "settings.py", REPO / "hpo" / "policy.py", REPO / "server" / "config.py")
    source = "".join(path.read_text() for path in sources)
    for name in set(re.findall(r"HPO_[A-Z_]+", source)):
        assert f"`{name}`" in settings, f"docs/settings.md does not document {name}"
