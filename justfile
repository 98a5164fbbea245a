# Everyday recipes. `just` is optional: every recipe is a plain command you can type.

# Run the service on the embedded SQLite default with the in-process provider simulator.
serve:
    cargo run --release -- serve

# Every check and test (finds or starts PostgreSQL).
test:
    scripts/test

# Format, then lint like CI does.
lint:
    cargo fmt --all
    cargo clippy --workspace --all-targets -- -D warnings

# Event-log benchmarks against a fresh PostgreSQL database.
bench:
    cargo run --release -- bench append
    cargo run --release -- bench replay
