#!/usr/bin/env bash
# Mutation testing of the decision code (issue 42; docs/testing.md, "Mutation testing"). Not run in CI.
#   scripts/mutation_report.sh run [GROUP ...] [--minutes N]   test the mutants not yet tested, group by group
#   scripts/mutation_report.sh report [GROUP ...] [--sample N]   the per-group table (of the sample of N)
#   scripts/mutation_report.sh survivors GROUP                 each surviving mutant with its diff
#   scripts/mutation_report.sh kills PATTERN TEST...           which mutants some test files kill (quick check)
# run options: --sample N (N random mutants per group; --seed S for a fresh draw), --minutes N, --tests-ref COMMIT, --retest-survivors.
# Groups: unmasking contract driver masked_loop uniform_noise block_window solvers caching kernels (default: all).
# Needs mutmut 3 (pip install -e '.[mutation]'). Runs at low priority with one worker; MUTATION_JOBS=N for
# more, MUTATION_DIR for another work folder (default .mutation/, git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
exec nice -n "${MUTATION_NICE:-15}" python scripts/mutation_report.py "$@"
