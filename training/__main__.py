"""``python -m training run spec.json`` (see `training.cli`)."""

from training.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
