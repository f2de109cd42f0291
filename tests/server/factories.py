"""Spec factories shared by the tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

_EXAMPLE = json.loads((Path(__file__).parents[2] / "examples" / "optimizer-comparison.json").read_text())


def study_spec(**overrides: Any) -> dict[str, Any]:
    """The example spec of docs/spec.md (examples/optimizer-comparison.json) with fields
    replaced."""
    spec = copy.deepcopy(_EXAMPLE)
    spec.update(overrides)
    return spec
