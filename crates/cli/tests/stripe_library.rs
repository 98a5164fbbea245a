//! Stripe's own Python library (PyPI `stripe`, pinned in conformance/requirements.txt) against
//! `asiento psp-sim --dialect stripe`: create, confirm, capture, refund, retrieve with expand,
//! list with auto-paging, a decline raising `CardError`, and `Webhook.construct_event` on every
//! event the simulator delivered (conformance/stripe_dialect.py).

use std::path::Path;
use std::process::Command;

#[test]
fn stripe_s_python_library_accepts_the_stripe_dialect() {
    let python = std::env::var("ASIENTO_TEST_PYTHON").expect(
        "ASIENTO_TEST_PYTHON must name the python of the venv that scripts/test builds from \
         conformance/requirements.txt: run scripts/test",
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/stripe_dialect.py");
    let output = Command::new(&python)
        .arg(&script)
        .env("ASIENTO_BIN", env!("CARGO_BIN_EXE_asiento"))
        .output()
        .unwrap_or_else(|error| panic!("running {python} {}: {error}", script.display()));
    assert!(
        output.status.success(),
        "the Stripe library refused the dialect:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
