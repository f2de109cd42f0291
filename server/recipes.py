"""Recipes on a round (docs/rounds.md, "Recipes"): none are defined yet; a round lists none."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session


def recipe_views(session: Session, round_id: int) -> list[dict[str, Any]]:
    """The round's recipes with their readouts (none yet)."""
    return []
