#!/bin/sh
# Lists the import cycles between the library's modules (each with the edges inside it and
# the file:line that makes each edge), first between file modules, then between top-level
# modules ("top-level modules: ..."); fails when a cycle is not in tests/import_cycles.rs's
# PENDING (or PENDING_TOP_LEVEL) list. The check itself is the test, so `cargo test` keeps it true.
set -e
cd "$(dirname "$0")/.."
exec cargo test --quiet --test import_cycles -- --nocapture
