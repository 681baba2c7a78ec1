"""Fixtures for the rollout, agent and demo tests (imported by those modules).

The demo model is built once per machine (cached under var/models/demo, see training.models);
a vLLM engine costs ~25 s to start, so the vLLM tests share one per module.
"""

import pytest

from training.models import ensure_demo_model


@pytest.fixture(scope="session")
def demo_model_dir():
    return ensure_demo_model()
