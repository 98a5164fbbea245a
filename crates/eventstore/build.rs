//! `sqlx::migrate!` embeds the migration folders at compile time but does not tell Cargo to watch
//! them; without this, a new migration file would not be picked up until something else changed.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
