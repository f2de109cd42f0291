"""The common metrics body decoded in one C pass (msgspec), for the hot path of ingest.

`MetricsIn.model_validate_json` calls two Python validators per point (`"NaN"` strings, `7.0` as
a step): 3.5 us a point, most of a batch's server time. `PointsBody` takes the common body only:
finite JSON numbers as values, integer steps, no extra fields, the same bounds as `MetricsIn`.
What it does not take (a `"NaN"` string, a `7.0` step, an error) is decoded by `MetricsIn`, which
accepts the rest and words every 422, so the API answers exactly as before. Whatever
`PointsBody` takes, `MetricsIn` takes too, with the same values: JSON numbers only (msgspec
refuses NaN literals and numbers past a double, which `MetricsIn` turns into infinity or refuses),
lengths counted in characters by both, the last of duplicated keys kept by both."""

from __future__ import annotations

from typing import Annotated

import msgspec

from hpo.server.schemas import MetricsIn


class PointIn(msgspec.Struct, forbid_unknown_fields=True):
    step: Annotated[int, msgspec.Meta(ge=0, lt=2**31)]
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    value: float


class PointsBody(msgspec.Struct, forbid_unknown_fields=True):
    lease_id: Annotated[str, msgspec.Meta(min_length=1, max_length=36)]
    points: Annotated[list[PointIn], msgspec.Meta(max_length=100_000)]


_POINTS = msgspec.json.Decoder(PointsBody)


def metrics_body(raw: bytes) -> PointsBody | MetricsIn:
    """The body of `POST /trials/{id}/metrics`; pydantic's `ValidationError` when it is not one."""
    try:
        return _POINTS.decode(raw)
    except msgspec.MsgspecError:
        return MetricsIn.model_validate_json(raw)
