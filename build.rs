// Embedded migrations (sqlx::migrate!) are compiled in: rebuild when they change.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
