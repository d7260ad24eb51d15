#!/usr/bin/env bash
# Proves the unprivileged tier: every test binary of the workspace runs as the unprivileged
# user `nobody`, without --include-ignored (what plain `cargo test` runs), and must pass. A
# test that needs root and is not marked #[ignore = "privileged: ..."] fails here.
# Uses the binaries `cargo test --no-run` built (no second build); run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
user=${FERRO_UNPRIVILEGED_USER:-nobody}
target=${CARGO_TARGET_DIR:-target}
list=$(mktemp)
trap 'rm -f "$list"' EXIT
# (scripts/test.sh lists them once in $FERRO_TEST_BINARIES)
if [ -n "${FERRO_TEST_BINARIES:-}" ]; then
  cut -f1,2 "$FERRO_TEST_BINARIES" >"$list"
else
  ferro_test_binaries | cut -f1,2 >"$list"
fi
[ -s "$list" ] || { echo "unprivileged-tier: no test binaries found" >&2; exit 1; }
# the user must reach the binaries (and the paths above them)
chmod o+rx "$target" "$target/debug" "$target/debug/deps" 2>/dev/null || true
chmod o+rx $(cut -f2 "$list")
failed=0
while IFS=$'\t' read -r dir bin; do
  if ! (cd "$dir" && runuser -u "$user" -- env HOME=/tmp "$bin" -q >/tmp/unprivileged-tier.out 2>&1); then
    echo "unprivileged-tier: FAILED as $user: $bin" >&2
    grep -E -A12 "^test .*FAILED|panicked at|^---- " /tmp/unprivileged-tier.out | head -200 >&2 || tail -20 /tmp/unprivileged-tier.out >&2
    failed=1
  fi
done <"$list"
rm -f /tmp/unprivileged-tier.out
[ "$failed" = 0 ] && echo "unprivileged-tier: $(wc -l <"$list") test binaries pass as $user"
exit "$failed"
