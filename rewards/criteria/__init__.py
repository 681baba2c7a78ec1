"""The built-in criterion kinds; importing this package registers them all."""

from rewards.criteria import (  # noqa: F401
    answers,
    code,
    efficiency,
    maths,
    mesh,
    models,
    numbers,
    structure,
    terminal,
    user,
)
