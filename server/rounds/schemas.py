"""Request shapes of the pipeline and round API (docs/rounds.md), strict like the study spec's."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hpo.server.numbers import Integer


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ObjectiveIn(_Request):
    metric: str = Field(default="valid/error_rate", min_length=1, max_length=200)
    mode: Literal["min", "max"] = "min"


class BaselineIn(_Request):
    params: dict[str, Any] = Field(max_length=1000)


class PipelineCreate(_Request):
    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=100_000)
    objective: ObjectiveIn = Field(default_factory=ObjectiveIn)
    trainer: dict[str, Any] = Field(default_factory=dict)
    baseline: BaselineIn


class RoundCreate(_Request):
    goal: str = Field(min_length=1, max_length=100_000)
    kind: Literal["improve", "understand", "exploit"] = "improve"


class RoundReplicas(_Request):
    """`count` new seeds of the candidate and of the baseline configuration."""

    count: Integer = Field(ge=1, le=100)


class RoundDecision(_Request):
    adopt: bool
    note: str = Field(default="", max_length=100_000)
    override: bool = False


class RecipeRequest(_Request):
    """A recipe's options; each recipe reads the ones it knows (docs/rounds.md, "Recipes")."""

    study_id: Integer | None = Field(default=None, ge=1, lt=2**31)
    options: dict[str, Any] = Field(default_factory=dict, max_length=100)
    spec: dict[str, Any] | None = None
