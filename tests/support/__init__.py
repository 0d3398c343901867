"""What the tests share: servers they start, contracts several backends pass, reference models
and Hypothesis strategies (see tests/README.md). Imported as ``support.<module>``: pytest puts
``tests/`` on ``sys.path`` (``pythonpath`` in pyproject.toml)."""
