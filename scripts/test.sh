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
# Each test runs once, in its tier:
# - the privileged tier as root: the tests marked #[ignore = "privileged: ..."] (root, network
#   namespaces, containerd, kubectl), --ignored selecting exactly them; --no-fail-fast: one red
#   test binary does not hide the others;
# - beside it, at a lower CPU priority so the privileged tests keep theirs (they mostly wait
#   on processes, namespaces and containerd: ~0.8 of the 2 cores), the unprivileged tier (what
#   plain `cargo test` runs) as the user `nobody`, which proves it needs no root; its output
#   is printed after the privileged tier's;
# - then, alone, the control plane's integration tests once more on the etcd backend (their
#   servers elect a leader with a 3 s renew deadline and exit when they miss it, as upstream's
#   do: not a stream to starve of CPU).
status=0
# The test binaries, listed once now: `cargo test --no-run` would wait for the build directory
# lock that `cargo test` holds while its tests run.
FERRO_TEST_BINARIES=$(mktemp)
export FERRO_TEST_BINARIES
ferro_test_binaries >"$FERRO_TEST_BINARIES"
unprivileged_log=$(mktemp)
(
  renice -n 10 -p "$BASHPID" >/dev/null || true
  scripts/unprivileged-tier.sh
) >"$unprivileged_log" 2>&1 &
unprivileged=$!
cargo test --workspace --no-fail-fast -- --ignored --test-threads 2 || status=$?
echo "== test.sh: privileged tier done at ${SECONDS}s"
wait "$unprivileged" || status=1
echo "== test.sh: unprivileged tier (run beside it) done at ${SECONDS}s:"
cat "$unprivileged_log"
rm -f "$unprivileged_log"
# FERRO_TEST_STORE=etcd gives every test server an etcd of its own (Debian's etcd-server on
# loopback, removed after the test). The binaries the build above made, run from the package
# dir as cargo does (`cargo test -p` would recompile dozens of crates for its own feature set
# first).
etcd_pass=$(mktemp)
awk -F'\t' '$3 == "test" && $1 ~ /\/control-plane$/' "$FERRO_TEST_BINARIES" >"$etcd_pass"
[ -s "$etcd_pass" ] || { echo "etcd pass: no control-plane test binaries found" >&2; status=1; }
while IFS=$'\t' read -r dir bin _; do
  echo "     Running $bin on etcd"
  (cd "$dir" && FERRO_TEST_STORE=etcd "$bin" --include-ignored --test-threads 2) || status=1
done <"$etcd_pass"
rm -f "$etcd_pass" "$FERRO_TEST_BINARIES"
echo "== test.sh: etcd pass done at ${SECONDS}s"
exit "$status"
