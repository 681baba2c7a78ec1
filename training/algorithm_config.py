"""`AlgorithmConfig`: the algorithm knobs of a run, declared once, importable without torch.

The run spec embeds it (``training.spec``), so a web process that validates a spec never pays
for torch; ``training.algorithms`` (the torch functions that read it) re-exports it. Every field's
default and range is stated here and nowhere else; its JSON Schema comes from pydantic.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, ValidationError, field_validator, model_validator

from training.validation import SpecModel, error_lines

__all__ = [
    "ADVANTAGE_ESTIMATOR_NAMES",
    "ALGORITHM_PRESETS",
    "KL_ALIASES",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "AlgorithmConfig",
]

LossAggregation = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
PolicyLoss = Literal["ppo", "vanilla_pg"]
KLEstimator = Literal["k1", "k2", "k3", "abs"]
# k1..abs, then verl's names for three of them (KL_ALIASES).
KLEstimatorName = Literal["k1", "k2", "k3", "abs", "kl", "mse", "low_var_kl"]

LOSS_AGGREGATIONS: tuple[str, ...] = get_args(LossAggregation)
POLICY_LOSSES: tuple[str, ...] = get_args(PolicyLoss)
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
KL_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}

# The estimators `training.algorithms` registers; `register_advantage_estimator` adds to this set
# so a config may name an estimator registered later (a name nobody registered is refused).
ADVANTAGE_ESTIMATOR_NAMES: set[str] = {
    "grpo",
    "dr_grpo",
    "dapo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "gae",
}

# Defaults that match what users of verl/TRL/DAPO expect from each name.
ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"advantage_estimator": "grpo", "loss_aggregation": "seq-mean-token-mean"},
    "dr_grpo": {
        "advantage_estimator": "dr_grpo",
        "norm_by_std": False,
        "loss_aggregation": "seq-mean-token-sum-norm",
    },
    "dapo": {
        "advantage_estimator": "dapo",
        "clip_low": 0.2,
        "clip_high": 0.28,
        "loss_aggregation": "token-mean",
        "filter_zero_variance_groups": True,
    },
    "ppo": {
        "advantage_estimator": "gae",
        "loss_aggregation": "token-mean",
        "kl_estimator": "k1",
        "kl_in_reward": True,
        "lam": 0.95,
    },
    "rloo": {"advantage_estimator": "rloo", "loss_aggregation": "token-mean"},
    "reinforce_plus_plus": {
        "advantage_estimator": "reinforce_plus_plus",
        "loss_aggregation": "token-mean",
        "kl_estimator": "k1",
        "kl_in_reward": True,
    },
    "reinforce_plus_plus_baseline": {
        "advantage_estimator": "reinforce_plus_plus_baseline",
        "loss_aggregation": "token-mean",
    },
}


def _expand_preset(data: Any) -> Any:
    """``"dapo"`` or ``{"algorithm": "dapo", ...overrides}`` -> the preset's fields + overrides."""
    if isinstance(data, str):
        data = {"algorithm": data}
    if not isinstance(data, dict) or "algorithm" not in data:
        return data
    data = dict(data)
    name = data.pop("algorithm")
    if name not in ALGORITHM_PRESETS:
        known = ", ".join(sorted(ALGORITHM_PRESETS))
        raise ValueError(f"unknown algorithm {name!r}; known: {known}")
    return {**ALGORITHM_PRESETS[name], **data}


class AlgorithmConfig(SpecModel):
    """The algorithm knobs of a run, with presets for the named algorithms.

    ``kl_coef > 0`` with ``kl_in_reward=False`` adds ``kl_coef * KL`` to the loss (GRPO
    style); with ``kl_in_reward=True`` the loop calls ``apply_kl_in_reward`` before the
    advantages (PPO/REINFORCE++ style). ``entropy_coef > 0`` subtracts
    ``entropy_coef * entropy`` from the loss (a bonus for keeping the policy spread out).
    A spec may give a preset name (``"dapo"``) or ``{"algorithm": "dapo", ...overrides}``.
    """

    advantage_estimator: str = "grpo"
    norm_by_std: bool = True
    policy_loss: PolicyLoss = "ppo"
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.2, ge=0)
    dual_clip: float | None = Field(default=None, gt=1)
    loss_aggregation: LossAggregation = "token-mean"
    constant_normalizer: float | None = Field(default=None, gt=0)
    filter_zero_variance_groups: bool = False
    kl_estimator: KLEstimatorName = "k3"
    kl_coef: float = Field(default=0.0, ge=0)
    kl_in_reward: bool = False
    entropy_coef: float = Field(default=0.0, ge=0)
    gamma: float = Field(default=1.0, ge=0, le=1)
    lam: float = Field(default=1.0, ge=0, le=1)
    value_clip: float | None = Field(default=0.2, ge=0)
    value_loss_coef: float = Field(default=0.5, ge=0)
    epsilon: float = 1e-6

    _presets = model_validator(mode="before")(_expand_preset)

    @field_validator("advantage_estimator")
    @classmethod
    def _known_estimator(cls, value: str) -> str:
        if value not in ADVANTAGE_ESTIMATOR_NAMES:
            known = ", ".join(sorted(ADVANTAGE_ESTIMATOR_NAMES))
            raise ValueError(f"unknown {value!r} (known: {known})")
        return value

    @property
    def needs_value_head(self) -> bool:
        return self.advantage_estimator == "gae"

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> AlgorithmConfig:
        """The defaults of a named algorithm (``ALGORITHM_PRESETS``), with overrides."""
        return cls.from_dict({"algorithm": name, **overrides})

    @classmethod
    def from_dict(cls, data: Any) -> AlgorithmConfig:
        """Builds from a plain dict (an ``algorithm`` key picks a preset first) or a preset name.
        Raises ``ValueError`` naming every bad field (``"clip_low: must be < 1, got 3"``)."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError("invalid algorithm config: " + "; ".join(error_lines(exc))) from None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()
