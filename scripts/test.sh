#!/usr/bin/env bash
# Runs the whole test suite: unit tests, and integration tests against the real binaries with
# kubectl. Needs root (tests that build network namespaces fail, never skip, without it).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
ferro_require_root
ferro_install_deps
# One build from scratch (CI's case): incremental compilation only costs time and several GB
# of disk there. Set CARGO_INCREMENTAL=1 to keep it for repeated local runs.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
cargo build --workspace --all-targets
# Where CI's time goes (the brief's budget is 45 minutes on 2 cores): each phase's end, in
# seconds since the start.
echo "== test.sh: deps and build done at ${SECONDS}s"
# Each test runs once, in its tier, in two streams at the same time (CPU is the limit on 2
# cores, and the privileged tests mostly wait on processes, namespaces and containerd):
# - the privileged tier as root: the tests marked #[ignore = "privileged: ..."] (root, network
#   namespaces, containerd, kubectl), --ignored selecting exactly them; --no-fail-fast: one red
#   test binary does not hide the others;
# - beside it, at a lower CPU priority so the privileged tests keep theirs: the control plane's
#   integration tests once more on the etcd backend, then the unprivileged tier (what plain
#   `cargo test` runs) as the user `nobody`, which proves it needs no root.
# The second stream's output is printed after the first's.
status=0
# The test binaries, listed once now: `cargo test --no-run` would wait for the build directory
# lock that the first stream's `cargo test` holds while its tests run.
FERRO_TEST_BINARIES=$(mktemp)
export FERRO_TEST_BINARIES
ferro_test_binaries >"$FERRO_TEST_BINARIES"
background_log=$(mktemp)
(
  renice -n 10 -p "$BASHPID" >/dev/null || true
  bg_status=0
  # FERRO_TEST_STORE=etcd gives every test server an etcd of its own (Debian's etcd-server on
  # loopback, removed after the test). The binaries the build above made, run from the
  # package dir as cargo does (`cargo test -p` would recompile dozens of crates for its own
  # feature set first).
  etcd_pass=$(mktemp)
  awk -F'\t' '$3 == "test" && $1 ~ /\/control-plane$/' "$FERRO_TEST_BINARIES" >"$etcd_pass"
  [ -s "$etcd_pass" ] || { echo "etcd pass: no control-plane test binaries found" >&2; bg_status=1; }
  while IFS=$'\t' read -r dir bin _; do
    echo "     Running $bin on etcd"
    (cd "$dir" && FERRO_TEST_STORE=etcd "$bin" --include-ignored --test-threads 2) || bg_status=1
  done <"$etcd_pass"
  rm -f "$etcd_pass"
  echo "== test.sh: etcd pass done at ${SECONDS}s"
  scripts/unprivileged-tier.sh || bg_status=1
  echo "== test.sh: unprivileged tier done at ${SECONDS}s"
  exit "$bg_status"
) >"$background_log" 2>&1 &
background=$!
cargo test --workspace --no-fail-fast -- --ignored --test-threads 2 || status=$?
echo "== test.sh: privileged tier done at ${SECONDS}s"
wait "$background" || status=1
echo "== test.sh: the etcd pass and the unprivileged tier (run beside it):"
cat "$background_log"
rm -f "$background_log" "$FERRO_TEST_BINARIES"
exit "$status"
