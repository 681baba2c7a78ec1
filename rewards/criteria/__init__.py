"""The built-in criterion kinds; importing this package registers them all."""

from rewards.criteria import answers, efficiency, maths, numbers, structure  # noqa: F401
