"""The one validation layer for external input, on pydantic v2.

Policy arguments (policies/registry.py), profiles (sim/hardware/profile.py), `sim run` flags
(sim/commands/run.py), trace metadata (traces/schema.py) and importer records
(traces/importers/common.py) each declare a pydantic model or type; `validated`
checks data against it and turns the first problem into the project's one-line
error (InputError, or the caller's error type) naming where and which field, so the
CLI exits 2 before anything runs. Floats are finite everywhere (allow_inf_nan off):
no input here has a use for NaN or infinity.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, TypeAdapter, ValidationError

from agentsim.errors import InputError

FINITE = ConfigDict(allow_inf_nan=False, extra="allow")


class Model(BaseModel):
    """Base of the input models: finite floats; unknown keys are kept (profiles and
    metadata carry provenance the simulator does not read)."""

    model_config = FINITE


def _number_not_text(v: Any) -> Any:
    # JSON files must hold numbers as numbers: "0.01" or true for a count is a typo
    if isinstance(v, (str, bool)):
        raise ValueError("should be a number, not " + ("text" if isinstance(v, str) else "a boolean"))
    return v


def _bool_not_text(v: Any) -> Any:
    if not isinstance(v, bool):
        raise ValueError("should be true or false")
    return v


JSONInt = Annotated[int, BeforeValidator(_number_not_text)]
JSONFloat = Annotated[float, BeforeValidator(_number_not_text)]
JSONBool = Annotated[bool, BeforeValidator(_bool_not_text)]


def describe(e: ValidationError) -> str:
    """The first problem as "field 'a.b' is X: message"."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"field '{loc}' is missing"
    shown = repr(err.get("input"))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return (f"field '{loc}' is {shown}: {msg}" if loc else f"{shown}: {msg}")


def validated(model, data: Any, where: str, fix: str = "", error: type[Exception] = InputError):
    """`model` (a BaseModel class or a TypeAdapter) applied to `data`, else `error`
    with one line: "<where>: field '<f>' is <value>: <problem>[; <fix>]"."""
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(data)
        return model.model_validate(data)
    except ValidationError as e:
        raise error(f"{where}: {describe(e)}" + (f"; {fix}" if fix else "")) from None
