"""Names of the oracle suites, importable without torch.

The command line builds its help text from these before any model work starts (`dlm models` must
not import torch); `dlm.tasks.oracle_tasks` refuses to import if its registry and this list differ.
"""
ORACLE_SUITE_NAMES: tuple[str, ...] = (
    "oracle-permutation", "oracle-hmm", "oracle-pivot", "oracle-keyed", "oracle-runs", "oracle-schedules",
)
