#!/usr/bin/env bash
# Runs the whole test suite: unit tests, and integration tests against the real binaries with
# kubectl. Needs root (tests that build network namespaces fail, never skip, without it).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
ferro_require_root
ferro_install_deps
cargo build --workspace --all-targets
cargo test --workspace -- --test-threads 2
