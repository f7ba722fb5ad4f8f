//! Says which outside services (PostgreSQL, libfaketime) the tests can reach; the
//! tests that need one are ignored, visibly, where it cannot be had.

#[path = "../tests/support/services.rs"]
mod services;

fn main() {
    services::emit();
}
